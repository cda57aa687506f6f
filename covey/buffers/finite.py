"""The checks that keep NaN and infinite numbers, and discrete observations outside their space, from an env out
of training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from covey.networks.obs import discrete_range_problem


def _first_bad(value: Any) -> tuple[int, ...] | None:
    """The index of the first NaN or infinity in ``value`` (a NumPy array, a tensor, or a dict, list or tuple of
    them: the index within the first part that holds one), or None where every number is finite."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return next((index for index in map(_first_bad, value) if index is not None), None)
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or bool(torch.isfinite(value).all()):
            return None
        return tuple(torch.nonzero(~torch.isfinite(value))[0].tolist())
    value = np.asarray(value)
    if value.dtype.kind != "f" or bool(np.isfinite(value).all()):
        return None
    return tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])


VEC_ENV_ADVICE = (
    "Find the source with stable_baselines3.common.vec_env.VecCheckNan(env, raise_exception=True), and fix the env "
    "or replace those values in a wrapper."
)


def check_finite(
    when: str,
    advice: str = VEC_ENV_ADVICE,
    locate: Callable[[tuple[int, ...]], str] | None = None,
    **arrays: Any,
) -> None:
    """Raise where an array the env returned (observations, rewards; NumPy arrays, tensors or dicts of them)
    holds NaN or an infinity: an update on it turns every weight into NaN, silently. ``when`` says where
    (``"in this rollout"``), ``advice`` how to find and fix the source, and ``locate``, where given, words the
    index of the first such number (arrays that share their leading axes: a rollout's steps, copies, agents)."""
    for name, value in arrays.items():
        index = _first_bad(value)
        if index is not None:
            where = f" ({locate(index)})" if locate is not None else ""
            raise ValueError(
                f"The env returned NaN or infinite {name} {when}{where}; training on them would turn the weights "
                f"into NaN. {advice}"
            )


def check_discrete_observations(when: str, observations: Any, space: spaces.Space) -> None:
    """Raise where Discrete or MultiDiscrete observations the env returned (arrays or tensors, any batch; a
    tuple of several) lie outside ``space``: their one-hot encoding would read them as the nearest value."""
    for obs in observations if isinstance(observations, tuple) else (observations,):
        problem = discrete_range_problem(obs, space)
        if problem is not None:
            raise ValueError(
                f"The env returned an observation {when} with a {problem}; covey's one-hot encoding would read "
                "it as the nearest value, silently. Fix the env or its observation_space."
            )
