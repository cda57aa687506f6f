"""Observation encoders: turn one observation space's batch into a flat feature vector.

Every encoder has an ``out_dim`` attribute and maps a batch ``(B, *space.shape)`` (or a dict of such
batches) to ``(B, out_dim)`` float features.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from covey.networks.linear import Linear
from covey.spaces import channels_last, check_observation_space, is_image_space, match_image_axes

EncoderKind = Literal["mlp", "cnn", "multi"]


class Encoder(nn.Module):
    """An encoder: ``out_dim`` features per observation, also under SB3's ``BaseFeaturesExtractor`` name,
    ``features_dim``. Unlike an SB3 extractor it takes observations as the env gives them (it scales pixels
    and reorders channel-last images itself), not ``preprocess_obs``'s output."""

    out_dim: int

    @property
    def features_dim(self) -> int:
        return int(self.out_dim)


class FlattenEncoder(Encoder):
    """Flattens a Box or MultiBinary observation to floats, times ``scale`` where given (:func:`make_encoder`
    passes 1/255 for uint8 images with ``normalize_images``)."""

    def __init__(self, space: spaces.Box | spaces.MultiBinary, scale: float | None = None) -> None:
        super().__init__()
        self.out_dim = int(np.prod(space.shape))
        self.scale = scale

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(obs.shape[0], self.out_dim).float()  # (B, out_dim); an empty batch too
        return x * self.scale if self.scale is not None else x


class OneHotEncoder(Encoder):
    """One-hot encoding of a Discrete observation, or concatenated one-hots of a MultiDiscrete one."""

    def __init__(self, space: spaces.Discrete | spaces.MultiDiscrete) -> None:
        super().__init__()
        if isinstance(space, spaces.Discrete):
            nvec = np.array([space.n])
            start = np.array([space.start])
        else:
            nvec = space.nvec.reshape(-1)
            start = np.asarray(getattr(space, "start", np.zeros_like(space.nvec))).reshape(-1)
        self.out_dim = int(nvec.sum())
        self.register_buffer("starts", torch.as_tensor(start, dtype=torch.long), persistent=False)
        self.register_buffer("highest", torch.as_tensor(nvec - 1, dtype=torch.long), persistent=False)
        self.register_buffer("offsets", torch.as_tensor(np.cumsum([0, *nvec[:-1]]), dtype=torch.long), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # Values outside the space (the zeros of an absent agent's slot when the space starts above 0) are clamped
        # into it rather than indexing out of range; a present agent's value is always inside.
        value = obs.long().reshape(obs.shape[0], len(self.starts)) - self.starts
        idx = torch.minimum(value.clamp_(min=0), self.highest) + self.offsets  # (B, n_components)
        out = torch.zeros(obs.shape[0], self.out_dim, dtype=torch.float32, device=obs.device)
        return out.scatter_(1, idx, 1.0)  # (B, out_dim)


class NatureCNN(Encoder):
    """The convolutional encoder of Mnih et al. (2015): 3 conv layers, then a linear layer with ReLU.

    Detects channel-last images (``(H, W, C)``) and permutes them; scales uint8 pixels to [0, 1].

    >>> enc = NatureCNN(spaces.Box(0, 255, (64, 64, 3), np.uint8))
    >>> enc(torch.zeros(2, 64, 64, 3, dtype=torch.uint8)).shape
    torch.Size([2, 512])
    """

    def __init__(self, space: spaces.Box, features_dim: int = 512, normalize_images: bool = True) -> None:
        super().__init__()
        if isinstance(space, spaces.Box) and len(space.shape) == 2:
            shape = (*space.shape, 1)
            raise ValueError(
                f"CnnPolicy needs image observations (a Box with 3 dimensions), got {space}: a grayscale image "
                f"without its channel axis? Add the axis with gymnasium.wrappers.ReshapeObservation(env, {shape}) "
                f"(a Gymnasium env) or supersuit.reshape_v0(env, {shape}) (a PettingZoo env), or use 'MlpPolicy' "
                "for observations that are not images."
            )
        if not isinstance(space, spaces.Box) or len(space.shape) != 3:
            raise ValueError(
                f"CnnPolicy needs image observations (a Box with 3 dimensions), got {space}. "
                "Use 'MlpPolicy' for vector observations."
            )
        self.channels_last = channels_last(space.shape)
        self.pixels = is_image_space(space)  # uint8 in [0, 255], which SB3 moves channels first too
        c, h, w = (space.shape[2], *space.shape[:2]) if self.channels_last else space.shape
        self.scale = 1.0 / 255.0 if normalize_images and self.pixels else None
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        try:
            with torch.no_grad():
                n_flat = self.convs(torch.zeros(1, c, h, w)).shape[1]
        except RuntimeError as err:
            raise ValueError(
                f"Image observations of shape {space.shape} are too small for the NatureCNN encoder "
                "(it needs at least 36x36 pixels). Resize the images or use 'MlpPolicy'."
            ) from err
        self.linear = nn.Sequential(Linear(n_flat, features_dim), nn.ReLU())
        self.out_dim = features_dim

    @property
    def cnn(self) -> nn.Sequential:
        """SB3's ``NatureCNN.cnn``: :attr:`convs`, the same layers in the same order, which take what SB3's take
        (floats, scaled, channels first), so that a hook on ``cnn[4]`` (the last convolution) runs in training."""
        return self.convs

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.scale is not None:
            x = x * self.scale
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)
        return self.linear(self.convs(x))  # (B, features_dim)


