"""Memory bookkeeping for recurrent agents: the actor's and the critic's memories (kept apart), recorded at
every step of a rollout, and the fixed-length training sequences cut from it. PPO keeps one memory of
each per env; MA-POCA one actor memory per agent slot and one critic memory per group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from covey.buffers.group import GroupBatch, GroupRolloutBuffer
from covey.buffers.rollout import RolloutBatch, RolloutBuffer
from covey.buffers.sequences import cut_sequences
from covey.networks.actor_critic import Actor, Critic, actor_critic_sequences
from covey.networks.attention import POCACritic
from covey.networks.memory import State
from covey.networks.obs import batch_to_tensor

F32 = torch.float32  # the memories' and log-probs' dtype, whatever torch's default dtype is now


def _step_observations(buffer: RolloutBuffer, t: int):
    """The observations of every env at step ``t`` of ``buffer`` (a dict of them for Dict observations)."""
    observations = buffer.observations_tensor
    return {k: v[t] for k, v in observations.items()} if isinstance(observations, dict) else observations[t]


def _reset(state: State, episode_starts: np.ndarray) -> State:
    keep = torch.as_tensor(~np.asarray(episode_starts, dtype=bool), dtype=torch.float32).view(1, -1, 1)  # (1, N, 1)
    return tuple(s * keep for s in state)


class RNNStates(NamedTuple):
    """sb3-contrib's ``lstm_states`` in a recurrent PPO's callback locals: the memories after the step, the
    actor's (``pi``) as ``(1, n_envs, hidden)`` tensors; ``vf`` is None, as covey runs the critic through the
    rollout once it ends."""

    pi: tuple[torch.Tensor, ...]
    vf: tuple[torch.Tensor, ...] | None = None


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
        self.actor_states = torch.zeros(n_steps, n_envs, actor.memory.n_state, actor.memory.hidden_size, dtype=F32)
        self.critic_states = torch.zeros(n_steps, n_envs, critic.memory.n_state, critic.memory.hidden_size, dtype=F32)
        self.episode_starts = np.zeros((n_steps, n_envs), dtype=bool)
        self.sequences = Sequences(self.episode_starts, sequence_length)

    def reset_memories(self, actor: Actor, critic: Critic) -> None:
        self.actor_state = actor.memory.initial_state(self.n_envs)
        self.critic_state = critic.memory.initial_state(self.n_envs)

    @torch.no_grad()
    def act(self, actor: Actor, obs, episode_starts: np.ndarray, step: int) -> torch.Tensor:
        """Sample actions for one step of every env, carrying and recording the actor's memory."""
        self._before_step = self.actor_state
        state = _reset(self.actor_state, episode_starts)
        self.actor_states[step] = torch.stack([s[0] for s in state], dim=1)  # (N, n_state, hidden)
        self.episode_starts[step] = episode_starts
        params, self.actor_state = actor.forward_step(obs, state, torch.zeros(self.n_envs, dtype=torch.bool))
        return actor.head.sample(params)

    @torch.no_grad()
    def stop_at(self, critic: Critic, buffer: RolloutBuffer, step: int) -> None:
        """A callback stopped the rollout at ``step``, before it was stored, and training goes on from its
        observation (as SB3's ``_last_obs`` does): the actor's memory goes back to where that step found it, and
        the critic's runs through the steps stored, as the actor's did (sb3-contrib keeps both memories of the
        last completed step)."""
        self.actor_state = self._before_step
        state = self.critic_state
        no_reset = torch.zeros(self.n_envs, dtype=torch.bool)
        for t in range(step):
            state = _reset(state, self.episode_starts[t])
            obs_t = _step_observations(buffer, t)
            _, state = critic.raw_step(obs_t, state, no_reset)
        self.critic_state = state

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
            obs_t = _step_observations(buffer, t)
            raw, state = critic.raw_step(obs_t, state, no_reset)
            values.append(head.value(raw))
            if head.distributional:
                entropies.append(head.entropy(raw))
            for env_idx, final_obs in by_step.get(t, []):
                # A time limit: bootstrap from V(true final observation), with the memory the env had then.
                final = batch_to_tensor(_one(final_obs), observation_space)
                raw_final, _ = critic.raw_step(final, tuple(s[:, env_idx : env_idx + 1] for s in state), no_reset[:1])
                buffer.truncation_values[t, env_idx] = head.value(raw_final).item()
        buffer.values_tensor = torch.stack(values)  # (T, N)
        self.critic_state = state  # carried over into the next rollout
        raw_last, _ = critic.raw_step(
            batch_to_tensor(last_obs, observation_space), _reset(state, last_episode_starts), no_reset
        )
        self.sequences = Sequences(self.episode_starts, self.sequence_length)
        buffer.log_probs_tensor = self._old_log_probs(actor, buffer)
        entropy = torch.cat(entropies).mean().item() if entropies else None
        return head.value(raw_last).numpy(), entropy

    def _old_log_probs(self, actor: Actor, buffer: RolloutBuffer) -> torch.Tensor:
        """Old log-probabilities computed exactly as training computes them: over the sequences."""
        seq = self.sequences
        rows = np.arange(seq.n_sequences)
        valid = seq.valid_tensor(rows)
        obs = seq.gather(buffer.flat_observations(), rows)
        params = actor.forward_sequences(obs, seq.initial_states(self.actor_states, rows), valid)
        log_prob, _ = actor.evaluate_params(params[valid], seq.gather(buffer.flat_actions(), rows)[valid])
        out = torch.zeros(self.n_steps * self.n_envs, dtype=F32)
        out[seq.flat_index(rows)] = log_prob
        return out.reshape(self.n_steps, self.n_envs)

    def minibatches(self, batch_size: int) -> Iterator[np.ndarray]:
        return self.sequences.minibatches(batch_size)

    def outputs(
        self, actor: Actor, critic: Critic, critic_ema: Critic | None, buffer: RolloutBuffer, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, RolloutBatch]:
        """Log-probs, entropies and raw values on the real steps of sequences ``rows`` (padding masked out),
        with the matching flat batch of stored data."""
        seq = self.sequences
        valid = seq.valid_tensor(rows)
        obs = seq.gather(buffer.flat_observations(), rows)
        actions = seq.gather(buffer.flat_actions(), rows)[valid]
        critic_init = seq.initial_states(self.critic_states, rows)
        params, raw = actor_critic_sequences(
            actor, critic, obs, seq.initial_states(self.actor_states, rows), critic_init, valid
        )
        log_prob, entropy = actor.evaluate_params(params[valid], actions)
        raw = raw[valid]
        ema_raw = None
        if critic_ema is not None:
            with torch.no_grad():
                ema_raw = critic_ema.raw_sequences(obs, critic_init, valid)[valid]
        flat_idx = seq.flat_index(rows)
        n = self.n_steps * self.n_envs
        batch = RolloutBatch(
            None,
            actions,
            buffer.values_tensor.reshape(n)[flat_idx],
            buffer.log_probs_tensor.reshape(n)[flat_idx],
            buffer.advantages_tensor.reshape(n)[flat_idx],
            buffer.returns_tensor.reshape(n)[flat_idx],
        )
        return log_prob, entropy, raw, ema_raw, batch


