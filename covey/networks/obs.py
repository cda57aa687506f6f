"""Observation batches at the boundary: numpy (single or batched) to torch, with clear shape errors."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from covey.networks.encoders import obs_dtype
from covey.spaces import is_image_space, match_image_axes

_compiling = getattr(torch.compiler, "is_compiling", lambda: False)

ObsTensor = torch.Tensor | dict[str, torch.Tensor]


def _is_batched(obs: np.ndarray, space: spaces.Space, name: str) -> bool:
    shape = tuple(space.shape) if space.shape is not None else ()
    if obs.shape == shape:
        return False
    if obs.shape[1:] == shape and obs.ndim == len(shape) + 1:
        return True
    where = f" for key {name!r}" if name else ""
    raise ValueError(
        f"Observation has shape {obs.shape}{where}, but the observation space {space} expects a single "
        f"observation of shape {shape} or a batch of shape (n_envs, {', '.join(map(str, shape))}"
        f"{',' if len(shape) == 1 else ''}). Check that the env matches the one the model was trained on."
    )


def _check_finite(obs: np.ndarray, name: str) -> None:
    if obs.dtype.kind == "f" and not np.all(np.isfinite(obs)):
        where = f" (key {name!r})" if name else ""
        raise ValueError(
            f"Observation{where} contains NaN or inf values; the policy cannot act on them. "
            "Find where the env returns them (for an SB3 VecEnv, stable_baselines3.common.vec_env.VecCheckNan(env, "
            "raise_exception=True) names the step), or clean the observation."
        )


def discrete_range_problem(obs, space: spaces.Space, name: str = "") -> str | None:
    """What is wrong with Discrete or MultiDiscrete observations (a NumPy array or a tensor, any batch) outside
    their space, or None: their one-hot encoding would read such a value as the nearest one, silently."""
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            problem = discrete_range_problem(obs[key], sub, key)
            if problem is not None:
                return problem
        return None
    if isinstance(space, spaces.Discrete):
        low, high = np.asarray(space.start), np.asarray(space.start + space.n - 1)
        allowed = f"whole numbers from {low} to {high}"
    elif isinstance(space, spaces.MultiDiscrete):
        low, high = np.asarray(space.start), np.asarray(space.start + space.nvec - 1)
        allowed = "whole numbers from start to start + nvec - 1, entry by entry"
    else:
        return None
    values = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
    if values.size == 0:
        return None
    bad = (values < low) | (values > high) | (values != np.round(values))
    if not bad.any():
        return None
    of_key = f" of key {name!r}" if name else ""
    return f"value {values[bad].reshape(-1)[0].item()!r}{of_key} outside {space} ({allowed})"


def obs_to_tensor(observation, space: spaces.Space, device: torch.device | str = "cpu") -> tuple[ObsTensor, bool]:
    """Convert a single or batched observation to a batched tensor (or dict of them).

    Returns the tensor and whether the input was already batched (SB3's ``vectorized_env`` flag).
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(observation, dict):
            raise ValueError(
                f"The observation space is a Dict with keys {list(space.spaces)}, but the observation "
                f"is a {type(observation).__name__}. Pass a dict with those keys."
            )
        missing = set(space.spaces) - set(observation)
        if missing:
            raise ValueError(f"Observation dict lacks keys {sorted(missing)} of the Dict observation space.")
        out, batched = {}, None
        for key, sub in space.spaces.items():
            out[key], b = _one_to_tensor(observation[key], sub, device, key)
            if batched is not None and b != batched:
                raise ValueError("Some keys of the observation dict are batched and others are not.")
            batched = b
        return out, bool(batched)
    return _one_to_tensor(observation, space, device, "")


def _one_to_tensor(observation, space: spaces.Space, device, name: str) -> tuple[torch.Tensor, bool]:
    where = f" for key {name!r}" if name else ""
    if isinstance(observation, dict):  # np.asarray would make it a 0-d object array, reported as shape ()
        raise ValueError(
            f"The observation{where} is a dict with keys {list(observation)}, but the observation space is {space}: "
            "pass an array of that shape. Check that the env matches the one the model was trained on."
        )
    obs = np.asarray(observation)
    if obs.dtype == object:  # e.g. a list of dicts: its shape would say nothing about what is wrong
        held = sorted({type(x).__name__ for x in obs.reshape(-1)})
        raise ValueError(
            f"The observation{where} is a {type(observation).__name__} of {', '.join(held)}, not numbers: the "
            f"observation space {space} takes an array (one observation, or a batch with one row per env)."
        )
    obs = match_image_axes(obs, space)
    batched = _is_batched(obs, space, name)
    _check_finite(obs, name)
    problem = discrete_range_problem(obs, space, name)
    if problem is not None:
        raise ValueError(f"Observation has a {problem}. Check that the env matches the one the model was trained on.")
    tensor = torch.as_tensor(obs, dtype=obs_dtype(space), device=device)
    return (tensor if batched else tensor.unsqueeze(0)), batched


def batch_to_tensor(obs, space: spaces.Space, device: torch.device | str = "cpu") -> ObsTensor:
    """A VecEnv's batched observation to tensors, without shape checks (the hot path)."""
    if isinstance(space, spaces.Dict):
        return {
            key: torch.as_tensor(obs[key], dtype=obs_dtype(sub), device=device) for key, sub in space.spaces.items()
        }
    return torch.as_tensor(obs, dtype=obs_dtype(space), device=device)


def _check_batch_axes(obs: torch.Tensor, space: spaces.Space | None, where: str) -> None:
    """A vector Box's tensor ``(n_steps, n_envs, *shape)`` names the reshape to one batch. Other shapes go on to
    the networks as before (a batch flattened to ``(B, prod(shape))`` reads as SB3's flattening reads it). Shapes
    are compared before anything else, as plain integers, so that a trace or a compiled graph has nothing to
    guard on where they fit."""
    if not isinstance(space, spaces.Box) or not space.shape or torch.jit.is_tracing() or _compiling():
        return
    shape = tuple(space.shape)
    if obs.ndim <= len(shape) + 1 or tuple(obs.shape[obs.ndim - len(shape) :]) != shape or is_image_space(space):
        return
    dims = ", ".join(map(str, shape))
    raise ValueError(
        f"The policy takes one batch of observations, of shape (B, {dims}){where}; got a tensor of shape "
        f"{tuple(obs.shape)}, with {obs.ndim - len(shape)} batch axes. The rollout buffer's arrays are "
        f"(n_steps, n_envs, ...), also after learn (SB3 flattens them there): reshape them to (-1, {dims})."
    )


def check_obs_tensors(obs, space: spaces.Space | None = None) -> None:
    """Refuses anything but observation tensors (a dict of them for Dict spaces) where a policy's tensor methods
    take them, naming the conversions; with ``space``, a tensor of a vector Box (not an image) with batch axes
    before the space's shape beyond one, as the rollout buffer's ``(n_steps, n_envs, ...)`` arrays have, too."""
    if isinstance(obs, torch.Tensor):
        _check_batch_axes(obs, space, "")
        return
    if isinstance(obs, dict) and all(isinstance(v, torch.Tensor) for v in obs.values()):
        if isinstance(space, spaces.Dict):
            for key, value in obs.items():
                _check_batch_axes(value, space.spaces.get(key), f" for key {key!r}")
        return
    raise TypeError(
        f"The policy takes observation tensors (a dict of them for Dict spaces), got {type(obs).__name__}. "
        "Convert with policy.obs_to_tensor(observation)[0], or call policy.predict(observation) for numpy actions."
    )