class DictEncoder(Encoder):
    """One encoder per key of a Dict space; their features are concatenated in key order."""

    def __init__(self, encoders: dict[str, nn.Module]) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict(encoders)
        self.out_dim = sum(enc.out_dim for enc in encoders.values())

    @property
    def extractors(self) -> nn.ModuleDict:
        """SB3's ``CombinedExtractor.extractors``: :attr:`encoders`, one per key (a key's images take the env's
        observations, as the encoder of a whole image observation does)."""
        return self.encoders

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([enc(obs[key]) for key, enc in self.encoders.items()], dim=1)  # (B, out_dim)


class _SB3Input(nn.Module):
    """Turns one observation batch into what an SB3 features extractor expects: floats, one-hot
    discrete values, images scaled to [0, 1] and channel-first."""

    def __init__(self, space: spaces.Space, normalize_images: bool) -> None:
        super().__init__()
        self.one_hot = OneHotEncoder(space) if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) else None
        image = isinstance(space, spaces.Box) and len(space.shape) == 3 and is_image_space(space)
        self.transpose = image and channels_last(space.shape)
        self.scale = 1.0 / 255.0 if image and normalize_images else None
        if self.transpose:
            h, w, c = space.shape
            space = spaces.Box(0, 255, (c, h, w), np.uint8)
        self.space = space  # the space the extractor sees

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.one_hot is not None:
            return self.one_hot(obs)
        x = obs.float()
        if self.scale is not None:
            x = x * self.scale
        return x.permute(0, 3, 1, 2) if self.transpose else x  # (B, H, W, C) -> (B, C, H, W)


class ExternalEncoder(Encoder):
    """Runs a Stable-Baselines3 ``BaseFeaturesExtractor`` subclass (``features_extractor_class``).

    The extractor is built as SB3 builds it, ``cls(observation_space, **kwargs)``, and gets the inputs SB3
    gives it (channel-last images are shown to it channel-first, as SB3's ``VecTransposeImage`` would).
    """

    def __init__(self, space: spaces.Space, extractor_class: type[nn.Module], kwargs: dict, normalize_images: bool):
        super().__init__()
        if isinstance(space, spaces.Dict):
            self.inputs = nn.ModuleDict({k: _SB3Input(s, normalize_images) for k, s in space.spaces.items()})
            inner: spaces.Space = spaces.Dict({k: m.space for k, m in self.inputs.items()})
        else:
            self.inputs = _SB3Input(space, normalize_images)
            inner = self.inputs.space
        kwargs = dict(kwargs)
        if not normalize_images and _takes_normalized_images(extractor_class):
            kwargs.setdefault("normalized_image", True)  # as SB3 passes it to its NatureCNN and CombinedExtractor
        self.extractor = extractor_class(inner, **kwargs)
        self.out_dim = int(self.extractor.features_dim)

    def forward(self, obs) -> torch.Tensor:
        if isinstance(self.inputs, nn.ModuleDict):
            return self.extractor({k: m(obs[k]) for k, m in self.inputs.items()})
        return self.extractor(self.inputs(obs))


def _takes_normalized_images(extractor_class: type) -> bool:
    """Whether SB3 gives ``extractor_class`` ``normalized_image=True`` with ``normalize_images=False``: its own
    NatureCNN and CombinedExtractor (and subclasses)."""
    from stable_baselines3.common.torch_layers import CombinedExtractor
    from stable_baselines3.common.torch_layers import NatureCNN as SB3NatureCNN

    return issubclass(extractor_class, (SB3NatureCNN, CombinedExtractor))