class Sequences:
    """The fixed-length training sequences of a ``(T, N)`` rollout (see :func:`cut_sequences`) and the
    reads training needs: stored data gathered into ``(S, L, ...)``, each sequence's initial memory, and
    the flat positions of its real steps."""

    def __init__(self, episode_starts: np.ndarray, sequence_length: int) -> None:
        self.sequence_length = sequence_length
        self.n_rows = episode_starts.size
        self.index, self.valid = cut_sequences(episode_starts, sequence_length)

    @property
    def n_sequences(self) -> int:
        return len(self.index)

    def valid_tensor(self, rows: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(self.valid[rows])  # (S, L)

    def gather(self, x, rows: np.ndarray):
        """``x`` flat over the rollout ``(T * N, ...)`` (or a dict of such) -> ``(S, L, ...)``; padding reads
        step 0 (masked)."""
        idx = torch.as_tensor(np.maximum(self.index[rows], 0))
        if isinstance(x, dict):
            return {k: v[idx] for k, v in x.items()}
        return x[idx]

    def flat_index(self, rows: np.ndarray) -> torch.Tensor:
        """Positions in the flat rollout of the real steps of sequences ``rows``, in sequence order."""
        return torch.as_tensor(self.index[rows][self.valid[rows]])

    def initial_states(self, states: torch.Tensor, rows: np.ndarray) -> State:
        """The memory recorded at the first real step of every sequence: ``states`` is
        ``(T, N, [n_slots,] n_state, hidden)``; returns a state of ``(1, S [* n_slots], hidden)`` tensors."""
        flat = states.reshape(self.n_rows, *states.shape[2:])
        first = self.index[rows, self.valid[rows].argmax(axis=1)]  # first real step of each sequence
        picked = flat[torch.as_tensor(first)].reshape(-1, *states.shape[-2:])  # (S [* n_slots], n_state, hidden)
        return tuple(picked[:, i].unsqueeze(0) for i in range(picked.shape[1]))

    def minibatches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Shuffled groups of whole sequences, about ``batch_size`` real steps each (padding not counted, as
        sb3-contrib's RecurrentPPO counts a minibatch): a rollout of ``T`` real steps makes ``ceil(T /
        batch_size)`` minibatches, however short its episodes (fewer where a sequence is longer than
        ``batch_size``). A sequence goes to the minibatch in which its last real step falls."""
        order = np.random.permutation(self.n_sequences)
        ends = np.cumsum(self.valid[order].sum(axis=1))  # real steps up to each shuffled sequence
        group = (ends - 1) // max(1, batch_size)
        cuts = np.flatnonzero(np.diff(group)) + 1
        yield from np.split(order, cuts)


class GroupRecurrentRollout:
    """MA-POCA's memories: the shared actor keeps one per agent slot of every env copy, reset where an
    agent's trajectory starts (an episode start, or an agent joining the slot) so a dead agent's memory is
    never passed on; the attention critic keeps one per copy after pooling, advanced by the value path and
    read by the baselines. Both are recorded before every step; training runs sequences of group-steps
    cut per copy at its episode starts.
    """

    def __init__(
        self, actor: Actor, critic: POCACritic, n_steps: int, n_envs: int, n_slots: int, sequence_length: int
    ) -> None:
        self.n_steps, self.n_envs, self.n_slots = n_steps, n_envs, n_slots
        self.sequence_length = sequence_length
        self.reset_memories(actor, critic)
        self.actor_states = torch.zeros(
            n_steps, n_envs, n_slots, actor.memory.n_state, actor.memory.hidden_size, dtype=F32
        )
        self.critic_states = torch.zeros(n_steps, n_envs, critic.memory.n_state, critic.memory.hidden_size, dtype=F32)
        self.episode_starts = np.zeros((n_steps, n_envs), dtype=bool)
        self.slot_starts = np.zeros((n_steps, n_envs, n_slots), dtype=bool)
        self.sequences = Sequences(self.episode_starts, sequence_length)

    def reset_memories(self, actor: Actor, critic: POCACritic) -> None:
        self.actor_state = actor.memory.initial_state(self.n_envs * self.n_slots)
        self.critic_state = critic.memory.initial_state(self.n_envs)

    @torch.no_grad()
    def act(
        self, actor: Actor, obs: torch.Tensor, episode_starts: np.ndarray, slot_starts: np.ndarray, step: int
    ) -> torch.Tensor:
        """Sample actions for every slot ``obs`` ``(E * S, ...)``, carrying and recording the slots' memories
        (reset first where ``slot_starts`` ``(E, S)``)."""
        self._before_step = self.actor_state
        state = _reset(self.actor_state, slot_starts.reshape(-1))
        self.actor_states[step] = torch.stack([s[0] for s in state], dim=1).reshape(self.actor_states.shape[1:])
        self.episode_starts[step] = episode_starts
        self.slot_starts[step] = slot_starts
        params, self.actor_state = actor.forward_step(obs, state, torch.zeros(obs.shape[0], dtype=torch.bool))
        return actor.head.sample(params)

    @torch.no_grad()
    def stop_at(self, critic: POCACritic, buf: GroupRolloutBuffer, step: int) -> None:
        """The rollout stopped at ``step`` (a callback's stop, an exception or an interrupt), before it was
        stored, and training goes on from its observations: the slots' memories go back to where that step found
        them, and the critic's runs through the steps stored, as :meth:`RecurrentRollout.stop_at` does."""
        self.actor_state = self._before_step
        if step == 0:
            return
        rows = step * self.n_envs
        obs, actions, present = (
            buf.flat(x)[:rows] for x in (buf.observations_tensor, buf.actions_tensor, buf.present_tensor)
        )
        pooled = critic.pooled(obs, actions, present)[0].reshape(step, self.n_envs, -1)
        _, finished = critic.memory.run(
            pooled.transpose(0, 1),
            self.critic_state,
            torch.ones(self.n_envs, step, dtype=torch.bool),
            torch.as_tensor(self.episode_starts[:step].T),
        )  # each (E, step, hidden)
        self.critic_state = tuple(x[:, -1][None].contiguous() for x in finished)

    @torch.no_grad()
    def evaluate(
        self,
        actor: Actor,
        critic: POCACritic,
        buf: GroupRolloutBuffer,
        last_obs: torch.Tensor,
        last_present: torch.Tensor,
        last_episode_starts: np.ndarray,
        chunked,
    ) -> tuple[np.ndarray, float | None]:
        """Run the critic's memory through the rollout from where it was (batched over copies), recording
        it; fill values, continuing values (from the memory after each step), baselines and old
        log-probs. Returns V(last observations) per copy and the two-hot value entropy (or None)."""
        memory, head = critic.memory, critic.value_head
        obs, actions, present = (
            buf.flat(buf.observations_tensor),
            buf.flat(buf.actions_tensor),
            buf.flat(buf.present_tensor),
        )
        time_major = (self.n_steps, self.n_envs)
        pooled, pooled_baseline = chunked(critic.pooled, obs, actions, present)
        pooled = pooled.reshape(*time_major, -1)
        started, finished = memory.run(
            pooled.transpose(0, 1),
            self.critic_state,
            torch.ones(self.n_envs, self.n_steps, dtype=torch.bool),
            torch.as_tensor(self.episode_starts.T),
        )  # each (E, T, hidden)

        def flat_states(states) -> tuple[torch.Tensor, ...]:
            return tuple(x.transpose(0, 1).reshape(1, -1, x.shape[-1]) for x in states)  # (1, T * E, hidden)

        self.critic_states = torch.stack([x.transpose(0, 1) for x in started], dim=2)  # (T, E, n_state, hidden)
        raw = critic.head(finished[0].transpose(0, 1))  # (T, E[, K])
        entropy = head.entropy(raw).mean().item() if head.distributional else None
        buf.values_tensor = head.value(raw)
        before, after = flat_states(started), flat_states(finished)
        buf.baselines_tensor = head.value(critic.read(pooled_baseline, before)).reshape(*time_major, self.n_slots)
        # An agent that leaves bootstraps from the group it leaves, as the memory knows it after the step.
        pooled_continuing = chunked(critic.pooled_value, buf.flat(buf.continuing_obs), buf.flat(buf.continuing_present))
        buf.continuing_values = head.value(critic.read(pooled_continuing, after)).reshape(time_major)
        self.critic_state = tuple(x[:, -1].unsqueeze(0) for x in finished)  # carried into the next rollout
        last = critic.read(critic.pooled_value(last_obs, last_present), _reset(self.critic_state, last_episode_starts))
        self.sequences = Sequences(self.episode_starts, self.sequence_length)
        seq = self.sequences
        rows = np.arange(seq.n_sequences)
        log_prob, _, mask = self._actor_outputs(actor, buf, rows)
        full = torch.zeros(seq.n_sequences, self.sequence_length, self.n_slots, dtype=F32)
        full[mask] = log_prob
        out = torch.zeros(self.n_steps * self.n_envs, self.n_slots, dtype=F32)
        out[seq.flat_index(rows)] = full[seq.valid_tensor(rows)]
        buf.log_probs_tensor = out.reshape(*time_major, self.n_slots)
        return head.value(last).numpy(), entropy

    def _actor_outputs(
        self, actor: Actor, buf: GroupRolloutBuffer, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of the present agents on the real steps of sequences ``rows`` (in
        ``(sequence, step, slot)`` order), and that mask ``(S, L, n_slots)``: each slot is its own sequence,
        reset where its agent's trajectory starts."""
        seq = self.sequences
        valid = seq.valid_tensor(rows)
        s, length, n = len(rows), self.sequence_length, self.n_slots
        mask = valid[..., None] & seq.gather(buf.flat(buf.present_tensor), rows)  # (S, L, n)

        def per_slot(x: torch.Tensor) -> torch.Tensor:  # (S, L, n, ...) -> (S * n, L, ...)
            return x.transpose(1, 2).reshape(s * n, length, *x.shape[3:])

        obs = per_slot(seq.gather(buf.flat(buf.observations_tensor), rows))
        resets = per_slot(seq.gather(torch.as_tensor(self.slot_starts.reshape(-1, n)), rows))
        initial = seq.initial_states(self.actor_states, rows)  # (1, S * n, hidden)
        params = actor.forward_sequences(obs, initial, per_slot(mask), resets)  # (S * n, L, P)
        params = params.reshape(s, n, length, -1).transpose(1, 2)  # (S, L, n, P)
        actions = seq.gather(buf.flat(buf.actions_tensor), rows)
        log_prob, entropy = actor.evaluate_params(params[mask], actions[mask])
        return log_prob, entropy, mask

    def outputs(
        self,
        actor: Actor,
        critic: POCACritic,
        critic_ema: POCACritic | None,
        buf: GroupRolloutBuffer,
        rows: np.ndarray,
    ):
        """What MA-POCA's objective needs for the sequences ``rows``: log-probs and entropies of the present
        agent-steps, raw values ``(B[, K])`` and baselines ``(B, n_slots[, K])`` of the ``B`` real
        group-steps, the EMA critic's (or None), and the matching :class:`GroupBatch` of stored data."""
        seq = self.sequences
        valid = seq.valid_tensor(rows)
        log_prob, entropy, mask = self._actor_outputs(actor, buf, rows)
        obs = seq.gather(buf.flat(buf.observations_tensor), rows)
        actions = seq.gather(buf.flat(buf.actions_tensor), rows)
        initial = seq.initial_states(self.critic_states, rows)
        raw_value, raw_baseline = critic.raw_sequences(obs, actions, mask, initial, valid)
        ema = None
        if critic_ema is not None:
            with torch.no_grad():
                ema_value, ema_baseline = critic_ema.raw_sequences(obs, actions, mask, initial, valid)
            ema = (ema_value[valid], ema_baseline[valid])
        idx = seq.flat_index(rows)
        batch = GroupBatch(
            None,
            buf.flat(buf.actions_tensor)[idx],
            buf.flat(buf.present_tensor)[idx],
            buf.flat(buf.log_probs_tensor)[idx],
            buf.flat(buf.values_tensor)[idx],
            buf.flat(buf.baselines_tensor)[idx],
            buf.flat(buf.advantages_tensor)[idx],
            buf.flat(buf.returns_tensor)[idx],
        )
        return log_prob, entropy, raw_value[valid], raw_baseline[valid], ema, batch

    def minibatches(self, batch_size: int) -> Iterator[np.ndarray]:
        return self.sequences.minibatches(batch_size)


def _one(obs):
    if isinstance(obs, dict):
        return {k: np.asarray(v)[None] for k, v in obs.items()}
    return np.asarray(obs)[None]
