"""ONNX export of a trained actor: the policy alone (the critic is training machinery), as a graph that maps
raw observations to the deterministic env action exactly as ``model.predict(obs, deterministic=True)``
returns it.

The graph is the actor's own modules (encoder, memory, trunk, action head) composed in a small wrapper, so
it takes the same path as ``predict``: discrete actions are the argmax (plus the space's ``start``),
MultiBinary bits are thresholded at probability 0.5, PPO's Gaussian mean is clipped to the action bounds,
SAC's squashed mean is rescaled from [-1, 1] to the bounds.

Graph inputs (batch dimension dynamic):

- Box observations: ``float32`` (``uint8`` for uint8 images, scaled inside the graph as covey's encoder does; a
  uint8 Box that is not an image, such as an Atari RAM, is ``float32`` as ``predict`` takes it; so is a
  ``float64`` Box, such as MuJoCo's: pass ``obs.astype(np.float32)``, which ``predict`` does for you);
  Discrete and MultiDiscrete: ``int64``; MultiBinary: ``int8`` (the dtypes the env gives, or float32 for Box);
- a Dict observation: one input per key, named after the key;
- recurrent actors also take ``state_h`` (and ``state_c`` for an LSTM), each ``(1, batch, hidden)``, and
  ``episode_start`` (``bool``, ``(batch,)``), and return ``next_state_h`` (and ``next_state_c``), the
  state ``predict(obs, state, episode_start)`` returns.

The output is ``action``: ``int64`` for Discrete and MultiDiscrete, ``float32`` otherwise, shaped
``(batch, *action_space.shape)``.

The graph checks its inputs' dtypes and ranks only, where ``predict`` checks more: a memory or ``episode_start``
sized for another batch is broadcast, and Discrete observations outside their space are read without an error.
Check them where the graph is deployed.

>>> from covey import PPO
>>> from covey.export import export_onnx
>>> model = PPO("MlpPolicy", "CartPole-v1").learn(2048)  # doctest: +SKIP
>>> export_onnx(model, "cartpole.onnx")["verified"]  # doctest: +SKIP
True
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import pathlib
import warnings
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from covey.files import write_atomically
from covey.requirements import release
from covey.spaces import is_image_space
from covey.version import __version__
from covey.warning import warn_user

OPSET = 18
"""ONNX opset of exported graphs: the one torch's torch.export-based exporter implements its operators in
(others go through ONNX's version converter); onnxruntime reads it from version 1.14 on."""

CONTINUOUS_ATOL = 1e-5
"""Largest difference between the ONNX graph's and ``predict``'s continuous actions (and memory states)
that verification accepts, relative to the largest of ``predict``'s values where they exceed 1 (actions
rescaled to wide bounds carry float32's relative rounding: onnxruntime's tanh is not torch's to the last bit)."""

_INSTALL_HINT = 'pip install "covey[export]"'

EXPORT_MIN_TORCH = (2, 8)
"""The oldest torch whose torch.export-based ONNX exporter exports every actor covey has: the exporters of torch
2.6 and 2.7 fixed the batch size of some actors (recurrent ones, a team's Dict actor) to the example's
(tests/test_export.py: 3 of its 28 tests failed with torch 2.6.0, 2 with 2.7.1, none with 2.8.0)."""


def _check_torch_for_export() -> None:
    """ImportError, naming the upgrade, where the torch in use is older than :data:`EXPORT_MIN_TORCH`."""
    version = torch.__version__
    if release(version) < EXPORT_MIN_TORCH:
        needed = ".".join(map(str, EXPORT_MIN_TORCH))
        raise ImportError(
            f"ONNX export needs torch>={needed}, whose exporter keeps every actor's batch size free; this "
            f'environment has torch {version}: pip install -U "torch>={needed}".'
        )


def _require(module: str, purpose: str) -> Any:
    try:
        return __import__(module)
    except ImportError as err:
        raise ImportError(f"{purpose} needs the {module!r} package, which is not installed: {_INSTALL_HINT}") from err


def _input_dtype(space: spaces.Space) -> np.dtype:
    """The dtype a graph input takes for observations of ``space`` (what the env gives, float32 for a Box that
    is not an image)."""
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
        return np.dtype(np.int64)
    if isinstance(space, spaces.MultiBinary):
        return np.dtype(np.int8)
    if is_image_space(space):  # pixels stay whole, as covey stores them (obs_dtype)
        return np.dtype(np.uint8)
    return np.dtype(np.float32)  # another uint8 Box too: SB3's VecNormalize gives it as floats


def _input_shape(space: spaces.Space) -> tuple[int, ...]:
    return tuple(int(d) for d in space.shape) if space.shape is not None else ()


class ExportedActor(nn.Module):
    """An actor's deterministic ``predict`` as one traceable module: raw observation tensors (and, for a
    recurrent actor, the memory and episode starts) to env actions (and the next memory).

    Observation tensors come positionally: one for a plain space, one per key (in the space's key order)
    for a Dict space. Used by :func:`export_onnx`; it holds the actor's modules, not copies.
    """

    def __init__(self, actor: nn.Module, observation_space: spaces.Space | None = None) -> None:
        super().__init__()
        self.actor = actor
        # The graph's inputs: a team's Dict space when given (its actor takes the observations flat), else the actor's
        space = self.observation_space = actor.observation_space if observation_space is None else observation_space
        self.keys: list[str] | None = list(space.spaces) if isinstance(space, spaces.Dict) else None
        # A team's Dict observations reach its actor flattened (FlatDict): the graph takes the keys and flattens.
        self.flatten_keys = isinstance(space, spaces.Dict) and not isinstance(actor.observation_space, spaces.Dict)
        self.action_shape = tuple(int(d) for d in actor.action_space.shape or ())
        self.recurrent = actor.memory is not None
        self.n_state = actor.memory.n_state if self.recurrent else 0
        action_space = actor.action_space
        # Box actions: SAC's squashed actions are rescaled to the bounds, PPO's Gaussian mean is clipped to them
        # (np.clip against infinite bounds is the identity, so only finite bounds are applied).
        self.rescale = bool(actor.squashed)
        self.clip = isinstance(action_space, spaces.Box) and not actor.squashed
        if isinstance(action_space, spaces.Box):
            low = np.asarray(action_space.low, dtype=np.float32).reshape(-1)
            high = np.asarray(action_space.high, dtype=np.float32).reshape(-1)
            self.clip_low = self.clip and bool(np.isfinite(low).any())
            self.clip_high = self.clip and bool(np.isfinite(high).any())
            self.register_buffer("low", torch.as_tensor(low), persistent=False)
            self.register_buffer("high", torch.as_tensor(high), persistent=False)

    @property
    def n_obs_inputs(self) -> int:
        return len(self.keys) if self.keys is not None else 1

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        n_obs = self.n_obs_inputs
        obs = dict(zip(self.keys, inputs[:n_obs])) if self.keys is not None else inputs[0]
        if self.flatten_keys:
            obs = torch.cat([x.reshape(x.shape[0], -1).to(torch.float32) for x in inputs[:n_obs]], dim=1)
        if self.recurrent:
            state = tuple(inputs[n_obs : n_obs + self.n_state])
            episode_start = inputs[n_obs + self.n_state]
            params, next_state = self.actor.forward_step(obs, state, episode_start)
        else:
            params, next_state = self.actor.distribution_params(obs), ()
        action = self.actor.head.sample(params, deterministic=True)
        action = self._to_env_actions(action)
        return (action, *next_state) if self.recurrent else action

    def _to_env_actions(self, action: torch.Tensor) -> torch.Tensor:
        """``Actor.to_env_actions`` in torch: the same arithmetic in the same order, on float32."""
        if self.rescale:
            action = self.low + 0.5 * (action + 1.0) * (self.high - self.low)
        elif self.clip:
            if self.clip_low:
                action = torch.maximum(action, self.low)
            if self.clip_high:
                action = torch.minimum(action, self.high)
        return action.reshape(-1, *self.action_shape)  # (B, *action_space.shape)


def _names(actor: nn.Module, space: spaces.Space) -> tuple[list[str], list[str]]:
    """Graph input and output names."""
    inputs = list(space.spaces) if isinstance(space, spaces.Dict) else ["obs"]
    outputs = ["action"]
    if actor.memory is not None:
        suffixes = ["h", "c"][: actor.memory.n_state]
        inputs += [f"state_{s}" for s in suffixes] + ["episode_start"]
        outputs += [f"next_state_{s}" for s in suffixes]
    if isinstance(space, spaces.Dict):
        ports = inputs[len(space.spaces) :] + outputs
        clashes = [key for key in space.spaces if key in ports]
        if clashes:
            raise ValueError(
                f"The Dict observation keys {clashes} are also names of the graph's other inputs and outputs "
                f"{ports}, and ONNX names each value once. The inputs take the keys' names: rename those keys (a "
                "gymnasium ObservationWrapper) and train or load the model with them to export it."
            )
    return inputs, outputs


def _obs_spaces(space: spaces.Space) -> list[spaces.Space]:
    return list(space.spaces.values()) if isinstance(space, spaces.Dict) else [space]


def _example_inputs(actor: nn.Module, space: spaces.Space, batch: int) -> tuple[torch.Tensor, ...]:
    """Zeros of the graph's input shapes and dtypes (batch > 1: torch.export specializes sizes 0 and 1)."""
    args = [torch.from_numpy(np.zeros((batch, *_input_shape(s)), dtype=_input_dtype(s))) for s in _obs_spaces(space)]
    if actor.memory is not None:
        args += list(actor.memory.initial_state(batch))
        args.append(torch.zeros(batch, dtype=torch.bool))
    return tuple(args)


def _dynamic_shapes(actor: nn.Module, space: spaces.Space) -> tuple[dict[int, Any], ...]:
    batch = torch.export.Dim("batch")
    shapes: list[dict[int, Any]] = [{0: batch} for _ in _obs_spaces(space)]
    if actor.memory is not None:
        shapes += [{1: batch} for _ in range(actor.memory.n_state)]  # (1, batch, hidden)
        shapes.append({0: batch})
    # The module takes its inputs as *args, which torch.export describes as one tuple.
    return (tuple(shapes),)


@contextlib.contextmanager
def _quiet_exporter():
    """Keep the exporter's notices (missing optional packages, deprecations) off the user's terminal."""
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        onnx_logger.setLevel(level)


def _export_bytes(wrapper: ExportedActor, actor: nn.Module) -> bytes:
    """The ONNX model (weights embedded) as bytes, from torch's torch.export-based exporter."""
    space = wrapper.observation_space
    input_names, output_names = _names(actor, space)
    try:
        with _quiet_exporter():
            program = torch.onnx.export(
                wrapper,
                _example_inputs(actor, space, batch=3),
                f=None,
                dynamo=True,
                input_names=input_names,
                output_names=output_names,
                opset_version=OPSET,
                dynamic_shapes=_dynamic_shapes(actor, space),
                external_data=False,
                verbose=False,
            )
    except Exception as err:  # the exporter raises many kinds; all mean the same to the user
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(
            f"torch.onnx.export could not export this actor ({type(actor.encoder).__name__} encoder, "
            f"{type(actor.head).__name__} action head): {first}"
        ) from err
    _unique_value_names(program.model)
    return program.model_proto.SerializeToString()


def _unique_value_names(model: Any) -> None:
    """Rename the graph's inner values that carry an input's or output's name: the exporter names values after the
    ops that make them (``view``, ``cat``, ...) and constants after the module's buffers (the action bounds
    ``low`` and ``high``), so a Dict key of that name would otherwise appear twice in the graph, which ONNX refuses
    or reads as the constant."""
    graph = model.graph
    ends = [*graph.inputs, *graph.outputs]
    reserved, own = {v.name for v in ends}, {id(v) for v in ends}
    taken = reserved | {value.name for node in graph for value in node.outputs} | set(graph.initializers)

    def rename(value: Any) -> None:
        k = 1
        while f"{value.name}_{k}" in taken:
            k += 1
        value.name = f"{value.name}_{k}"
        taken.add(value.name)

    for value in list(graph.initializers.values()):
        if value.name in reserved and id(value) not in own:
            name = value.name
            rename(value)
            if name in graph.initializers:  # a container that does not follow its values' names
                graph.initializers[value.name] = graph.initializers.pop(name)
    for node in graph:
        for value in node.outputs:
            if value.name in reserved and id(value) not in own:
                rename(value)


def _add_metadata(onnx_bytes: bytes, agent: Any) -> bytes:
    """Record where the graph came from and what its inputs mean (ONNX ``metadata_props``)."""
    import onnx

    from covey import serialization

    proto = onnx.load_from_string(onnx_bytes)
    onnx.checker.check_model(proto)
    meta = {
        "covey_version": __version__,
        "covey_agent": getattr(agent, "agent_name", type(agent).__name__),
        "observation_space": json.dumps(serialization.space_to_json(agent.observation_space)),
        "action_space": json.dumps(serialization.space_to_json(agent.action_space)),
        "output": "deterministic env action, as model.predict(obs, deterministic=True) returns it",
    }
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name = "covey"
    return proto.SerializeToString()


def _resolve_agent(model: Any) -> Any:
    from covey.agents.base import BaseAgent

    if isinstance(model, BaseAgent):
        return model
    if isinstance(model, (str, os.PathLike)):
        path = pathlib.Path(model)
        if path.is_dir():
            raise IsADirectoryError(
                f"{str(path)!r} is a folder, not a covey model file; pass the model's .zip (written by model.save)."
            )
        from covey.agents import load

        # Missing files and files that are not covey models raise FileNotFoundError / ModelFileError here.
        return load(path, device="cpu")
    raise TypeError(
        f"export_onnx needs a covey agent (PPO, SAC or POCA) or the path of a covey model file, got "
        f"{type(model).__name__}. A Stable-Baselines3 model is not a covey agent: pass the path of its saved file "
        "(covey loads SB3's PPO and SAC files) or train the model with covey."
    )


def sample_observations(space: spaces.Space, n: int, seed: int = 0) -> np.ndarray | dict[str, np.ndarray]:
    """``n`` observations drawn from ``space`` (seeded) as one batch, in the dtypes of the graph's inputs."""
    if isinstance(space, spaces.Dict):
        return {
            key: sample_observations(sub, n, seed + 7919 * (i + 1)) for i, (key, sub) in enumerate(space.spaces.items())
        }
    sampler = copy.deepcopy(space)
    sampler.seed(int(seed))
    batch = np.stack([np.asarray(sampler.sample()) for _ in range(n)])
    return batch.astype(_input_dtype(space), copy=False)


def _as_feed(obs: np.ndarray | dict[str, np.ndarray], input_names: list[str]) -> dict[str, np.ndarray]:
    return dict(obs) if isinstance(obs, dict) else {input_names[0]: obs}


def compare_actions(expected: np.ndarray, got: np.ndarray, discrete: bool) -> tuple[bool, float]:
    """(match, max abs difference) of two action batches; discrete actions must be equal. Continuous ones may
    differ by a rounding of the coarser of the two float types (float16 actions, which ``predict`` rounds to,
    against a network's float32)."""
    expected = np.asarray(expected)
    got = np.asarray(got)
    if expected.shape != got.shape:
        return False, float("inf")
    floats = [np.finfo(a.dtype).eps for a in (expected, got) if np.issubdtype(a.dtype, np.floating)]
    atol = max([CONTINUOUS_ATOL, *floats])
    expected, got = expected.astype(np.float64), got.astype(np.float64)
    both_nan = np.isnan(expected) & np.isnan(got)  # an overflowing network gives NaN in both: that is agreement
    if expected.size == 0 or both_nan.all():
        return True, 0.0
    diff = float(np.max(np.abs(expected[~both_nan] - got[~both_nan])))
    if math.isnan(diff):
        return False, math.inf
    scale = max(1.0, float(np.max(np.abs(expected[~both_nan]))))
    return (diff == 0.0 if discrete else diff <= atol * scale), diff


def _as_actor_input(obs: np.ndarray | dict[str, np.ndarray], actor: nn.Module) -> np.ndarray | dict[str, np.ndarray]:
    """Sampled observations as the actor takes them: a Dict batch flattened (in key order) for an actor of flat
    vectors (a team's, :class:`~covey.networks.encoders.FlatDict`), otherwise as they are."""
    if isinstance(obs, dict) and not isinstance(actor.observation_space, spaces.Dict):
        return np.concatenate([value.reshape(len(value), -1).astype(np.float32) for value in obs.values()], axis=1)
    return obs


def _verify(
    agent: Any, cpu_actor: nn.Module, space: spaces.Space, file: str, n_samples: int, seed: int
) -> tuple[bool, float]:
    """Run the file with onnxruntime on sampled observations and compare with ``agent.predict``.

    An agent on another device is compared through the CPU copy of its actor (what ``agent.predict`` runs
    for a batch of observations): the graph computes on the CPU in float32, while GPU kernels (TF32
    convolutions, other summation orders) differ from the CPU by more than the tolerance on their own.
    """
    ort = _require("onnxruntime", "Verifying an ONNX export")
    session = ort.InferenceSession(file, providers=["CPUExecutionProvider"])
    actor = cpu_actor
    if torch.device(getattr(agent, "device", "cpu")).type != "cpu":
        agent = cpu_actor
    input_names, _ = _names(actor, space)
    action_space = actor.action_space
    discrete = isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary))
    rng = np.random.default_rng(seed)
    obs = sample_observations(space, n_samples, seed)
    if actor.memory is None:
        expected, _ = agent.predict(_as_actor_input(obs, actor), deterministic=True)
        (got,) = session.run(None, _as_feed(obs, input_names))
        return compare_actions(expected, got, discrete)
    # A recurrent actor: two steps, the second from the state the first returned, with some memories reset.
    ok, worst = True, 0.0
    state = tuple(np.zeros((1, n_samples, actor.memory.hidden_size), np.float32) for _ in range(actor.memory.n_state))
    for step in range(2):
        obs_t = obs if step == 0 else sample_observations(space, n_samples, seed + 1)
        starts = rng.random(n_samples) < 0.3
        expected, expected_state = agent.predict(
            _as_actor_input(obs_t, actor), state=state, episode_start=starts, deterministic=True
        )
        feed = _as_feed(obs_t, input_names)
        feed.update(zip(input_names[-actor.memory.n_state - 1 : -1], state))
        feed["episode_start"] = starts
        got, *got_state = session.run(None, feed)
        match, diff = compare_actions(expected, got, discrete)
        ok, worst = ok and match, max(worst, diff)
        for e, g in zip(expected_state, got_state):
            match, diff = compare_actions(e, g, discrete=False)
            ok, worst = ok and match, max(worst, diff)
        state = expected_state
    return ok, worst