_EXACT_IN_FLOAT32 = 2**24
"""The largest whole number up to which every whole number is a float32."""


class FlatDict:
    """A Dict observation as one float32 vector and back, for a team whose agents observe a Dict space: the group's
    env copies, rollout buffer and critic hold one array per agent slot, and the networks' encoders unflatten it.

    Each key's values are laid out raw, in the space's key order (a Discrete value as its index, an image as its
    pixels), so :meth:`unflatten` gives back exactly the tensors a Dict batch would hold: integers and uint8 pixels
    are exact in float32 (up to 2**24).

    >>> flat = FlatDict(spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "id": spaces.Discrete(3)}))
    >>> flat.flatten({"id": 2, "pos": np.array([0.5, -0.5])})
    array([ 2. ,  0.5, -0.5], dtype=float32)
    """

    def __init__(self, space: spaces.Dict) -> None:
        for key, sub in space.spaces.items():
            if isinstance(sub, (spaces.Discrete, spaces.MultiDiscrete)):
                top = sub.start + (sub.n if isinstance(sub, spaces.Discrete) else sub.nvec) - 1
                largest = int(max(np.max(np.abs(sub.start)), np.max(np.abs(top))))
                if largest > _EXACT_IN_FLOAT32:
                    raise ValueError(
                        f"Observation key {key!r} is {sub}, whose values reach {largest:,}: a team's Dict observations "
                        f"are stored as float32, exact for whole numbers up to {_EXACT_IN_FLOAT32:,} (2**24), so "
                        "neighbouring values would be stored as one. Shift the values to start at 0 in a wrapper of "
                        "the env (pettingzoo.utils.BaseParallelWrapper), with the space's start changed to match."
                    )
        self.space = space
        self.shapes = {key: tuple(sub.shape) for key, sub in space.spaces.items()}
        self.images = {key for key, sub in space.spaces.items() if is_image_space(sub)}
        self.dtypes = {key: obs_dtype(sub) for key, sub in space.spaces.items()}
        sizes = [int(np.prod(shape)) for shape in self.shapes.values()]
        self.bounds = dict(zip(self.shapes, zip(np.cumsum([0, *sizes[:-1]]).tolist(), np.cumsum(sizes).tolist())))
        self.flat_space = spaces.Box(-np.inf, np.inf, (int(sum(sizes)),), np.float32)

    def flatten(self, observation: Any, who: str = "", any_layout: bool = False) -> np.ndarray:
        """One observation (a dict with the space's keys) as a float32 vector; a clear error for anything else.
        ``any_layout``: an image key given in the other channel order is moved to the space's (``predict``)."""
        where = f" of {who}" if who else ""
        if not isinstance(observation, dict):
            raise ValueError(
                f"The observation{where} is a {type(observation).__name__}, but the agents observe a Dict space with "
                f"keys {list(self.shapes)}. Pass a dict with those keys."
            )
        parts = []
        for key, shape in self.shapes.items():
            if key not in observation:
                raise ValueError(f"The observation{where} lacks the key {key!r} of the Dict space {self.space}.")
            value = np.asarray(observation[key], dtype=np.float32)
            if any_layout and key in self.images:
                value = match_image_axes(value, self.space[key])
            if value.shape != shape:
                raise ValueError(
                    f"The observation{where} has shape {value.shape} for key {key!r}; the space expects {shape}. "
                    "Check that the env matches the one the model was trained on."
                )
            parts.append(value.reshape(-1))
        return np.concatenate(parts)

    def unflatten(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(B, flat_dim)`` floats to the Dict batch: ``{key: (B, *shape)}`` in the key's storage dtype."""
        return {
            key: x[:, start:end].reshape(x.shape[0], *self.shapes[key]).to(self.dtypes[key])
            for key, (start, end) in self.bounds.items()
        }


class FlatDictEncoder(Encoder):
    """Runs ``encoder`` (built for the Dict space) on flattened Dict observations (:class:`FlatDict`)."""

    def __init__(self, flat: FlatDict, encoder: nn.Module) -> None:
        super().__init__()
        self.flat = flat
        self.encoder = encoder
        self.out_dim = encoder.out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.flat.unflatten(obs))  # (B, out_dim)


