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


def group_lambda_returns(
    rewards: np.ndarray,
    values: np.ndarray,
    last_values: np.ndarray,
    ended: np.ndarray,
    bootstrap: np.ndarray,
    gamma: float,
    gae_lambda: float,
    present: np.ndarray | None = None,
    continues: np.ndarray | None = None,
) -> np.ndarray:
    """MA-POCA's lambda-returns for every agent slot, from the group's centralized value.

    Shapes: ``rewards``, ``ended``, ``bootstrap``, ``present`` ``(T, N, S)`` (time, env copies, agent slots);
    ``values`` ``(T, N)``: V of the group state each step; ``last_values`` ``(N,)``: V after the last step;
    ``continues`` ``(T, N)``: the group goes on after step t, in the same episode (some agent is there at t + 1,
    one that stays or one that joins), given with ``present``.

    Inside an agent's trajectory::

        G_t = r_t + gamma * (gae_lambda * G_{t+1} + (1 - gae_lambda) * V_{t+1})

    and the rollout's last step uses ``G_T = V_T = last_values``. ``ended[t]`` marks the last step of an
    agent's trajectory (it left the group, or the episode ended). Where the whole group ends (``continues``
    false, or not given) the return is ``r + gamma * bootstrap``: ``bootstrap`` is 0 for a true terminal and
    the value of the final state for a truncation. An agent that leaves while the group goes on gets
    posthumous credit: its return follows the group's on, with the value of the state it leaves the group in
    (``bootstrap``: its final observation and the agents still there) for ``V_{t+1}`` and the mean return of
    the agents present at ``t + 1`` (``last_values`` after the rollout's last step) for ``G_{t+1}``. So the
    team rewards that come after it left reach it as they reach its groupmates, weighted by ``gae_lambda``,
    where a bootstrap alone gives only what the critic can read from the state it left. Entries of absent
    slots are meaningless.

    >>> r = np.ones((2, 1, 1)); v = np.zeros((2, 1)); no = np.zeros((2, 1, 1), bool)
    >>> group_lambda_returns(r, v, np.zeros(1), no, np.zeros((2, 1, 1)), 0.5, 1.0)[:, 0, 0].tolist()
    [1.5, 1.0]
    """
    if continues is not None and present is None:
        raise ValueError("continues needs present: the agents whose mean return a leaver's return follows.")
    rewards = np.asarray(rewards, dtype=np.float64)
    n_steps = rewards.shape[0]
    returns = np.zeros_like(rewards)
    last = np.asarray(last_values, dtype=np.float64)
    next_return = np.broadcast_to(last[:, None], rewards.shape[1:])
    for t in reversed(range(n_steps)):
        next_value = (values[t + 1] if t + 1 < n_steps else last_values)[:, None]  # (N, 1)
        continuing = rewards[t] + gamma * (gae_lambda * next_return + (1.0 - gae_lambda) * next_value)
        # An agent whose trajectory ends here bootstraps from the state it leaves (0 only at a group terminal).
        leaving = rewards[t] + gamma * bootstrap[t]
        if continues is not None and (ended[t] & continues[t][:, None]).any():  # someone left a group that goes on
            if t + 1 < n_steps:  # the group's return from t + 1: the mean over the agents present then
                weights = np.asarray(present[t + 1], dtype=np.float64)
                count = weights.sum(axis=-1)
                group_next = np.where(count > 0, (next_return * weights).sum(axis=-1) / np.maximum(count, 1), 0.0)
            else:
                group_next = last
            on = rewards[t] + gamma * (gae_lambda * group_next[:, None] + (1.0 - gae_lambda) * bootstrap[t])
            leaving = np.where(continues[t][:, None], on, leaving)
        returns[t] = np.where(ended[t], leaving, continuing)
        next_return = returns[t]
    return returns
