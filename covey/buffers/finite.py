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
                f"The env returned NaN or infinite {name} {when}{where} (or numbers beyond float32's range, "
                f"about 3.4e38, which float32 storage makes infinite); training on them would turn the weights "
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


def check_terminal_observation(final: Any, new_obs: Any, i: int) -> None:
    """Raise where env ``i``'s ``terminal_observation`` (in its info) is not an observation of the kind and shape
    of the step's observations ``new_obs`` (one per env): a VecEnv wrapper that changes the observations (as
    SB3's docs' ``VecExtractDictObs``) must change that one too, which a truncated episode bootstraps from. Keys a
    Dict observation holds beyond the step's are left out, as everywhere."""
    if isinstance(new_obs, dict):
        fits = isinstance(final, dict) and new_obs.keys() <= final.keys()
        fits = fits and all(np.shape(final[key]) == np.shape(value)[1:] for key, value in new_obs.items())
    else:
        fits = not isinstance(final, dict) and np.shape(final) == np.shape(new_obs)[1:]
    if not fits:
        raise ValueError(
            f"infos[{i}]['terminal_observation'] is {_what(final)}, where the step's observations are "
            f"{_what(new_obs, batch=True)} (the true last observation of an episode, which a time limit's bootstrap "
            "reads, must be one of them). Either the env returns observations of another shape or keys than its "
            "observation_space, which its VecEnv copied into the space's (fix the env; SB3's "
            "stable_baselines3.common.env_checker.check_env(env) names it), or a VecEnv wrapper changes the "
            "observations and not infos[i]['terminal_observation'] alike (change it as step_wait changes obs)."
        )


def _what(obs: Any, batch: bool = False) -> str:
    if isinstance(obs, dict):
        return f"a dict of keys {sorted(obs)}"
    shape = np.shape(obs)[1:] if batch else np.shape(obs)
    return f"{'arrays' if batch else 'an array'} of shape {shape}"