def export_onnx(
    model: Any,
    path: str | os.PathLike,
    verify: bool = True,
    n_samples: int = 64,
    seed: int = 0,
) -> dict[str, Any]:
    """Export a covey agent's actor to an ONNX file that computes ``predict(obs, deterministic=True)``.

    :param model: a covey agent (PPO, SAC or POCA) or the path of a model file (covey's, or SB3's PPO or SAC).
        For POCA the graph is the group's shared actor and takes one agent's observation per row.
    :param path: the ``.onnx`` file to write (suffix added when missing), written atomically.
    :param verify: run the file with onnxruntime on ``n_samples`` observations sampled from the observation
        space and compare with ``model.predict(..., deterministic=True)``: discrete actions must be equal,
        continuous ones within ``1e-5`` (relative, for values above 1). A mismatch warns and returns ``verified=False``.
    :param n_samples: observations used for verification.
    :param seed: seed of the sampled observations.
    :return: ``{"path", "verified", "max_abs_diff", "n_samples", "inputs", "outputs"}``.
    """
    _check_torch_for_export()
    _require("onnx", "ONNX export")
    _require("onnxscript", "ONNX export")
    if verify:
        _require("onnxruntime", "Verifying an ONNX export")
    if not isinstance(n_samples, (int, np.integer)) or isinstance(n_samples, bool) or n_samples < 1:
        raise ValueError(f"n_samples={n_samples!r} is invalid: it must be a positive integer.")
    agent = _resolve_agent(model)
    trained = getattr(agent, "actor", None)
    if agent._sb3_policy_class is not None:
        raise ValueError(
            f"This {type(agent).__name__} trains a policy class of the user's ({agent.policy_name}), whose code covey "
            "cannot export as "
            "its own networks. Export model.policy as SB3's documentation does (torch.onnx.export of a module that "
            "calls the policy), or train with a policy name and policy_kwargs to export with covey."
        )
    if trained is None:
        raise ValueError(
            f"This {type(agent).__name__} has no networks yet (it was built without an env); "
            "build it with an env or load a saved model."
        )
    target = pathlib.Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{str(target)!r} is a folder; pass the path of the .onnx file to write.")
    if target.suffix == "":
        target = target.with_suffix(".onnx")

    # Export a CPU copy in eval mode: the agent the caller holds is left exactly as it was.
    actor = copy.deepcopy(trained).cpu().eval()
    # Dict observations: the graph takes the keys, as the agents observe them (a team's actor takes them flat)
    space = agent.observation_space if isinstance(agent.observation_space, spaces.Dict) else actor.observation_space
    onnx_bytes = _add_metadata(_export_bytes(ExportedActor(actor, space), actor), agent)
    input_names, output_names = _names(actor, space)

    verdict = (False, float("nan"))

    def verify_file(tmp: str) -> None:
        """Run the complete file before it takes the target's name: a crash leaves any previous file as it was."""
        nonlocal verdict
        # predict, which verification calls, puts the policy in evaluation mode (as SB3's does): put back each
        # module's mode as the caller left it
        modes = [(m, m.training) for network in agent._networks().values() for m in network.modules()]
        try:
            verdict = _verify(agent, actor, space, tmp, int(n_samples), seed)
        except Exception as err:  # onnxruntime's own errors (its Fail, InvalidArgument, ...) are no RuntimeError
            if type(err).__module__.split(".")[0] != "onnxruntime":
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise RuntimeError(
                f"onnxruntime could not run the exported graph, so {str(target)!r} was not written: {first}. "
                "Pass verify=False to write it anyway, and report the model's spaces and policy_kwargs as a bug."
            ) from err
        finally:
            for module, mode in modes:
                module.training = mode

    write_atomically(target, lambda f: f.write(onnx_bytes), before_replace=verify_file if verify else None)
    verified, max_abs_diff = verdict
    if verify and not verified:
        warn_user(
            f"The ONNX export at {target} does not reproduce model.predict(deterministic=True) on {n_samples} "
            f"sampled observations (max abs difference {max_abs_diff:.3g}); check the file before using it.",
            RuntimeWarning,
        )
    return {
        "path": str(target),
        "verified": bool(verified),
        "max_abs_diff": float(max_abs_diff),
        "n_samples": int(n_samples),
        "inputs": input_names,
        "outputs": output_names,
    }
