"""MA-POCA's group rollout buffer: ``(n_steps, n_envs, n_slots, ...)`` with a presence mask."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from covey.buffers.returns import group_lambda_returns
from covey.buffers.rollout import action_storage
from covey.networks.encoders import obs_dtype


class GroupBatch(NamedTuple):
    """A minibatch of group-steps; every field is ``(B, n_slots, ...)`` except ``old_values`` ``(B,)``."""

    observations: torch.Tensor
    actions: torch.Tensor
    present: torch.Tensor
    old_log_prob: torch.Tensor
    old_values: torch.Tensor
    old_baselines: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def _numpy_view(tensor: str) -> property:
    """A read-only attribute: the buffer's tensor ``tensor`` as a NumPy array sharing its memory."""
    return property(lambda self: getattr(self, tensor).numpy(), doc=f"``{tensor}`` as a NumPy array (a view).")


class GroupRolloutBuffer:
    """One rollout of a group: each step stores every slot's observation and action, which slots were
    present, their rewards, whose trajectory ended, and the state the group continues from.

    For every agent-step it yields, through the group's arrays, the groupmates' observations and actions
    and the presence mask the critic needs.
    """

    def __init__(
        self,
        n_steps: int,
        n_envs: int,
        n_slots: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
    ) -> None:
        self.n_steps, self.n_envs, self.n_slots = n_steps, n_envs, n_slots
        self.device = torch.device("cpu")  # POCA runs on the CPU only; SB3's buffers name their device
        lead = (n_steps, n_envs, n_slots)
        # The group's arrays are torch tensors (``*_tensor``); SB3's names read them as NumPy arrays (views).
        self.observations_tensor = torch.zeros((*lead, *observation_space.shape), dtype=obs_dtype(observation_space))
        act_shape, act_dtype = action_storage(action_space)
        self.actions_tensor = torch.zeros((*lead, *act_shape), dtype=act_dtype)
        self.present_tensor = torch.zeros(lead, dtype=torch.bool)
        # The state each group continues from after a step where some agents left (their final
        # observations plus the agents still there): the posthumous bootstrap.
        self.continuing_obs = torch.zeros_like(self.observations_tensor)
        self.continuing_present = torch.zeros(lead, dtype=torch.bool)
        self.rewards = np.zeros(lead, dtype=np.float32)
        self.ended = np.zeros(lead, dtype=bool)
        self.group_terminal = np.zeros((n_steps, n_envs), dtype=bool)
        self.values_tensor = torch.zeros((n_steps, n_envs), dtype=torch.float32)
        self.continuing_values = torch.zeros((n_steps, n_envs), dtype=torch.float32)
        self.baselines_tensor = torch.zeros(lead, dtype=torch.float32)
        self.log_probs_tensor = torch.zeros(lead, dtype=torch.float32)
        self.returns_tensor = torch.zeros(lead, dtype=torch.float32)
        self.advantages_tensor = torch.zeros(lead, dtype=torch.float32)
        self.gamma, self.gae_lambda = 0.99, 0.95  # those of the last compute_returns
        self.pos = 0
        self.td_error_abs = 0.0

    # SB3's names, as NumPy arrays over the tensors (the buffer lives on the CPU): ``(n_steps, n_envs, n_slots,
    # ...)``, ``values`` ``(n_steps, n_envs)`` (the group's). An in-place edit reaches the update.
    observations = _numpy_view("observations_tensor")
    actions = _numpy_view("actions_tensor")
    present = _numpy_view("present_tensor")
    values = _numpy_view("values_tensor")
    baselines = _numpy_view("baselines_tensor")
    log_probs = _numpy_view("log_probs_tensor")
    returns = _numpy_view("returns_tensor")
    advantages = _numpy_view("advantages_tensor")

    @property
    def buffer_size(self) -> int:
        """SB3's name for the steps per env copy in a rollout."""
        return self.n_steps

    def reset(self) -> None:
        self.pos = 0

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        present: np.ndarray,
        rewards: np.ndarray,
        ended: np.ndarray,
        group_terminal: np.ndarray,
        continuing_obs: np.ndarray,
        continuing_present: np.ndarray,
    ) -> None:
        t = self.pos
        self.observations_tensor[t] = obs
        self.actions_tensor[t] = actions.reshape(self.actions_tensor.shape[1:])
        self.present_tensor[t] = torch.as_tensor(present)
        self.rewards[t] = rewards
        self.ended[t] = ended
        self.group_terminal[t] = group_terminal
        self.continuing_obs[t] = torch.as_tensor(continuing_obs)
        self.continuing_present[t] = torch.as_tensor(continuing_present)
        self.pos += 1

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """``(n_steps, n_envs, ...)`` -> ``(n_steps * n_envs, ...)``: one row per group-step."""
        return x.reshape(self.n_steps * self.n_envs, *x.shape[2:])

    def compute_returns(self, last_values: np.ndarray, gamma: float, gae_lambda: float) -> None:
        """Lambda-returns from the centralized value and advantages against the per-agent baselines."""
        # A true terminal of the whole group has no future; any other end of an agent's trajectory
        # (leaving early while the group goes on, or a time limit) bootstraps from the group it leaves.
        bootstrap = np.where(self.group_terminal[..., None], 0.0, self.continuing_values.numpy()[..., None])
        bootstrap = np.broadcast_to(bootstrap, self.rewards.shape)
        self.gamma, self.gae_lambda = gamma, gae_lambda
        # The group goes on after a step where some agent is there after it, in the same episode (one that stays or
        # one that joins): leavers' returns follow it on.
        continues = (self.continuing_present.numpy() & ~self.ended).any(axis=-1) & ~self.group_terminal
        returns = group_lambda_returns(
            self.rewards, self.values, last_values, self.ended, bootstrap, gamma, gae_lambda, self.present, continues
        )
        self.returns_tensor = torch.as_tensor(returns, dtype=torch.float32)
        # Diagnostic: mean absolute one-step TD error of the group value over present agent-steps.
        values = self.values
        next_values = np.concatenate([values[1:], np.asarray(last_values)[None]], axis=0)[..., None]
        next_values = np.where(self.ended, bootstrap, next_values)
        td = self.rewards + gamma * next_values - values[..., None]
        present = self.present
        self.td_error_abs = float(np.abs(td[present]).mean()) if present.any() else 0.0
        # The advantage of agent i: its return minus the counterfactual baseline of its own action.
        self.advantages_tensor = (self.returns_tensor - self.baselines_tensor) * self.present_tensor

    def minibatches(self, batch_size: int) -> Iterator[GroupBatch]:
        """Shuffled minibatches of whole group-steps (all slots of a step stay together)."""
        n = self.n_steps * self.n_envs
        fields = [
            self.flat(x)
            for x in (
                self.observations_tensor,
                self.actions_tensor,
                self.present_tensor,
                self.log_probs_tensor,
                self.values_tensor,
                self.baselines_tensor,
                self.advantages_tensor,
                self.returns_tensor,
            )
        ]
        if batch_size >= n:
            yield GroupBatch(*fields)
            return
        perm = torch.randperm(n)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            yield GroupBatch(*(x[idx] for x in fields))
