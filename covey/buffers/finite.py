"""The checks that keep NaN and infinite numbers, and discrete observations outside their space, from an env out
of training."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from covey.networks.obs import discrete_range_problem


def _finite(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    value = np.asarray(value)
    return value.dtype.kind != "f" or bool(np.isfinite(value).all())


def check_finite(when: str, **arrays: Any) -> None:
    """Raise where an array the env returned (observations, rewards; NumPy arrays, tensors or dicts of them)
    holds NaN or an infinity: an update on it turns every weight into NaN, silently. ``when`` says where
    (``"in this rollout"``)."""
    for name, value in arrays.items():
        if not _finite(value):
            raise ValueError(
                f"The env returned NaN or infinite {name} {when}; training on them would turn the weights into "
                "NaN. Find the source with stable_baselines3.common.vec_env.VecCheckNan(env, "
                "raise_exception=True), and fix the env or replace those values in a wrapper."
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
