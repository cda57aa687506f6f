"""The actor (the policy: observations to actions) and the critic (training machinery: values).

They are separate modules; with ``share_features_extractor`` the critic reuses the actor's encoder
module (its parameters then belong to both).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn.modules import module as torch_module

from covey.networks.attention import EntityEncoder, POCACritic
from covey.networks.distributions import (
    ActionDistribution,
    SquashedStateDependentHead,
    StateDependentGaussianHead,
    make_action_head,
)
from covey.networks.encoders import (
    ExternalEncoder,
    FlatDict,
    FlatDictEncoder,
    NormalizedEncoder,
    make_encoder,
    sb3_extractor,
)
from covey.networks.memory import Memory, State, sequence_features
from covey.networks.mlp import mlp, parse_net_arch
from covey.networks.obs import ObsTensor, check_obs_tensors, obs_to_tensor
from covey.networks.twohot import ScalarHead, make_value_head
from covey.spaces import is_image_space
from covey.warning import warn_user

POLICY_KINDS = {"MlpPolicy": "mlp", "CnnPolicy": "cnn", "MultiInputPolicy": "multi"}
# SB3-contrib's RecurrentPPO names: the same encoders with recurrent memory in actor and critic.
LSTM_POLICIES = {"MlpLstmPolicy": "MlpPolicy", "CnnLstmPolicy": "CnnPolicy", "MultiInputLstmPolicy": "MultiInputPolicy"}

# SB3 policy classes a script may pass instead of a name (matched by class name, never imported).
POLICY_CLASS_NAMES = {
    "MlpPolicy": "MlpPolicy",
    "ActorCriticPolicy": "MlpPolicy",
    "CnnPolicy": "CnnPolicy",
    "ActorCriticCnnPolicy": "CnnPolicy",
    "MultiInputPolicy": "MultiInputPolicy",
    "MultiInputActorCriticPolicy": "MultiInputPolicy",
    "SACPolicy": "MlpPolicy",  # stable_baselines3.sac.MlpPolicy
    # sb3_contrib.ppo_recurrent's MlpLstmPolicy, CnnLstmPolicy and MultiInputLstmPolicy (and covey.ppo's)
    "MlpLstmPolicy": "MlpLstmPolicy",
    "CnnLstmPolicy": "CnnLstmPolicy",
    "MultiInputLstmPolicy": "MultiInputLstmPolicy",
    "RecurrentActorCriticPolicy": "MlpLstmPolicy",
    "RecurrentActorCriticCnnPolicy": "CnnLstmPolicy",
    "RecurrentMultiInputActorCriticPolicy": "MultiInputLstmPolicy",
}


def policy_kwargs_dict(policy_kwargs: Any) -> dict:
    """``policy_kwargs`` as a new dict (None: empty), or an error that names it."""
    if policy_kwargs is None:
        return {}
    if not isinstance(policy_kwargs, dict):
        raise ValueError(
            f"policy_kwargs={policy_kwargs!r} is invalid: pass a dict of the policy's settings, e.g. "
            "policy_kwargs=dict(net_arch=[64, 64])."
        )
    return dict(policy_kwargs)


def policy_name(policy: str | type, agent: str | None = None) -> str:
    """An SB3 policy name, or an SB3 policy class standing for one, to covey's policy name. With ``agent`` (an
    agent without recurrent memory, named in the error) the recurrent names are refused."""
    name = policy
    if isinstance(policy, type) and policy.__name__ in POLICY_CLASS_NAMES:
        name = POLICY_CLASS_NAMES[policy.__name__]
    if isinstance(name, str) and name in LSTM_POLICIES and agent is not None:
        raise ValueError(
            f"{agent} has no recurrent memory, so {name} is not one of its policies: use "
            f"{LSTM_POLICIES[name]!r}, or PPO or POCA for a policy with memory. Stacked frames (SB3's "
            "VecFrameStack) give a feed-forward policy the recent past."
        )
    if isinstance(name, str) and (name in POLICY_KINDS or name in LSTM_POLICIES):
        return name
    contrib = [c for c in getattr(policy, "__mro__", ()) if c.__module__.split(".")[0] == "sb3_contrib"]
    if contrib:  # MaskablePPO's, TQC's, CrossQ's, ... (RecurrentPPO's are named above)
        origin = f"a subclass of {contrib[0].__name__}, " if contrib[0] is not policy else ""
        raise ValueError(
            f"{policy.__name__} ({origin}{contrib[0].__module__}) is the policy of an sb3-contrib algorithm that "
            "covey does not implement (action masks, quantile critics, ...). Train it with sb3_contrib, or pass a "
            "policy name to covey "
            f"(one of {list(POLICY_KINDS)}"
            + ("" if agent is not None else f", or with recurrent memory {list(LSTM_POLICIES)}")
            + ")."
        )
    names = (
        f"{list(POLICY_KINDS)} (or SB3's classes of those names)"
        if agent is not None
        else f"{list(POLICY_KINDS)}, or with recurrent memory {list(LSTM_POLICIES)} (or SB3's and sb3-contrib's "
        "classes of those names)"
    )
    raise ValueError(
        f"Unknown policy {policy!r}; use one of {names}. "
        "Customize the networks with policy_kwargs (net_arch, activation_fn, features_extractor_class, ...); "
        "PPO and SAC also take subclasses of SB3's ActorCriticPolicy and SACPolicy, and train them through SB3's calls."
    )


# Refused by name in policy_kwargs rather than silently ignored: use_sde is PPO's own argument there (SAC takes it
# out of policy_kwargs before, as SB3's off-policy agents do, and POCA has none); sde_net_arch covey does not implement.
_UNSUPPORTED = ("use_sde", "sde_net_arch")

# sb3-contrib's RecurrentPPO policy_kwargs: (the values that are covey's behaviour, taken and dropped; what to do
# for the others).
_RECURRENT_PPO_KWARGS = {
    "n_lstm_layers": ((1,), "covey's memory has one layer"),
    "shared_lstm": ((False,), "the actor and the critic always have memories of their own"),
    "enable_critic_lstm": ((True,), "the critic always has a memory of its own"),
    "lstm_kwargs": (
        (None, {}),  # sb3-contrib's default: no extra arguments
        "covey's is memory=dict(kind='lstm' or 'gru', hidden_size=..., sequence_length=...)",
    ),
}


def _same_setting(value: Any, ok: Any) -> bool:
    """Whether ``value`` is the sb3-contrib setting ``ok`` (NumPy's ints and bools too, a bool read as Python and
    sb3-contrib read it; a bool is not a number of layers)."""
    if isinstance(ok, bool):
        return isinstance(value, (bool, np.bool_, int, np.integer)) and bool(value) == ok
    if isinstance(ok, int):
        return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value == ok
    return type(value) is type(ok) and value == ok


SAC_ONLY_KWARGS = {"n_critics": "SAC's number of Q networks", "clip_mean": "SAC's bound on use_sde's Gaussian mean"}
"""policy_kwargs of SAC's that PPO and POCA refuse (SB3's PPO raises a TypeError for them)."""


PPO_ADAM_EPS = 1e-5
"""Adam's eps for PPO's (and POCA's) optimizer, SB3's PPO default (PyTorch's is 1e-8)."""


@dataclass
class PolicyConfig:
    """The network settings an SB3 user passes as ``policy_kwargs``."""

    net_arch: Any = None
    """Hidden layer sizes: a list (same sizes, separate weights for actor and critic) or dict(pi=, vf=)."""
    activation_fn: type[nn.Module] = nn.Tanh
    """Activation class used between hidden layers."""
    ortho_init: bool = True
    """Orthogonal initialization. PPO: encoders and hidden layers with gain sqrt(2), the policy output 0.01, a
    scalar value output 1 (a two-hot one keeps PyTorch's). POCA: the actor's hidden layers and policy output
    alike; its critic keeps PyTorch's. SAC does not read it (SB3's SACPolicy has no such setting)."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian (Box) policies."""
    normalize_images: bool = True
    """Scale uint8 image observations to [0, 1]."""
    share_features_extractor: bool = True
    """Actor and critic share the observation encoder (for MlpPolicy the encoder has no weights). PPO: True by
    default; SAC: False by default, and with True its Q networks read the actor's encoder without a gradient, as
    SB3's; POCA's actor and critic always have encoders of their own."""
    features_extractor_class: type[nn.Module] | None = None
    """An SB3 ``BaseFeaturesExtractor`` subclass to use as the observation encoder (None: covey's own)."""
    features_extractor_kwargs: dict = field(default_factory=dict)
    """Arguments of ``features_extractor_class``; for covey's encoders: ``features_dim`` (CnnPolicy's
    NatureCNN) and ``cnn_output_dim`` (MultiInputPolicy's image encoders)."""
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam
    """Optimizer class for actor and critic together."""
    optimizer_kwargs: dict | None = None
    """Extra optimizer arguments. None (not given): PPO's and POCA's Adam get ``eps=1e-5``, as SB3's PPO does."""
    n_critics: int = 2
    """SAC: number of Q networks (the target takes their minimum)."""
    value_head: str = "scalar"
    """Value/Q output: "scalar" (regression) or "twohot" (categorical over symlog buckets, scale-free)."""
    num_buckets: int = 255
    """Buckets of the two-hot head."""
    bucket_range: tuple[float, float] = (-20.0, 20.0)
    """Range of the two-hot buckets in symlog space."""
    critic_ema_decay: float | None = None
    """If set (e.g. 0.98): an EMA copy of the critic regularizes its predictions (never used for targets)."""
    critic_ema_coef: float = 1.0
    """Weight of the EMA regularizer in the critic loss."""
    normalize_observations: bool = False
    """Standardize Box observations (each Box key of a Dict) by their running mean and variance, clipped to
    ``observation_clip``: statistics that the agent updates from the observations it collects (after each
    rollout's update for PPO and POCA, each step for SAC) and that are saved with the model."""
    observation_clip: float = 10.0
    """With ``normalize_observations``: standardized values are clipped to [-clip, clip] (VecNormalize's 10)."""
    memory: dict | None = None
    """Recurrent memory in actor and critic (each its own): dict(hidden_size=128, sequence_length=16,
    kind="lstm" | "gru"); set by the *LstmPolicy names."""
    entity_encoder: bool = False
    """Encode 2-D Box observations (n_entities, n_features) with entity attention instead of flattening."""
    full_std: bool = True
    """With ``use_sde``: one log-std per latent feature and action (False: per latent feature)."""
    use_expln: bool = False
    """With ``use_sde``: std from log-std by ``exp`` below 0 and ``log1p(x) + 1`` above (grows slower)."""
    clip_mean: float = 2.0
    """SAC with ``use_sde``: the Gaussian's mean is kept in [-clip_mean, clip_mean] (0: not clipped)."""
    use_sde: bool = False
    """Box actions with state-dependent exploration; set by the agent's ``use_sde`` argument, not here."""
    squash_output: bool = False
    """PPO with ``use_sde``: actions squashed by tanh into [-1, 1] and rescaled to the bounds (instead of
    clipped to them), as SB3's ``squash_output=True``."""

    def _check_covey_keys(self, given: set[str]) -> None:
        """covey's own keys (SB3 checks none of them): a value of the wrong kind is named here, where it failed
        inside torch or was truncated silently."""
        if self.memory is not None:
            if not isinstance(self.memory, dict):
                raise ValueError(
                    f"policy_kwargs memory={self.memory!r} is invalid: pass a dict, e.g. memory=dict(hidden_size=128, "
                    "sequence_length=16, kind='lstm'), or a *LstmPolicy name for the defaults."
                )
            for key in ("hidden_size", "sequence_length"):
                if key in self.memory and not positive_int(self.memory[key]):
                    raise ValueError(
                        f"policy_kwargs memory {key}={self.memory[key]!r} is invalid: it must be an int >= 1."
                    )
            if self.memory.get("kind", "lstm") not in ("lstm", "gru"):
                raise ValueError(f"policy_kwargs memory kind={self.memory['kind']!r} is invalid: use 'lstm' or 'gru'.")
        if not (positive_int(self.num_buckets) and self.num_buckets >= 2):
            raise ValueError(f"policy_kwargs num_buckets={self.num_buckets!r} is invalid: it must be an int >= 2.")
        bounds = self.bucket_range
        if not (
            isinstance(bounds, (tuple, list))
            and len(bounds) == 2
            and all(isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
            and bounds[0] < bounds[1]
        ):
            raise ValueError(
                f"policy_kwargs bucket_range={bounds!r} is invalid: pass two finite numbers (low, high) with low < "
                "high, in symlog space, e.g. (-20, 20)."
            )
        unused = [key for key in ("num_buckets", "bucket_range") if key in given]
        if unused and self.value_head != "twohot":
            warn_user(
                f"policy_kwargs {' and '.join(unused)} shape the two-hot critic, but value_head={self.value_head!r}: "
                "they are ignored. Set value_head='twohot' to use them, or remove them."
            )
        coef = self.critic_ema_coef
        if isinstance(coef, bool) or not isinstance(coef, numbers.Real) or not (math.isfinite(coef) and coef >= 0):
            raise ValueError(f"policy_kwargs critic_ema_coef={coef!r} is invalid: it must be a finite number >= 0.")
        if "critic_ema_coef" in given and self.critic_ema_decay is None:
            raise ValueError(
                "policy_kwargs critic_ema_coef weighs the regularizer that critic_ema_decay turns on: set "
                "critic_ema_decay too (e.g. 0.98), or remove critic_ema_coef."
            )
        if not isinstance(self.entity_encoder, (bool, np.bool_)):
            raise ValueError(f"policy_kwargs entity_encoder={self.entity_encoder!r} is invalid: use True or False.")
        if not isinstance(self.normalize_observations, (bool, np.bool_)):
            raise ValueError(
                f"policy_kwargs normalize_observations={self.normalize_observations!r} is invalid: use True or False."
            )
        clip = self.observation_clip
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"policy_kwargs observation_clip={clip!r} is invalid: it must be a finite number > 0.")
        if "observation_clip" in given and not self.normalize_observations:
            raise ValueError(
                "policy_kwargs observation_clip bounds the values that normalize_observations=True standardizes: set "
                "normalize_observations=True too, or remove observation_clip."
            )
        if self.normalize_observations and self.entity_encoder:
            raise ValueError(
                "policy_kwargs normalize_observations=True and entity_encoder=True cannot go together: the entity "
                "encoder reads all-zero rows as padding, which standardizing would move off zero. Remove one of them."
            )
        if self.entity_encoder and self.features_extractor_class is not None:
            extractor = getattr(self.features_extractor_class, "__name__", self.features_extractor_class)
            raise ValueError(
                f"policy_kwargs entity_encoder=True and features_extractor_class={extractor} both choose the "
                "observation encoder: keep one of them."
            )

    def optimizer_arguments(self, adam_eps: float | None = None) -> dict:
        """The keyword arguments ``optimizer_class`` gets: ``optimizer_kwargs``; without them, Adam's ``eps`` is
        ``adam_eps`` when given (SB3's rule: only for Adam, and only when no ``optimizer_kwargs`` are given)."""
        if self.optimizer_kwargs is not None:
            return dict(self.optimizer_kwargs)
        return {"eps": adam_eps} if adam_eps is not None and self.optimizer_class is torch.optim.Adam else {}

    @classmethod
    def from_kwargs(
        cls, policy_kwargs: dict | None, refused: dict[str, str] | None = None, **defaults: Any
    ) -> PolicyConfig:
        """The config of ``policy_kwargs`` over ``defaults``; keys of ``refused`` (key: what it is) are another
        agent's and raise."""
        kwargs = policy_kwargs_dict(policy_kwargs)
        for key in _UNSUPPORTED:
            if kwargs.pop(key, False):
                where = "; pass use_sde=True to PPO instead" if key == "use_sde" else " by covey; remove it"
                raise NotImplementedError(f"policy_kwargs[{key!r}] is not supported{where}.")
        for key, what in (refused or {}).items():
            if key in kwargs:
                raise ValueError(f"policy_kwargs {key} is {what}, not a setting of this agent: remove it.")
        from_lstm_size = "lstm_hidden_size" in kwargs and kwargs.get("memory") is None
        contrib_keys = [key for key in ("lstm_hidden_size", *_RECURRENT_PPO_KWARGS) if key in kwargs]
        if "lstm_hidden_size" in kwargs:  # sb3-contrib's RecurrentPPO name for the memory's size
            size, memory = kwargs.pop("lstm_hidden_size"), kwargs.get("memory")
            if not positive_int(size):
                raise ValueError(f"policy_kwargs lstm_hidden_size={size!r} is invalid: it must be an int >= 1.")
            if isinstance(memory, dict) and memory.get("hidden_size", size) != size:
                raise ValueError(
                    f"policy_kwargs lstm_hidden_size={size!r} and memory hidden_size={memory['hidden_size']!r} both "
                    "set the memory's size: keep one of them."
                )
            if memory is None or isinstance(memory, dict):
                kwargs["memory"] = {**(memory or {}), "hidden_size": int(size)}
        for key, (same, how) in _RECURRENT_PPO_KWARGS.items():
            if key in kwargs:
                value = kwargs.pop(key)
                if not any(_same_setting(value, ok) for ok in same):
                    raise ValueError(
                        f"policy_kwargs {key}={value!r} is sb3-contrib's RecurrentPPO setting; "
                        f"{how.format(value=value)}."
                    )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"Unknown policy_kwargs {unknown}; supported keys are {sorted(names)}.")
        config = cls(**{**defaults, **kwargs})
        config._memory_from_lstm_hidden_size = from_lstm_size
        config._recurrent_ppo_keys = contrib_keys
        config._check_covey_keys(given=set(kwargs))
        for key, base, example in (
            ("activation_fn", nn.Module, "torch.nn.ReLU"),
            ("optimizer_class", torch.optim.Optimizer, "torch.optim.Adam"),
        ):
            value = getattr(config, key)
            if not (isinstance(value, type) and issubclass(value, base)):
                raise ValueError(
                    f"policy_kwargs {key}={value!r} is invalid: pass the class itself, e.g. {key}={example} "
                    "(not a name or an instance)."
                )
        extractor = config.features_extractor_class
        if extractor is not None and not (isinstance(extractor, type) and issubclass(extractor, nn.Module)):
            raise ValueError(
                f"policy_kwargs features_extractor_class={extractor!r} is invalid: pass a subclass of SB3's "
                "BaseFeaturesExtractor (the class itself), or leave it out for covey's encoders."
            )
        return config


class ParameterMismatchError(ValueError, RuntimeError):
    """Parameters that do not fit the model's (``set_parameters``, ``load_from_vector``). A ValueError, and a
    RuntimeError as torch's ``load_state_dict`` and ``vector_to_parameters`` raise under SB3's calls, so a script
    that catches either catches it."""


class PolicyMethods:
    """What SB3's ``BasePolicy`` offers on every policy and that needs no more than the policy's spaces and
    parameters: batch checks, action scaling, and the parameters as one vector. PPO's and SAC's ``model.policy``,
    every :class:`Actor` (SAC's ``model.actor`` and POCA's ``model.policy``) have them."""

    observation_space: spaces.Space
    action_space: spaces.Space
    device: torch.device

    def is_vectorized_observation(self, observation) -> bool:
        """SB3's: whether ``observation`` is a batch (True) or one observation (False) of the observation space."""
        from stable_baselines3.common.utils import is_vectorized_observation

        return is_vectorized_observation(observation, self.observation_space)

    def scale_action(self, action: np.ndarray) -> np.ndarray:
        """Actions in the Box bounds to [-1, 1]."""
        low, high = self.action_space.low, self.action_space.high
        return 2.0 * ((action - low) / (high - low)) - 1.0

    def unscale_action(self, scaled_action: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] to the Box bounds."""
        low, high = self.action_space.low, self.action_space.high
        return low + 0.5 * (scaled_action + 1.0) * (high - low)

    def parameters_to_vector(self) -> np.ndarray:
        """Every parameter, flattened into one numpy vector in the order of ``self.parameters()`` (as SB3's)."""
        return torch.nn.utils.parameters_to_vector(self.parameters()).detach().cpu().numpy()

    def load_from_vector(self, vector: np.ndarray) -> None:
        """Set the parameters from a vector made by :meth:`parameters_to_vector`."""
        vector = np.asarray(vector)
        size = sum(p.numel() for p in self.parameters())
        if vector.shape != (size,):
            raise ParameterMismatchError(
                f"The vector has shape {vector.shape}; this policy has {size} parameters: ({size},)."
            )
        with torch.no_grad():  # in place: the parameters stay views of the optimizers' flat buffers
            values = torch.as_tensor(vector, dtype=torch.float32, device=self.device)
            offset = 0
            for p in self.parameters():
                p.copy_(values[offset : offset + p.numel()].view_as(p))
                offset += p.numel()


class ReadOnlyViews:
    """SB3's module attributes that covey's networks give as views of their own layers (``policy.action_net``,
    ``actor.mu``, ``features_extractor``, ...). ``nn.Module.__setattr__`` would register a module or parameter
    assigned to one beside the network, where nothing uses or trains it: refused, naming what works."""

    def _is_view(self, name: str) -> bool:
        view = getattr(type(self), name, None)
        return isinstance(view, property) and view.fset is None

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, (nn.Module, torch.Tensor)) and self._is_view(name):
            raise AttributeError(
                f"{type(self).__name__}.{name} is SB3's name for a part of covey's network, read from it: a "
                f"{type(value).__name__} assigned to it would stand beside the network, unused and untrained. Change "
                f"the weights in place ({name}.load_state_dict(...), or copy_ under torch.no_grad()), or build the "
                "model with the layers you want (policy_kwargs: net_arch, activation_fn, features_extractor_class; "
                "or a policy class of your own, a subclass of SB3's ActorCriticPolicy or SACPolicy)."
            )
        super().__setattr__(name, value)


class SB3FeatureNames:
    """SB3's names for a network's encoder (its SAC ``Actor``'s and ``ContinuousCritic``'s), for a module that
    keeps it as ``encoder``."""

    encoder: nn.Module

    @property
    def features_extractor(self) -> nn.Module:
        """The encoder: the user's SB3 extractor object where ``features_extractor_class`` was given."""
        return sb3_extractor(self.encoder)

    @property
    def features_dim(self) -> int:
        return int(self.encoder.out_dim)

    def extract_features(self, obs: ObsTensor, features_extractor: nn.Module | None = None) -> torch.Tensor:
        """SB3's ``extract_features(obs, features_extractor)``: observation tensors through this network's
        encoder (which takes them as the env gives them, scaling pixels itself), or through the extractor given."""
        if features_extractor is None or features_extractor is self.features_extractor:
            return self.encoder(obs)
        return features_extractor(obs)


def _forward_hooked(module: nn.Module) -> bool:
    """Whether a forward hook is registered on ``module`` itself, or on every module."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def acting_mode(*modules: nn.Module) -> torch.autograd.grad_mode.no_grad | torch.inference_mode:
    """The mode to act in: ``torch.inference_mode`` (the cheaper), or ``torch.no_grad`` where a forward hook is
    registered on a submodule of ``modules`` (or on every module), as SB3 acts. A tensor a hook keeps is then an
    ordinary one, which autograd (a probe trained on activations) and in-place operations take: an inference
    tensor is refused by both."""
    return torch.no_grad() if forward_hooks_in(*modules) else torch.inference_mode()


def forward_hooks_in(*modules: nn.Module) -> bool:
    """Whether a forward hook is registered on a submodule of ``modules``, or on every module."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for module in modules for m in module.modules())


class WarnsOnHook:
    """A module on which SB3 users register forward hooks that covey's acting or training would not run (or would
    not run as SB3 runs them): registering one first calls ``_warn_unused_hook``, which says where to hook instead."""

    def register_forward_hook(self, hook, *args, **kwargs):
        self._warn_unused_hook()
        return super().register_forward_hook(hook, *args, **kwargs)

    def register_forward_pre_hook(self, hook, *args, **kwargs):
        self._warn_unused_hook()
        return super().register_forward_pre_hook(hook, *args, **kwargs)

    def _warn_unused_hook(self) -> None:
        raise NotImplementedError


class _MadeOnAccess(WarnsOnHook):
    """A module covey makes on each access to an SB3 attribute (:attr:`Actor.mu`, :attr:`QEnsemble.q_networks`),
    over layers of its own that acting and training call instead: a forward hook registered on it would never run,
    so registering one warns, naming the layer to hook."""

    _name: str
    _instead: str

    def _warn_unused_hook(self) -> None:
        warn_user(
            f"A forward hook on {self._name} runs only where your code calls it: covey makes {self._name} on each "
            f"access, over its own layers, which acting and training call instead. Register the hook on "
            f"{self._instead}."
        )


class _HeadRows(_MadeOnAccess, nn.Module):
    """Rows of a SAC head's output layer as SB3's layer of them (:attr:`Actor.mu`, :attr:`Actor.log_std`): its
    ``weight`` and ``bias`` are views of the head's, so reading them, or an in-place edit or ``nn.init`` of them,
    reaches the head (a gradient is the head's, in its own ``.grad``)."""

    _instead = "the layer of the means and log-stds, model.actor.head.proj (its output: the means, then the log-stds)"

    def __init__(self, head: nn.Module, rows: slice) -> None:
        super().__init__()
        self.head, self.rows = head, rows

    @property
    def weight(self) -> torch.Tensor:
        return self.head.proj.weight[self.rows]

    @property
    def bias(self) -> torch.Tensor:
        return self.head.proj.bias[self.rows]

    def named_parameters(self, *args: Any, **kwargs: Any):
        """``nn.Module``'s: the whole head layer's parameters, the means' rows and the log-stds', with a warning
        (freezing them, or handing them to an optimizer, takes both halves, where SB3 has a layer for each)."""
        warn_user(
            f"{self._name}'s parameters are covey's one layer of the means and the log-stds, model.actor.head.proj "
            f"(SB3 has a layer for each): freezing them or handing them to an optimizer takes both. To hold these "
            f"rows ({self.rows.start} to {self.rows.stop - 1}) alone, zero their gradient instead: "
            "model.actor.head.proj.weight.register_hook(lambda grad: grad * mask), mask zero on those rows (and "
            "likewise the bias)."
        )
        return super().named_parameters(*args, **kwargs)


class _MeanLayer(_HeadRows):
    """The mean of a squashed Gaussian head's output, from the latent features (:attr:`Actor.mu`)."""

    _name = "model.actor.mu"

    def __init__(self, head: nn.Module) -> None:
        super().__init__(head, slice(0, head.action_dim))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.head._split(self.head(latent))[0]


class _LogStdLayer(_HeadRows):
    """SB3 SAC actor's ``log_std`` layer (without gSDE): the log-std part of the head's output, before the clamp
    that ``get_action_dist_params`` applies."""

    _name = "model.actor.log_std"

    def __init__(self, head: nn.Module) -> None:
        super().__init__(head, slice(head.action_dim, 2 * head.action_dim))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(latent, self.weight, self.bias)


class Actor(PolicyMethods, ReadOnlyViews, SB3FeatureNames, nn.Module):
    """Observations to an action distribution: encoder -> MLP trunk -> action head.

    This is ``model.actor`` (and POCA's ``model.policy``); it has SB3's ``predict``, ``obs_to_tensor`` and
    ``set_training_mode``. PPO's and SAC's ``model.policy`` hold it (:mod:`covey.networks.policies`).

    >>> import gymnasium as gym
    >>> actor, critic = build_actor_critic("MlpPolicy", gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    >>> actor.predict(np.zeros(3, dtype=np.float32), deterministic=True)[0].shape
    ()
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        encoder: nn.Module,
        hidden: list[int],
        activation: type[nn.Module],
        log_std_init: float = 0.0,
        squashed: bool = False,
        memory: Memory | None = None,
        sde: dict | None = None,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        self.encoder = encoder
        self.memory = memory
        self.trunk = mlp(memory.out_dim if memory is not None else encoder.out_dim, hidden, activation)
        # Squashed Box actions (SAC's, and PPO's with use_sde and squash_output) go into [-1, 1] with tanh and are
        # rescaled to the bounds for the env.
        self.squashed = squashed and isinstance(action_space, spaces.Box)
        self.head = make_action_head(action_space, self.trunk.out_dim, log_std_init, sde, squashed=self.squashed)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def log_std(self) -> torch.nn.Module | None:
        """The state-independent log-std of a Gaussian policy (SB3's ``policy.log_std``; gSDE's exploration
        matrix); for SAC without gSDE, SB3's ``actor.log_std`` layer (made on each access, as :attr:`mu`); else
        None."""
        if self.squashed and not hasattr(self.head, "log_std"):
            return _LogStdLayer(self.head)
        return getattr(self.head, "log_std", None)

    def distribution_params(self, obs: ObsTensor) -> torch.Tensor:
        """Distribution parameters, ``(B, n_params)``: logits, Gaussian means, SAC's means and log-stds, or with
        use_sde the means beside the latent features the noise multiplies."""
        return self.head(self.trunk(self.encoder(obs)))

    def forward(self, obs: ObsTensor, deterministic: bool = False) -> torch.Tensor:
        """Actions for a batch of observations, as SB3's actors answer a call (SAC's squashed into [-1, 1]):
        :meth:`act`."""
        return self.act(obs, deterministic)

    def act(self, obs: ObsTensor, deterministic: bool = False) -> torch.Tensor:
        """Sample (or take the mode of) an action for every observation in the batch."""
        return self.head.sample(self.distribution_params(obs), deterministic)

    @property
    def squash_output(self) -> bool:
        """SB3's: whether actions come squashed into [-1, 1] (SAC's Box actions, PPO's with ``squash_output``)."""
        return bool(self.squashed)

    def get_distribution(self, obs: ObsTensor) -> ActionDistribution:
        """SB3's ``get_distribution``: the action distribution for a batch of observation tensors."""
        check_obs_tensors(obs, self.observation_space)
        if self.memory is not None:
            raise NotImplementedError(
                "get_distribution has no memory input: a recurrent actor gives its distribution parameters with "
                "forward_step(obs, state, episode_starts), and acts with predict(obs, state, episode_start)."
            )
        return ActionDistribution(self.head, self.distribution_params(obs), self.action_space)

    # -- recurrent actors: the memory sits between the encoder and the trunk
    def forward_step(self, obs: ObsTensor, state: State, episode_starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """Distribution parameters for one step of a batch, and the next memory."""
        latent, state = self.memory.encode_step(self.encoder, obs, state, episode_starts)
        return self.head(self.trunk(latent)), state

    def forward_sequences(
        self, obs: torch.Tensor, state: State, valid: torch.Tensor, resets: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Distribution parameters ``(S, L, n_params)`` for observations ``(S, L, ...)`` from ``state``
        (``resets`` ``(S, L)``: where a new trajectory starts inside a sequence, see :meth:`Memory.sequences`)."""
        return self.head(self.trunk(self.memory.encode_sequences(self.encoder, obs, state, valid, resets)))

    def reset_noise(self, n_envs: int = 1) -> None:
        """Draw new exploration matrices (``use_sde=True``): one for single observations, one per env of batches
        of ``n_envs`` (SB3's ``reset_noise``)."""
        if not isinstance(self.head, StateDependentGaussianHead):
            raise ValueError("reset_noise() is only available with state-dependent exploration (use_sde=True).")
        self.head.reset_noise(n_envs)

    def action_log_prob(self, obs: ObsTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action for every observation and its log-probability ``(B,)`` (SB3 SAC's
        ``actor.action_log_prob``); differentiable through the sample for SAC's squashed Gaussian."""
        params = self.distribution_params(obs)
        if self.squashed:
            return self.head.rsample(params)
        actions = self.head.sample(params)
        return actions, self.head.log_prob(params, actions)

    def get_action_dist_params(self, obs: ObsTensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """SB3 SAC actor's ``(mean, log_std, kwargs)``: the Gaussian's mean and log-std before the tanh (``(B, d)``
        each), and its distribution's keyword arguments; with gSDE ``log_std`` is the exploration parameter and
        ``kwargs`` ``{"latent_sde": latent}``, as in SB3."""
        if not self.squashed:
            raise TypeError(
                "get_action_dist_params() is SB3 SAC's actor method, for tanh-squashed actions; this actor's are "
                "not squashed: use model.policy.get_distribution(obs)."
            )
        params = self.distribution_params(obs)
        if isinstance(self.head, SquashedStateDependentHead):
            mean, latent = self.head._split(params)
            return mean, self.head.log_std, {"latent_sde": latent}
        mean, log_std = self.head._split(params)
        return mean, log_std, {}

    def get_std(self) -> torch.Tensor:
        """SB3's ``get_std()`` with gSDE: the exploration weights' standard deviations ``(latent_dim, d)``."""
        if not isinstance(self.head, StateDependentGaussianHead):
            raise ValueError("get_std() is only available with state-dependent exploration (use_sde=True).")
        return self.head.std()

    @property
    def latent_pi(self) -> nn.Sequential:
        """SB3's name for the MLP between the encoder and the action head: :attr:`trunk`."""
        return self.trunk

    @property
    def mu(self) -> nn.Module:
        """SB3 SAC actor's ``mu``: the layer from :attr:`latent_pi` to the Gaussian's mean before the tanh (with
        gSDE clipped to ``clip_mean``, as SB3's Hardtanh does), so SB3's older ONNX recipe,
        ``nn.Sequential(actor.latent_pi, actor.mu)``, runs. covey's head computes the mean and the log-std in one
        layer; this module reads the mean's part of it (made on each access, it is not one of the actor's own)."""
        if not self.squashed:  # SB3's PPO has no mu either
            raise AttributeError("mu")
        return _MeanLayer(self.head)

    def evaluate_params(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities and entropies from distribution parameters."""
        if hasattr(self.head, "log_prob_entropy"):
            return self.head.log_prob_entropy(params, actions)
        return self.head.log_prob(params, actions), self.head.entropy(params)

    def evaluate(self, obs: ObsTensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions`` and entropies, both ``(B,)``."""
        return self.evaluate_params(self.distribution_params(obs), actions)

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions as the env takes them: squashed actions rescaled from [-1, 1] to the bounds, other Box
        actions clipped to the bounds (training keeps the unclipped sample)."""
        actions = actions.reshape((-1, *self.action_space.shape))
        if self.squashed:
            low, high = self.action_space.low, self.action_space.high
            return (low + 0.5 * (actions + 1.0) * (high - low)).astype(self.action_space.dtype)
        if isinstance(self.action_space, spaces.Box):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return actions

    def obs_to_tensor(self, observation) -> tuple[ObsTensor, bool]:
        return obs_to_tensor(observation, self.observation_space, self.device)

    def set_training_mode(self, mode: bool) -> None:
        self.train(mode)

    def save(self, path: Any) -> None:
        """SB3's ``BasePolicy.save`` (SAC's ``model.actor.save``, POCA's ``model.policy.save``): covey writes no
        file of an actor alone, so this names the files it writes instead."""
        raise NotImplementedError(
            f"covey writes no file of an actor alone (save({path!r})): save the model, model.save(path), which holds "
            "the actor and loads back with its class's load (POCA's critic needs the group, so a team is saved "
            "whole); a PPO or SAC policy also saves alone, model.policy.save(path)."
        )

    def predict(
        self,
        observation,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """SB3's ``predict``: a single or batched observation to actions (numpy), and the state.

        Recurrent actors take and return SB3-contrib's ``state`` (a tuple of ``(1, n_envs, hidden)`` arrays;
        None means a fresh memory) and ``episode_start`` (rows whose memory is reset first). The actor is put
        in evaluation mode first, as SB3's ``predict`` puts its policy.
        """
        if self.training:
            self.train(False)
        obs, batched = self.obs_to_tensor(observation)
        if self.memory is not None:
            return self._predict_recurrent(obs, batched, state, episode_start, deterministic)
        with torch.no_grad():  # as SB3's (a tensor a hook keeps is no inference tensor), through the actor's call
            actions = self(obs, deterministic).cpu().numpy()
        actions = self.to_env_actions(actions)
        return (actions if batched else actions.squeeze(axis=0)), state

    def _predict_recurrent(self, obs, batched: bool, state, episode_start, deterministic: bool):
        batch = (next(iter(obs.values())) if isinstance(obs, dict) else obs).shape[0]
        if state is None:
            state_t = self.memory.initial_state(batch, self.device)
        else:
            check_state(state, self.memory, batch)
            state_t = tuple(torch.as_tensor(np.asarray(s), dtype=torch.float32, device=self.device) for s in state)
        starts = np.zeros(batch, dtype=bool) if episode_start is None else np.asarray(episode_start, dtype=bool)
        if starts.shape == ():  # one bool for every row (a single env's done flag, say)
            starts = np.full(batch, bool(starts))
        if starts.shape == (batch, 1):  # a column, which sb3-contrib flattens
            starts = starts.reshape(batch)
        if starts.shape != (batch,):
            raise ValueError(
                f"episode_start must be a bool or have shape ({batch},) (or ({batch}, 1)), got {starts.shape}."
            )
        with torch.no_grad():
            params, state_t = self.forward_step(obs, state_t, torch.as_tensor(starts, device=self.device))
            actions = self.head.sample(params, deterministic).cpu().numpy()
        actions = self.to_env_actions(actions)
        new_state = tuple(s.cpu().numpy() for s in state_t)
        return (actions if batched else actions.squeeze(axis=0)), new_state


def check_state(state, memory: Memory, batch: int) -> None:
    expected = (1, batch, memory.hidden_size)
    if not isinstance(state, (tuple, list)) or len(state) != memory.n_state:
        given = (
            f"{type(state).__name__} of length {len(state)}"
            if isinstance(state, (tuple, list))
            else f"one {type(state).__name__} of shape {tuple(np.shape(state))}"
        )
        raise ValueError(
            f"state must be a tuple of {memory.n_state} arrays of shape {expected} (as predict() returned it), "
            f"got {given}."
        )
    for s in state:
        if tuple(np.shape(s)) != expected:
            raise ValueError(
                f"state arrays must have shape {expected} (1 layer, {batch} observations, {memory.hidden_size} "
                f"units), got {tuple(np.shape(s))}. Pass the state predict() returned for the same observations "
                "(envs, or a team's agent slots)."
            )
        values = s.detach().cpu().numpy() if torch.is_tensor(s) else np.asarray(s)
        if not np.isfinite(values).all():
            raise ValueError(
                "state holds NaN or infinite values: pass the state predict() returned (None starts fresh memories)."
            )


class Critic(ReadOnlyViews, nn.Module):
    """Observations to a state value ``(B,)``: encoder -> MLP trunk -> value head.

    ``raw`` gives the head's output (values, or two-hot logits ``(B, K)``); ``forward`` the value.
    """

    def __init__(
        self,
        encoder: nn.Module,
        hidden: list[int],
        activation: type[nn.Module],
        value_head: nn.Module | None = None,
        memory: Memory | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.memory = memory
        self.trunk = mlp(memory.out_dim if memory is not None else encoder.out_dim, hidden, activation)
        self.value_head = value_head if value_head is not None else ScalarHead(self.trunk.out_dim)

    def raw(self, obs: ObsTensor) -> torch.Tensor:
        return self.value_head(self.trunk(self.encoder(obs)))

    def raw_step(self, obs: ObsTensor, state: State, episode_starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """Recurrent critics: the head's raw output for one step of a batch, and the next memory."""
        latent, state = self.memory.encode_step(self.encoder, obs, state, episode_starts)
        return self.value_head(self.trunk(latent)), state

    def raw_sequences(self, obs: torch.Tensor, state: State, valid: torch.Tensor) -> torch.Tensor:
        """Recurrent critics: raw outputs ``(S, L[, K])`` for observations ``(S, L, ...)`` from ``state``."""
        return self.value_head(self.trunk(self.memory.encode_sequences(self.encoder, obs, state, valid)))

    def forward(self, obs: ObsTensor) -> torch.Tensor:
        return self.value_head.value(self.raw(obs))


def actor_critic_forward(actor: Actor, critic: Critic, obs: ObsTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's distribution parameters and the critic's raw output on one batch (feed-forward networks).

    A shared encoder (``share_features_extractor=True``, the default) runs once for both, as SB3's shared
    features extractor does; on images that is half the convolutions of a minibatch, forward and backward.
    """
    if actor.encoder is critic.encoder:
        features = actor.encoder(obs)
        return actor.head(actor.trunk(features)), critic.value_head(critic.trunk(features))
    return actor.distribution_params(obs), critic.raw(obs)


def actor_critic_sequences(
    actor: Actor, critic: Critic, obs, actor_state: State, critic_state: State, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recurrent networks on sequences ``(S, L, ...)``: the actor's distribution parameters and the critic's raw
    output, each from its own memory. A shared encoder runs once for both (:func:`actor_critic_forward`)."""
    if actor.encoder is not critic.encoder:
        return actor.forward_sequences(obs, actor_state, valid), critic.raw_sequences(obs, critic_state, valid)
    features = sequence_features(actor.encoder, obs, valid)
    params = actor.head(actor.trunk(actor.memory.sequences(features, actor_state, valid)))
    return params, critic.value_head(critic.trunk(critic.memory.sequences(features, critic_state, valid)))


def policy_kind(policy: str, observation_space: spaces.Space) -> str:
    """Map an SB3 policy name to an encoder kind, with a clear error for unknown names."""
    policy = LSTM_POLICIES.get(policy, policy)
    if not isinstance(policy, str) or policy not in POLICY_KINDS:
        raise ValueError(f"Unknown policy {policy!r}; use one of {list(POLICY_KINDS)}.")
    kind = POLICY_KINDS[policy]
    if isinstance(observation_space, spaces.Dict) and kind == "cnn":
        return "multi"
    return kind


def _encoder_factory(
    kind: str, observation_space: spaces.Space, config: PolicyConfig, normalized: bool = True
) -> Callable[[], nn.Module]:
    """A function building a fresh observation encoder as ``config`` asks (each call: new weights), behind
    running statistics with ``normalize_observations`` (unless ``normalized=False``: the caller adds them)."""
    fx = dict(config.features_extractor_kwargs)
    unknown = set(fx) - {"features_dim", "cnn_output_dim", "normalized_image"}
    if config.features_extractor_class is None and unknown:
        raise ValueError(
            f"Unknown features_extractor_kwargs {sorted(unknown)}; covey's encoders take "
            "'features_dim' (CnnPolicy), 'cnn_output_dim' and 'normalized_image' (MultiInputPolicy)."
        )

    if config.features_extractor_class is None and not config.entity_encoder:
        _check_policy_fits(kind, observation_space)

    def encoder() -> nn.Module:
        return _with_statistics(built(), observation_space, config) if normalized else built()

    def built() -> nn.Module:
        if config.entity_encoder:
            return EntityEncoder(observation_space, fx.get("features_dim", 64))
        if config.features_extractor_class is not None:
            return ExternalEncoder(observation_space, config.features_extractor_class, fx, config.normalize_images)
        return make_encoder(
            observation_space,
            kind,
            config.normalize_images,
            features_dim=fx.get("features_dim", 512),
            cnn_output_dim=fx.get("cnn_output_dim", 256),
            normalized_image=bool(fx.get("normalized_image", False)),
        )

    return encoder


def _with_statistics(encoder: nn.Module, observation_space: spaces.Space, config: PolicyConfig) -> nn.Module:
    """``encoder`` behind running statistics of its observations where ``normalize_observations`` asks for them."""
    if config.normalize_observations:
        return NormalizedEncoder(encoder, observation_space, config.observation_clip)
    return encoder


def _check_policy_fits(kind: str, observation_space: spaces.Space) -> None:
    """CnnPolicy on observations with no image is refused, and MlpPolicy on Dict observations with image keys
    warned of: SB3 refuses both (covey's MlpPolicy on a Dict flattens every key, which fits vectors)."""
    if kind == "cnn" and not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"CnnPolicy puts a NatureCNN on image observations, and {observation_space} holds no image: use MlpPolicy."
        )
    if kind == "mlp" and isinstance(observation_space, spaces.Dict):
        images = [key for key, sub in observation_space.spaces.items() if is_image_space(sub)]
        if images:
            warn_user(
                f"MlpPolicy flattens the image key(s) {images} of these Dict observations into the MLP, pixel by "
                "pixel (SB3 refuses MlpPolicy for Dict observations). MultiInputPolicy gives each image key a "
                "NatureCNN."
            )


MEMORY_DEFAULTS = {"hidden_size": 128, "sequence_length": 16, "kind": "lstm"}


def positive_int(value: Any) -> bool:
    """Whether ``value`` is an int >= 1 (NumPy's integers too; not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def memory_settings(policy: str, config: PolicyConfig) -> dict | None:
    """The recurrent memory asked for by a *LstmPolicy name or ``policy_kwargs['memory']`` (None: none)."""
    contrib_keys = getattr(config, "_recurrent_ppo_keys", [])
    asked = config.memory is not None and not getattr(config, "_memory_from_lstm_hidden_size", False)
    if policy not in LSTM_POLICIES and contrib_keys and not asked:  # SB3's MlpPolicy raises a TypeError for them
        named = ", ".join(contrib_keys)
        raise ValueError(
            f"policy_kwargs {named} {'is' if len(contrib_keys) == 1 else 'are'} sb3-contrib's "
            f"setting{'s' if len(contrib_keys) > 1 else ''} of its *LstmPolicy policies, and the policy is {policy!r}: "
            f"use {next((k for k, v in LSTM_POLICIES.items() if v == policy), 'MlpLstmPolicy')!r} for a policy with "
            f"memory, or remove {named}."
        )
    if config.memory is None and policy not in LSTM_POLICIES:
        return None
    settings = {**MEMORY_DEFAULTS, **(config.memory or {})}
    unknown = set(settings) - set(MEMORY_DEFAULTS)
    if unknown:
        raise ValueError(f"Unknown memory settings {sorted(unknown)}; use {sorted(MEMORY_DEFAULTS)}.")
    if int(settings["sequence_length"]) < 1 or int(settings["hidden_size"]) < 1:
        raise ValueError(f"memory needs sequence_length >= 1 and hidden_size >= 1, got {settings}.")
    return settings


def _memory(encoder: nn.Module, settings: dict | None) -> Memory | None:
    if settings is None:
        return None
    return Memory(encoder.out_dim, int(settings["hidden_size"]), settings["kind"])


def _actor(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    encoder: nn.Module,
    hidden: list[int],
    config: PolicyConfig,
    memory: dict | None,
) -> Actor:
    """An on-policy actor (PPO, POCA): encoder, optional memory, trunk and the action head."""
    return Actor(
        observation_space,
        action_space,
        encoder,
        hidden,
        config.activation_fn,
        config.log_std_init,
        squashed=config.squash_output,
        memory=_memory(encoder, memory),
        sde=_on_policy_sde(config),
    )


def _on_policy_sde(config: PolicyConfig) -> dict | None:
    """The state-dependent head's settings for PPO's ``use_sde`` (None without): when squashed, its mean is not
    clipped and its latent takes no gradient through the noise, as SB3's PPO has them."""
    if not config.use_sde:
        return None
    sde = dict(full_std=config.full_std, use_expln=config.use_expln)
    return dict(sde, clip_mean=0.0, learn_features=False) if config.squash_output else sde


def _ortho_init(module: nn.Module, gain: float) -> None:
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain=gain)
            nn.init.zeros_(m.bias)


def build_actor_critic(
    policy: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    config: PolicyConfig | None = None,
) -> tuple[Actor, Critic]:
    """Build a PPO-style actor and critic from an SB3 policy name and a :class:`PolicyConfig`."""
    config = config or PolicyConfig()
    kind = policy_kind(policy, observation_space)
    encoder = _encoder_factory(kind, observation_space, config)

    # SB3: a NatureCNN encoder feeds the action and value layers directly; other encoders get [64, 64].
    extractor = config.features_extractor_class
    nature_cnn = (extractor is None and kind == "cnn") or (extractor is not None and extractor.__name__ == "NatureCNN")
    default = [] if nature_cnn else [64, 64]
    arch = parse_net_arch(config.net_arch, ("pi", "vf"), default)
    actor_encoder = encoder()
    critic_encoder = actor_encoder if config.share_features_extractor else encoder()
    memory = memory_settings(policy, config)
    # Actor and critic keep separate memories.
    actor = _actor(observation_space, action_space, actor_encoder, arch["pi"], config, memory)
    critic_memory = _memory(critic_encoder, memory)
    width = critic_memory.out_dim if critic_memory is not None else critic_encoder.out_dim
    critic = Critic(
        critic_encoder,
        arch["vf"],
        config.activation_fn,
        make_value_head(
            arch["vf"][-1] if arch["vf"] else width, 1, config.value_head, config.num_buckets, config.bucket_range
        ),
        memory=critic_memory,
    )
    if config.ortho_init:
        root2 = math.sqrt(2)
        for module, gain in (
            (actor.encoder, root2),
            (critic.encoder, root2),
            (actor.trunk, root2),
            (critic.trunk, root2),
            (actor.head.proj, 0.01),
            (critic.value_head if not critic.value_head.distributional else nn.Identity(), 1.0),
        ):
            _ortho_init(module, gain)
    return actor, critic


class QNetwork(nn.Module):
    """One Q function. Box actions: ``Q(features, action) -> (B,)``; Discrete: ``Q(features) -> (B, n_actions)``.

    ``forward`` returns the head's raw output (values, or two-hot logits with a trailing bucket axis).
    """

    def __init__(
        self,
        in_dim: int,
        action_space: spaces.Space,
        hidden: list[int],
        activation: type[nn.Module],
        config: PolicyConfig,
    ) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, spaces.Discrete)
        action_dim = 0 if self.discrete else int(np.prod(action_space.shape))
        self.trunk = mlp(in_dim + action_dim, hidden, activation)
        n_out = int(action_space.n) if self.discrete else 1
        self.head = make_value_head(
            self.trunk.out_dim, n_out, config.value_head, config.num_buckets, config.bucket_range
        )

    def forward(self, features: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        x = features if self.discrete else torch.cat([features, actions], dim=-1)  # (B, features + action_dim)
        return self.head(self.trunk(x))


class QEnsemble(WarnsOnHook, ReadOnlyViews, SB3FeatureNames, nn.Module):
    """``n_critics`` Q networks over one shared critic encoder.

    ``values`` gives the Q values stacked on dim 0: Box actions ``(n_critics, B)``, Discrete
    ``(n_critics, B, n_actions)``; ``raw`` the heads' outputs (two-hot logits carry a trailing bucket axis).
    Called, it answers as SB3's ``ContinuousCritic``: a tuple of one ``(B, 1)`` tensor per critic (``(B,
    n_actions)`` for Discrete actions); ``q1_forward`` the first critic's alone. With
    ``share_features_extractor`` the encoder is the actor's, and no gradient reaches it through the Q values
    (SB3's rule: the actor's loss alone trains it).
    """

    share_features_extractor: bool = False

    def __init__(
        self,
        encoder: nn.Module,
        action_space: spaces.Space,
        hidden: list[int],
        activation: type[nn.Module],
        config: PolicyConfig,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.qs = nn.ModuleList(
            QNetwork(encoder.out_dim, action_space, hidden, activation, config) for _ in range(config.n_critics)
        )

    @property
    def value_head(self) -> nn.Module:
        return self.qs[0].head

    @property
    def n_critics(self) -> int:
        """SB3's ``ContinuousCritic.n_critics``."""
        return len(self.qs)

    def features(self, obs: ObsTensor) -> torch.Tensor:
        """The encoder's output for the Q networks (cut from the graph when the encoder is the actor's)."""
        features = self.encoder(obs)
        return features.detach() if self.share_features_extractor else features

    def raw(self, obs: ObsTensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """The Q networks' raw outputs ``(n_critics, B[, n_actions][, K])``. While a forward hook is registered on
        this module (to log its Q-values, say), a scalar head's come through its call, SB3's ``critic(obs,
        actions)``, so that the hook runs wherever SB3's training runs it (and what it returns is used)."""
        if not self.value_head.distributional and _forward_hooked(self):
            values = torch.stack(self(obs, actions))
            return values if self.qs[0].discrete else values.squeeze(-1)
        return self._raw(obs, actions)

    def _warn_unused_hook(self) -> None:
        if self.value_head.distributional:
            warn_user(
                "A forward hook on a two-hot critic runs only where your code calls it: its update reads the "
                "critics' bins, not the Q-values its call gives. Register it on its layers (model.critic.qs[i].trunk, "
                "model.critic.qs[i].head), whose hooks run in training."
            )

    def _raw(self, obs: ObsTensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        features = self.features(obs)
        return torch.stack([q(features, actions) for q in self.qs])

    def values(self, obs: ObsTensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        return self.value_head.value(self.raw(obs, actions))

    def forward(self, obs: ObsTensor, actions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return tuple(self._sb3_shape(q) for q in self.value_head.value(self._raw(obs, actions)))

    def q1_forward(self, obs: ObsTensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """The first critic's Q values, ``(B, 1)`` (``(B, n_actions)`` for Discrete actions), as SB3's."""
        return self._sb3_shape(self.value_head.value(self.qs[0](self.features(obs), actions)))

    def _sb3_shape(self, q: torch.Tensor) -> torch.Tensor:
        return q if self.qs[0].discrete else q.unsqueeze(-1)

    def _is_view(self, name: str) -> bool:
        return (name.startswith("qf") and name[2:].isdigit()) or super()._is_view(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("qf") and name[2:].isdigit():  # SB3's qf0, qf1, ...: its q_networks by name
            index = int(name[2:])
            if index < len(self.qs):
                return self.q_networks[index]
        return super().__getattr__(name)

    @property
    def q_networks(self) -> list[nn.Module]:
        """SB3's ``ContinuousCritic.q_networks``: per critic, a module from the features and actions side by side
        (``torch.cat([features, actions], dim=1)``) to the Q values ``(B, 1)``, over the critic's own layers."""
        if self.qs[0].discrete:
            raise TypeError("q_networks is SB3's ContinuousCritic attribute, for Box actions: use model.critic.qs.")
        return [_SB3QNetwork(q) for q in self.qs]

    def set_training_mode(self, mode: bool) -> None:
        """SB3's name for ``train(mode)``."""
        self.train(mode)


class _SB3QNetwork(_MadeOnAccess, nn.Module):
    """One of :attr:`QEnsemble.q_networks`: a critic's trunk and value head as one module, SB3's layout."""

    _name = "model.critic.q_networks[i]"
    _instead = "model.critic (its call gives every Q network's values) or the Q network's layers, model.critic.qs[i]"

    def __init__(self, q: QNetwork) -> None:
        super().__init__()
        self.q = q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q.head.value(self.q.head(self.q.trunk(x))).reshape(-1, 1)  # (B, 1)


def build_sac_networks(
    policy: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    config: PolicyConfig,
) -> tuple[Actor, QEnsemble]:
    """SAC's actor (tanh-squashed Gaussian for Box, categorical for Discrete) and its Q ensemble."""
    kind = policy_kind(policy, observation_space)
    if config.n_critics < 1:
        raise ValueError(f"policy_kwargs n_critics={config.n_critics} is invalid: it must be >= 1.")
    encoder = _encoder_factory(kind, observation_space, config)
    actor_encoder = encoder()

    arch = parse_net_arch(config.net_arch, ("pi", "qf"), [256, 256])
    sde = dict(full_std=config.full_std, use_expln=config.use_expln, clip_mean=config.clip_mean)
    actor = Actor(
        observation_space,
        action_space,
        actor_encoder,
        arch["pi"],
        config.activation_fn,
        config.log_std_init,
        squashed=True,
        sde=sde if config.use_sde else None,
    )
    # share_features_extractor (as SB3's): the critics read the actor's encoder, which only the actor's loss trains
    critic_encoder = actor_encoder if config.share_features_extractor else encoder()
    critic = QEnsemble(critic_encoder, action_space, arch["qf"], config.activation_fn, config)
    critic.share_features_extractor = config.share_features_extractor
    return actor, critic


def build_poca_networks(
    policy: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    config: PolicyConfig,
    attention_width: int = 128,
    n_heads: int = 4,
) -> tuple[Actor, POCACritic]:
    """MA-POCA's shared actor (one policy for every agent of the group) and its attention critic.

    ``net_arch`` sizes the actor (``pi``, default [128, 128]) and the critic's layers after pooling
    (``vf``, default [128, 128]).
    """
    kind = policy_kind(policy, observation_space)
    encoder = _encoder_factory(kind, observation_space, config)
    if isinstance(observation_space, spaces.Dict):
        # A team's Dict observations travel flat (one vector per agent slot); each encoder unflattens them, and
        # standardizes the flat vector's Box keys first.
        flat = FlatDict(observation_space)
        dict_encoder = _encoder_factory(kind, observation_space, config, normalized=False)
        observation_space = flat.flat_space

        def encoder() -> nn.Module:
            return _with_statistics(FlatDictEncoder(flat, dict_encoder()), observation_space, config)

    arch = parse_net_arch(config.net_arch, ("pi", "vf"), [128, 128])
    memory = memory_settings(policy, config)  # the actor's memory per agent, the critic's per group
    actor = _actor(observation_space, action_space, encoder(), arch["pi"], config, memory)
    if config.ortho_init:
        _ortho_init(actor.trunk, math.sqrt(2))
        _ortho_init(actor.head.proj, 0.01)

    def value_head(width: int) -> nn.Module:
        return make_value_head(width, 1, config.value_head, config.num_buckets, config.bucket_range)

    critic_memory = None if memory is None else Memory(attention_width, int(memory["hidden_size"]), memory["kind"])
    critic = POCACritic(
        encoder(),
        action_space,
        value_head_fn=value_head,
        width=attention_width,
        hidden=arch["vf"],
        n_heads=n_heads,
        activation=config.activation_fn,
        memory=critic_memory,
    )
    return actor, critic