class RunningNormalizer(nn.Module):
    """Running mean and variance of observations of one shape, and the observations standardized by them:
    ``clamp((x - mean) / sqrt(var + eps), -clip, clip)``, at the positions of ``positions`` (a bool mask of the
    shape; None: all), the others passed as they are.

    The statistics are buffers, so they travel with the model's weights (``save``, ``get_parameters``, ONNX
    export) and change only by :meth:`update`, with the observations an agent collected; never in ``forward``.
    Until the first batch the observations pass as they are (no statistics yet); each batch joins by Chan et al.'s
    parallel merge, in float64.

    >>> norm = RunningNormalizer((2,))
    >>> norm.update(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
    >>> norm.mean.tolist(), norm.var.tolist()
    ([2.0, 20.0], [1.0, 100.0])
    >>> norm(torch.tensor([[3.0, 30.0]])).tolist()
    [[1.0, 1.0]]
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, positions: Any = None) -> None:
        super().__init__()
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        mask = None if positions is None else torch.as_tensor(np.asarray(positions, dtype=bool).reshape(shape))
        self.register_buffer("positions", mask, persistent=False)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Take a batch ``(B, *shape)`` of observations into the statistics (an empty batch changes nothing)."""
        x = x.detach().reshape(-1, *self.mean.shape).to(self.mean)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(dim=0)
        batch_var = x.var(dim=0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        self.var.copy_((self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total)
        self.mean.add_(delta * (n / total))
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        mean = self.mean.to(torch.float32)
        scale = torch.rsqrt(self.var.to(torch.float32) + self.eps)
        y = torch.where(self.count > 0, ((x - mean) * scale).clamp(-self.clip, self.clip), x)  # raw before any data
        return y if self.positions is None else torch.where(self.positions, y, x)


def standardized(space: spaces.Space, encoder: nn.Module) -> bool:
    """Whether ``normalize_observations`` standardizes observations of ``space`` that go to ``encoder``: a Box
    that the encoder flattens unscaled (or, for a user's features extractor, that is not an image). Images are
    scaled by ``normalize_images``; Discrete values are one-hot codes, MultiBinary ones bits."""
    if not isinstance(space, spaces.Box):
        return False
    if isinstance(encoder, FlattenEncoder):
        return encoder.scale is None
    return isinstance(encoder, ExternalEncoder) and not is_image_space(space)


def _key_encoder(encoder: nn.Module, key: str) -> nn.Module:
    """The encoder of one key of a Dict space: a :class:`DictEncoder`'s own, else ``encoder`` (a features
    extractor, which takes the whole Dict)."""
    return encoder.encoders[key] if isinstance(encoder, DictEncoder) else encoder


class NormalizedEncoder(Encoder):
    """``encoder`` on observations standardized by running statistics (``policy_kwargs``
    ``normalize_observations=True``): one :class:`RunningNormalizer` for a Box space, one per Box key of a Dict
    space, or, for a team's flattened Dict observations (``encoder`` a :class:`FlatDictEncoder`), one over the
    flat vector that leaves the other keys' positions as they are. Images and discrete values pass unchanged."""

    def __init__(self, encoder: nn.Module, space: spaces.Space, clip: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.out_dim = encoder.out_dim
        if isinstance(encoder, FlatDictEncoder):
            flat = encoder.flat
            keys = [key for key in flat.shapes if standardized(flat.space[key], _key_encoder(encoder.encoder, key))]
            positions = np.zeros(flat.flat_space.shape, dtype=bool)
            for key in keys:
                start, end = flat.bounds[key]
                positions[start:end] = True
            self.normalizer: nn.Module = RunningNormalizer(flat.flat_space.shape, clip, positions=positions)
        elif isinstance(space, spaces.Dict):
            keys = [key for key, sub in space.spaces.items() if standardized(sub, _key_encoder(encoder, key))]
            self.normalizer = nn.ModuleDict({key: RunningNormalizer(space[key].shape, clip) for key in keys})
        else:
            keys = [None] if standardized(space, encoder) else []
            self.normalizer = RunningNormalizer(space.shape, clip)
        if not keys:
            raise ValueError(
                f"policy_kwargs normalize_observations=True has nothing to standardize in {space}: it standardizes "
                "Box observations (or Box keys of a Dict) that are not images; images are scaled by normalize_images "
                "and discrete values are one-hot codes. Remove normalize_observations."
            )

    def normalize(self, obs: Any) -> Any:
        if isinstance(self.normalizer, nn.ModuleDict):
            return {key: self.normalizer[key](value) if key in self.normalizer else value for key, value in obs.items()}
        return self.normalizer(obs)

    def update(self, obs: Any) -> None:
        """Take a batch of collected observations (as ``forward`` takes them) into the statistics."""
        if isinstance(self.normalizer, nn.ModuleDict):
            for key, normalizer in self.normalizer.items():
                normalizer.update(obs[key])
        else:
            self.normalizer.update(obs)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.encoder(self.normalize(obs))


def make_encoder(
    space: spaces.Space,
    kind: EncoderKind = "mlp",
    normalize_images: bool = True,
    features_dim: int = 512,
    cnn_output_dim: int = 256,
    normalized_image: bool = False,
) -> nn.Module:
    """Build the encoder for ``space``.

    ``kind`` follows SB3's policy names: ``"mlp"`` flattens (one-hot for discrete spaces),
    ``"cnn"`` puts a NatureCNN on an image space, ``"multi"`` encodes each key of a Dict space
    (NatureCNN with ``cnn_output_dim`` features for image keys, flattening for the rest). Image keys are uint8
    Boxes of 3 dimensions in [0, 255], and, with ``normalized_image`` or ``normalize_images=False`` (SB3's
    rule), any Box of 3 dimensions.
    """
    check_observation_space(space)
    if isinstance(space, spaces.Dict):
        sub_kind: EncoderKind = "mlp" if kind == "mlp" else "multi"
        return DictEncoder(
            {
                key: make_encoder(
                    sub,
                    sub_kind,
                    normalize_images,
                    features_dim=cnn_output_dim,
                    cnn_output_dim=cnn_output_dim,
                    normalized_image=normalized_image,
                )
                for key, sub in space.spaces.items()
            }
        )
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return OneHotEncoder(space)
    # As SB3 with normalize_images=False (its normalized_image=True): any 3-D Box key is an image, already scaled
    image_key = is_image_space(space) or (
        (normalized_image or not normalize_images) and isinstance(space, spaces.Box) and len(space.shape) == 3
    )
    if kind == "cnn" and normalize_images and not normalized_image and isinstance(space, spaces.Box):
        _check_pixels(space)
    if kind == "cnn" or (kind == "multi" and image_key):
        return NatureCNN(space, features_dim, normalize_images)
    scale = 1.0 / 255.0 if normalize_images and is_image_space(space) else None
    return FlattenEncoder(space, scale)


def _check_pixels(space: spaces.Box) -> None:
    """CnnPolicy with ``normalize_images=True`` scales pixels by 1/255, so it takes uint8 images in [0, 255], as
    SB3's does (a 2-D or 1-D Box gets NatureCNN's own message)."""
    if len(space.shape) == 3 and not is_image_space(space):
        height, width = space.shape[:2] if channels_last(space.shape) else space.shape[1:]
        if min(height, width) < 36:  # the next error would be NatureCNN's: say both at once
            raise ValueError(
                f"CnnPolicy needs uint8 images in [0, 255] (or normalize_images=False) of at least 36x36 pixels "
                f"for its NatureCNN encoder; got {space}, {height}x{width}. Use 'MlpPolicy' (it flattens the "
                "observation), or resize the images to 36x36 or more (SuperSuit's resize_v1 for a PettingZoo env)."
            )
        raise ValueError(
            f"CnnPolicy scales pixels from [0, 255] to [0, 1] (normalize_images=True, the default), so it needs a "
            f"uint8 image Box with bounds [0, 255]; got {space}. If the observations are pixels in [0, 255], "
            f"declare the space as Box(0, 255, {space.shape}, np.uint8); if they are already scaled as the network "
            "should see them, pass policy_kwargs=dict(normalize_images=False)."
        )


def obs_dtype(space: spaces.Space) -> torch.dtype:
    """The torch dtype covey stores observations of ``space`` in: uint8 for images, whose pixels stay whole; a
    uint8 Box of another shape (an Atari RAM) as float32, as its values may come normalized (SB3's VecNormalize
    gives floats and keeps the space)."""
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return torch.long
    if is_image_space(space):
        return torch.uint8
    return torch.float32


def sb3_extractor(encoder: nn.Module) -> nn.Module:
    """What SB3's ``features_extractor`` attributes hold: a user's extractor object (inside covey's
    :class:`ExternalEncoder`, which prepares its inputs, and behind running statistics), else covey's encoder."""
    if isinstance(encoder, NormalizedEncoder) and isinstance(encoder.encoder, ExternalEncoder):
        return encoder.encoder.extractor
    return encoder.extractor if isinstance(encoder, ExternalEncoder) else encoder
