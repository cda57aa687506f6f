"""The check that keeps NaN and infinite numbers from an env out of training."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


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
