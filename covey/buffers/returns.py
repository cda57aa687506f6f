"""Returns maths as pure functions over arrays ``(T, N)``: time first, environments second."""

from __future__ import annotations

import numpy as np


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016) in one reversed pass.

    ``next_values[t]`` is V(s_{t+1}) for the transition at t: the next step's value inside an
    episode and, at a truncation, the value of the true final observation (not the reset one).
    ``terminated[t]`` cuts the bootstrap (no future); ``dones[t]`` (terminated or truncated) cuts
    the accumulation of advantages across the episode boundary.

    Returns ``(advantages, returns)`` with ``returns = advantages + values``.

    >>> adv, ret = gae(np.ones((2, 1)), np.zeros((2, 1)), np.zeros((2, 1)),
    ...                np.zeros((2, 1), bool), np.zeros((2, 1), bool), 0.5, 1.0)
    >>> adv[:, 0].tolist()
    [1.5, 1.0]
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    # Termination: the next state has no value. Truncation keeps the bootstrap from next_values.
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    # Any episode end stops the advantage from flowing back across the boundary.
    decay = gamma * gae_lambda * (1.0 - dones)
    advantages = np.zeros_like(deltas)
    running = np.zeros(deltas.shape[1:])
    for t in reversed(range(deltas.shape[0])):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    return advantages, advantages + values
