"""Memory bookkeeping for recurrent PPO: the actor's and the critic's memories (kept apart), recorded at
every step of a rollout, and the fixed-length training sequences cut from it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from covey.buffers.rollout import RolloutBatch, RolloutBuffer
from covey.buffers.sequences import cut_sequences
from covey.networks.actor_critic import Actor, Critic
from covey.networks.memory import State
from covey.networks.obs import batch_to_tensor


def _reset(state: State, episode_starts: np.ndarray) -> State:
    keep = torch.as_tensor(~episode_starts, dtype=torch.float32).view(1, -1, 1)  # (1, N, 1)
    return tuple(s * keep for s in state)


class RecurrentRollout:
    """Per env: the actor's memory while acting and the critic's memory while evaluating, both recorded
    before every step (after the reset at an episode start), so each training sequence can start from the
    memory its first step really had.

    >>> # used by PPO when the policy has memory, e.g. PPO("MlpLstmPolicy", env)
    """

    def __init__(self, actor: Actor, critic: Critic, n_steps: int, n_envs: int, sequence_length: int) -> None:
        self.sequence_length = sequence_length
        self.n_steps, self.n_envs = n_steps, n_envs
        self.actor_state = actor.memory.initial_state(n_envs)
        self.critic_state = critic.memory.initial_state(n_envs)
        self.actor_states = torch.zeros(n_steps, n_envs, actor.memory.n_state, actor.memory.hidden_size)
        self.critic_states = torch.zeros(n_steps, n_envs, critic.memory.n_state, critic.memory.hidden_size)
        self.episode_starts = np.zeros((n_steps, n_envs), dtype=bool)
        self.index = np.zeros((0, sequence_length), dtype=np.int64)
        self.valid = np.zeros((0, sequence_length), dtype=bool)

    def reset_memories(self, actor: Actor, critic: Critic) -> None:
        self.actor_state = actor.memory.initial_state(self.n_envs)
        self.critic_state = critic.memory.initial_state(self.n_envs)

    @torch.no_grad()
    def act(self, actor: Actor, obs, episode_starts: np.ndarray, step: int) -> torch.Tensor:
        """Sample actions for one step of every env, carrying and recording the actor's memory."""
        state = _reset(self.actor_state, episode_starts)
        self.actor_states[step] = torch.stack([s[0] for s in state], dim=1)  # (N, n_state, hidden)
        self.episode_starts[step] = episode_starts
        params, self.actor_state = actor.forward_step(obs, state, torch.zeros(self.n_envs, dtype=torch.bool))
        return actor.head.sample(params)

    @torch.no_grad()
    def evaluate(
        self,
        actor: Actor,
        critic: Critic,
        buffer: RolloutBuffer,
        last_obs: Any,
        last_episode_starts: np.ndarray,
        truncations: list[tuple[int, int, Any]],
        observation_space,
    ) -> tuple[np.ndarray, float | None]:
        """Run the critic through the rollout step by step (batched over envs) from the memory it carried
        over, recording its memory at every step; fill values, truncation bootstraps and old log-probs.
        Returns V(last observation) per env and the mean entropy of a two-hot value head (or None)."""
        head = critic.value_head
        by_step: dict[int, list[tuple[int, Any]]] = {}
        for step, env_idx, final_obs in truncations:
            by_step.setdefault(step, []).append((env_idx, final_obs))
        no_reset = torch.zeros(self.n_envs, dtype=torch.bool)
        state = self.critic_state
        self._start_critic_state = state  # the memory the critic carried into this rollout
        values, entropies = [], []
        for t in range(self.n_steps):
            state = _reset(state, self.episode_starts[t])
            self.critic_states[t] = torch.stack([s[0] for s in state], dim=1)
            obs_t = (
                {k: v[t] for k, v in buffer.observations.items()}
                if isinstance(buffer.observations, dict)
                else buffer.observations[t]
            )
            raw, state = critic.raw_step(obs_t, state, no_reset)
            values.append(head.value(raw))
            if head.distributional:
                entropies.append(head.entropy(raw))
            for env_idx, final_obs in by_step.get(t, []):
                # A time limit: bootstrap from V(true final observation), with the memory the env had then.
                final = batch_to_tensor(_one(final_obs), observation_space)
                raw_final, _ = critic.raw_step(final, tuple(s[:, env_idx : env_idx + 1] for s in state), no_reset[:1])
                buffer.truncation_values[t, env_idx] = head.value(raw_final).item()
        buffer.values = torch.stack(values)  # (T, N)
        self.critic_state = state  # carried over into the next rollout
        raw_last, _ = critic.raw_step(
            batch_to_tensor(last_obs, observation_space), _reset(state, last_episode_starts), no_reset
        )
        self.index, self.valid = cut_sequences(self.episode_starts, self.sequence_length)
        buffer.log_probs = self._old_log_probs(actor, buffer)
        entropy = torch.cat(entropies).mean().item() if entropies else None
        return head.value(raw_last).numpy(), entropy

    def _initial_states(self, states: torch.Tensor, rows: np.ndarray) -> State:
        flat = states.reshape(self.n_steps * self.n_envs, *states.shape[2:])  # (T * N, n_state, hidden)
        first = self.index[rows, self.valid[rows].argmax(axis=1)]  # first real step of each sequence
        picked = flat[torch.as_tensor(first)]  # (S, n_state, hidden)
        return tuple(picked[:, i].unsqueeze(0) for i in range(picked.shape[1]))  # each (1, S, hidden)

    def _gather(self, x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        idx = torch.as_tensor(np.maximum(self.index[rows], 0))  # padding reads step 0; it is masked
        return x[idx]  # (S, L, ...)

    def _old_log_probs(self, actor: Actor, buffer: RolloutBuffer) -> torch.Tensor:
        """Old log-probabilities computed exactly as training computes them: over the sequences."""
        rows = np.arange(len(self.index))
        obs, actions = buffer.flat_observations(), buffer.flat_actions()
        valid = torch.as_tensor(self.valid[rows])
        params = actor.forward_sequences(self._gather(obs, rows), self._initial_states(self.actor_states, rows), valid)
        log_prob, _ = actor.evaluate_params(params[valid], self._gather(actions, rows)[valid])
        out = torch.zeros(self.n_steps * self.n_envs)
        out[torch.as_tensor(self.index[rows][self.valid[rows]])] = log_prob
        return out.reshape(self.n_steps, self.n_envs)

    def minibatches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Shuffled groups of whole sequences, about ``batch_size`` steps each."""
        per_batch = max(1, batch_size // self.sequence_length)
        order = np.random.permutation(len(self.index))
        for start in range(0, len(order), per_batch):
            yield order[start : start + per_batch]

    def outputs(
        self, actor: Actor, critic: Critic, critic_ema: Critic | None, buffer: RolloutBuffer, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, RolloutBatch]:
        """Log-probs, entropies and raw values on the real steps of sequences ``rows`` (padding masked out),
        with the matching flat batch of stored data."""
        valid = torch.as_tensor(self.valid[rows])
        obs = self._gather(buffer.flat_observations(), rows)
        actions = self._gather(buffer.flat_actions(), rows)[valid]
        params = actor.forward_sequences(obs, self._initial_states(self.actor_states, rows), valid)
        log_prob, entropy = actor.evaluate_params(params[valid], actions)
        critic_init = self._initial_states(self.critic_states, rows)
        raw = critic.raw_sequences(obs, critic_init, valid)[valid]
        ema_raw = None
        if critic_ema is not None:
            with torch.no_grad():
                ema_raw = critic_ema.raw_sequences(obs, critic_init, valid)[valid]
        flat_idx = torch.as_tensor(self.index[rows][self.valid[rows]])
        n = self.n_steps * self.n_envs
        batch = RolloutBatch(
            None,
            actions,
            buffer.values.reshape(n)[flat_idx],
            buffer.log_probs.reshape(n)[flat_idx],
            buffer.advantages.reshape(n)[flat_idx],
            buffer.returns.reshape(n)[flat_idx],
        )
        return log_prob, entropy, raw, ema_raw, batch


def _one(obs):
    if isinstance(obs, dict):
        return {k: np.asarray(v)[None] for k, v in obs.items()}
    return np.asarray(obs)[None]
