"""SB3's action noises (``stable_baselines3.common.noise``) as JSON, for SAC's model file.

SB3 pickles ``action_noise`` into its file; covey writes the settings of SB3's own noises instead:
``NormalActionNoise``, ``OrnsteinUhlenbeckActionNoise`` and a ``VectorizedActionNoise`` of either. A noise
process's running state is not kept: ``learn`` restarts every process, in SB3 and in covey. Any other noise
(a subclass, a user's own) has no such form; ``save`` warns, and ``load(path, action_noise=...)`` gives it back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.noise import (
    ActionNoise,
    NormalActionNoise,
    OrnsteinUhlenbeckActionNoise,
    VectorizedActionNoise,
)


def noise_to_json(noise: ActionNoise | None) -> dict | None:
    """``noise``'s settings as JSON (None for no noise). Raises ``TypeError`` for a noise of another class."""
    if noise is None:
        return None
    kind = type(noise)
    if kind is NormalActionNoise:
        return {
            "class": kind.__name__,
            "mean": np.asarray(noise._mu).tolist(),
            "sigma": np.asarray(noise._sigma).tolist(),
            "dtype": np.dtype(noise._dtype).name,
        }
    if kind is OrnsteinUhlenbeckActionNoise:
        initial = noise.initial_noise
        return {
            "class": kind.__name__,
            "mean": np.asarray(noise._mu).tolist(),
            "sigma": np.asarray(noise._sigma).tolist(),
            "theta": float(noise._theta),
            "dt": float(noise._dt),
            "initial_noise": None if initial is None else np.asarray(initial).tolist(),
            "dtype": np.dtype(noise._dtype).name,
        }
    if kind is VectorizedActionNoise:
        return {"class": kind.__name__, "base_noise": noise_to_json(noise.base_noise), "n_envs": int(noise.n_envs)}
    raise TypeError(f"{kind.__module__}.{kind.__qualname__} is not one of SB3's action noises")


def noise_from_json(data: dict | None) -> ActionNoise | None:
    """The noise :func:`noise_to_json` described (None for None)."""
    if data is None:
        return None
    kind = data.get("class")
    if kind == "VectorizedActionNoise":
        return VectorizedActionNoise(noise_from_json(data["base_noise"]), int(data["n_envs"]))
    shared: dict[str, Any] = {
        "mean": np.asarray(data["mean"], dtype=np.float64),
        "sigma": np.asarray(data["sigma"], dtype=np.float64),
        "dtype": np.dtype(data.get("dtype", "float32")).type,
    }
    if kind == "NormalActionNoise":
        return NormalActionNoise(**shared)
    if kind == "OrnsteinUhlenbeckActionNoise":
        initial = data.get("initial_noise")
        return OrnsteinUhlenbeckActionNoise(  # SB3's defaults for theta and dt (a config may leave them out)
            theta=float(data.get("theta", 0.15)),
            dt=float(data.get("dt", 1e-2)),
            initial_noise=None if initial is None else np.asarray(initial, dtype=np.float64),
            **shared,
        )
    raise ValueError(f"unknown action noise {kind!r}")
