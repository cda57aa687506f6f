"""The off-policy replay buffer: pre-allocated circular storage ``(capacity, n_envs, ...)``."""

from __future__ import annotations

import contextlib
import os
import pathlib
import zipfile
import zlib
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples

from covey.files import require_binary, write_atomically
from covey.networks.obs import ObsTensor, batch_to_tensor


def buffer_path(path: str | os.PathLike) -> pathlib.Path:
    """Where a replay buffer saved to ``path`` goes: ``.pkl`` added when it has no suffix, as in SB3."""
    path = pathlib.Path(path)
    return path.with_name(path.name + ".pkl") if path.suffix == "" else path


class ReplayBatch(NamedTuple):
    """A sampled minibatch of transitions (tensors)."""

    observations: ObsTensor
    actions: torch.Tensor
    next_observations: ObsTensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    discounts: torch.Tensor | None = None
    """With n-step returns: ``gamma ** k`` per sample, ``k`` the steps its return sums (None: one step)."""


def fill_rows(target: np.ndarray, rows: np.ndarray) -> None:
    """``target``'s leading rows from a file's ``rows``, zeros after them."""
    target[: len(rows)] = rows
    target[len(rows) :] = 0


def _obs_spaces(space: spaces.Space) -> dict[str | None, spaces.Space]:
    return dict(space.spaces) if isinstance(space, spaces.Dict) else {None: space}


class ReplayBuffer:
    """Transitions of ``n_envs`` envs in a ring of ``buffer_size // n_envs`` rows.

    The bootstrap mask is ``terminated`` (not ``truncated``): a time limit still has a future.
    ``next_observations`` at an episode end is the true final observation, not the reset one.
    With ``optimize_memory_usage`` next observations are not stored twice: the next row's observation
    serves, and the final observations of episode ends are kept aside.
    With ``n_steps > 1`` a sample's reward is the discounted sum of up to ``n_steps`` rewards of its env, cut at
    the episode's end and at the newest stored step (as SB3's ``NStepReplayBuffer`` samples), its next
    observation and bootstrap mask those of the last step summed, and ``discounts`` ``gamma ** steps summed``.

    >>> buf = ReplayBuffer(100, spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,)), n_envs=2)
    >>> buf.observations.shape
    (50, 2, 3)
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        device: torch.device | str = "cpu",
        n_steps: int = 1,
        gamma: float = 0.99,
        handle_timeout_termination: bool = True,
    ) -> None:
        if buffer_size < n_envs:
            raise ValueError(f"buffer_size={buffer_size} must be at least n_envs={n_envs}.")
        if optimize_memory_usage and buffer_size < 2 * n_envs:
            raise ValueError(
                f"buffer_size={buffer_size} with optimize_memory_usage=True must be at least 2 * n_envs = "
                f"{2 * n_envs}: a step's next observation is the next row's, so one row per env leaves nothing to "
                "sample. Use a larger buffer_size."
            )
        if n_steps > 1 and optimize_memory_usage:
            raise NotImplementedError(
                "n-step returns need each step's next observation stored: use n_steps=1 or optimize_memory_usage=False."
            )
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.capacity = buffer_size // n_envs
        self.n_envs = n_envs
        self.observation_space, self.action_space = observation_space, action_space
        self.optimize_memory_usage = optimize_memory_usage
        self.device = torch.device(device)
        self.spaces = _obs_spaces(observation_space)
        lead = (self.capacity, n_envs)
        # np.zeros, as SB3's buffers: the memory is taken as the buffer fills (np.zeros_like writes every page
        # at once, about 1.5 GB for a million Humanoid-sized observations before the first step)
        self._obs = {k: np.zeros((*lead, *s.shape), dtype=s.dtype) for k, s in self.spaces.items()}
        self._next_obs = (
            None if optimize_memory_usage else {k: np.zeros(v.shape, v.dtype) for k, v in self._obs.items()}
        )
        self.final_observations: dict[tuple[int, int], dict] = {}  # (row, env) -> final obs (memory mode)
        if isinstance(action_space, spaces.Discrete):
            self.actions = np.zeros(lead, dtype=np.int64)
        else:
            self.actions = np.zeros((*lead, int(np.prod(action_space.shape))), dtype=np.float32)
        self.rewards = np.zeros(lead, dtype=np.float32)
        self.terminated = np.zeros(lead, dtype=np.float32)
        self.dones = np.zeros(lead, dtype=bool)
        self.pos = 0
        self.full = False

    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:
        """Stored observations in SB3's layout: ``(capacity, n_envs, *obs_shape)`` (``obs_shape`` ``(1,)`` for a
        Discrete space, as SB3's), a dict of such arrays for a Dict space; views of the stored arrays."""
        return self._sb3_layout(self._obs)

    @property
    def next_observations(self) -> np.ndarray | dict[str, np.ndarray] | None:
        """The observations after each stored step, as :attr:`observations` (None with ``optimize_memory_usage``,
        as in SB3)."""
        if self._next_obs is None:
            return None
        return self._sb3_layout(self._next_obs)

    def _sb3_layout(self, stored: dict) -> np.ndarray | dict[str, np.ndarray]:
        arrays = {k: v[..., None] if isinstance(self.spaces[k], spaces.Discrete) else v for k, v in stored.items()}
        return arrays[None] if None in arrays else arrays

    @property
    def timeouts(self) -> np.ndarray:
        """SB3's array of time-limit ends ``(buffer_size, n_envs)``: 1.0 where an episode ended without
        terminating (kept as ``dones`` and ``terminated``; a new array, not a view)."""
        return (self.dones & (self.terminated == 0)).astype(np.float32)

    @property
    def buffer_size(self) -> int:
        """Rows of the ring, as SB3 names them (``buffer_size // n_envs`` of the argument)."""
        return self.capacity

    def size(self) -> int:
        """Steps stored per env, as SB3's ``size()`` counts them (transitions: ``size() * n_envs``)."""
        return self.capacity if self.full else self.pos

    def reset(self) -> None:
        """Forget every stored step, as SB3's ``reset()``: the ring is empty and fills from row 0."""
        self.pos, self.full = 0, False
        self.final_observations.clear()

    @property
    def obs_shape(self) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
        """SB3's observation shape (``(1,)`` for Discrete; a dict of shapes for Dict spaces)."""
        return get_obs_shape(self.observation_space)

    @property
    def action_dim(self) -> int:
        """SB3's number of action components (1 for Discrete)."""
        return get_action_dim(self.action_space)

    def add(self, obs, next_obs, action: np.ndarray, reward: np.ndarray, done: np.ndarray, infos: list[dict]) -> None:
        """SB3's ``add``, with its arguments: one step of every env, ``next_obs`` holding the true final
        observation where ``done``. A ``done`` whose info says ``"TimeLimit.truncated"`` keeps its bootstrap
        unless ``handle_timeout_termination=False``, as in SB3. ``action`` is what the buffer stores: for Box
        actions the policy's ``[-1, 1]`` scale (``model.policy.scale_action(env_action)``), as SB3's SAC stores."""
        done = np.asarray(done, dtype=bool).reshape(self.n_envs)
        if len(infos) != self.n_envs:
            raise ValueError(
                f"add() got {len(infos)} infos for {self.n_envs} envs: pass the step's list of info dicts, one per env."
            )
        terminated = done.copy()
        if self.handle_timeout_termination:
            terminated &= ~np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        self.store(obs, next_obs, action, reward, terminated, done, infos)

    def store(
        self,
        obs,
        next_obs,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        dones: np.ndarray,
        infos: list[dict] | None = None,
    ) -> None:
        """Store one step of every env with its bootstrap mask: ``terminated`` (no future), ``dones`` (the
        episode ended, by ``terminated`` or a time limit), ``next_obs`` the true final observation where
        ``dones``. ``infos`` are kept only by buffers that use them (hindsight replay)."""
        row = self.pos
        for key in self.spaces:
            self._obs[key][row] = obs if key is None else obs[key]
            if self._next_obs is not None:
                self._next_obs[key][row] = next_obs if key is None else next_obs[key]
        if self.optimize_memory_usage:
            for env in range(self.n_envs):
                self.final_observations.pop((row, env), None)
            for env in np.flatnonzero(dones):
                self.final_observations[(row, int(env))] = self._one_env(next_obs, env)
        self.actions[row] = np.asarray(actions).reshape(self.actions.shape[1:])
        self.rewards[row] = rewards
        self.terminated[row] = terminated
        self.dones[row] = dones
        self.pos = (self.pos + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def end_episodes(self, next_obs: Any = None) -> None:
        """End the episodes running at the newest stored step, where a reset of the env (a new ``learn()``, a new
        env) cuts them: the step becomes an episode end that keeps its bootstrap, as a time limit does, so no
        sample runs on into the next episode (its next observation, an n-step return's rewards). With
        ``optimize_memory_usage`` that step's next observation would be the next row's, the reset's: ``next_obs``
        (the observations after the step, as :meth:`store` takes them) keeps it; without it (a model loaded with an
        env, which starts from that env's reset), the step is made terminal, as SB3 makes it, and its own
        observation stands in for the next one, which the zero bootstrap never reads."""
        if self.size() == 0:
            return
        row = (self.pos - 1) % self.capacity
        running = np.flatnonzero(~self.dones[row])
        if self.optimize_memory_usage:
            for env in running:
                if next_obs is None:
                    self.terminated[row, env] = 1.0
                    self.final_observations[(row, int(env))] = {k: np.array(v[row, env]) for k, v in self._obs.items()}
                else:
                    self.final_observations[(row, int(env))] = self._one_env(next_obs, env)
        self.dones[row, running] = True

    def _one_env(self, next_obs: Any, env: int) -> dict[str | None, np.ndarray]:
        """Env ``env``'s observation in a batch of them, a copy per key (key None: a non-Dict space)."""
        return {k: np.array((next_obs if k is None else next_obs[k])[env]) for k in self.spaces}

    def sample(self, batch_size: int, env: Any = None) -> ReplayBufferSamples | DictReplayBufferSamples:
        """SB3's ``sample``: a uniform minibatch (with replacement) as SB3's ``ReplayBufferSamples`` (its
        ``DictReplayBufferSamples`` for Dict observations): ``actions`` ``(B, action_dim)``, ``rewards`` and
        ``dones`` ``(B, 1)``, where ``dones`` is the bootstrap mask (1.0 at a termination, 0.0 at a time limit,
        as SB3's ``dones * (1 - timeouts)``). Rows and envs are drawn as SB3 draws them, so under the same NumPy
        seed both buffers pick the same transitions (but with ``optimize_memory_usage``, where SB3 keeps its
        newest step otherwise). ``env`` as in :meth:`sample_batch`."""
        batch = self.sample_batch(batch_size, env, as_stored=True)
        samples = DictReplayBufferSamples if isinstance(batch.observations, dict) else ReplayBufferSamples
        discounts = None if batch.discounts is None else batch.discounts.reshape(batch_size, 1)
        return samples(
            batch.observations,
            batch.actions.reshape(batch_size, -1),
            batch.next_observations,
            batch.terminated.reshape(batch_size, 1),
            batch.rewards.reshape(batch_size, 1),
            discounts,
        )

    def sample_batch(self, batch_size: int, env: Any = None, as_stored: bool = False) -> ReplayBatch:
        """A uniform minibatch (with replacement) of stored transitions as covey's batch (what SAC trains on):
        tensors ``observations``, ``actions``, ``next_observations``, ``rewards`` ``(B,)``, ``terminated``
        ``(B,)``. Observations come as the networks take them, or ``as_stored`` in the space's dtype.

        ``env``, a ``VecNormalize`` (SB3's argument): the buffer then holds the env's original observations and
        rewards, and the minibatch's are normalized with its statistics as they are now, as in SB3."""
        rows = self._sample_rows(batch_size)
        envs = np.random.randint(0, self.n_envs, size=batch_size)
        obs = {k: v[rows, envs] for k, v in self._obs.items()}
        discounts = None
        if self.n_steps > 1:  # the return of up to n steps; what follows its last step
            last, rewards, discounts = self._n_step_returns(rows, envs, env)
            discounts = torch.as_tensor(discounts, device=self.device)
            next_obs = {k: v[last, envs] for k, v in self._next_obs.items()}
            terminated = self.terminated[last, envs]
        else:
            rewards, terminated = self.rewards[rows, envs], self.terminated[rows, envs]
            if env is not None:
                rewards = np.asarray(env.normalize_reward(rewards), dtype=np.float32)
            next_obs = self._next_observations(rows, envs)
        return self._batch(
            rows, envs, obs, next_obs, rewards, terminated, env=env, as_stored=as_stored, discounts=discounts
        )

    def _batch(self, rows, envs, obs, next_obs, rewards, terminated, *, env, as_stored, discounts=None) -> ReplayBatch:
        """The sampled arrays (rewards already normalized) as a batch of tensors: observations normalized by
        ``env``, a ``VecNormalize``, when given, and taken with the actions of ``rows`` of ``envs``."""
        if env is not None:
            obs, next_obs = self._normalized(obs, env), self._normalized(next_obs, env)
        return ReplayBatch(
            self._to_tensor(obs, as_stored),
            torch.as_tensor(self.actions[rows, envs], device=self.device),
            self._to_tensor(next_obs, as_stored),
            torch.as_tensor(rewards, device=self.device),
            torch.as_tensor(terminated, device=self.device),
            discounts,
        )

    def _next_observations(self, rows: np.ndarray, envs: np.ndarray) -> dict:
        """The observations after the steps at ``rows`` of ``envs`` (true final observations at episode ends)."""
        if self._next_obs is not None:
            return {k: v[rows, envs] for k, v in self._next_obs.items()}
        next_rows = (rows + 1) % self.capacity
        next_obs = {k: v[next_rows, envs] for k, v in self._obs.items()}
        for i in np.flatnonzero(self.dones[rows, envs]):
            final = self.final_observations[(int(rows[i]), int(envs[i]))]
            for k in next_obs:
                next_obs[k][i] = final[k]
        return next_obs

    def _n_step_returns(self, rows: np.ndarray, envs: np.ndarray, env: Any) -> tuple[np.ndarray, ...]:
        """For samples starting at ``rows`` of ``envs``: the row of the last step each return sums, the
        returns, and ``gamma ** steps summed`` (float32, as SB3 computes them)."""
        steps = np.arange(self.n_steps)
        window = (rows[:, None] + steps) % self.capacity  # (B, n) the rows a return may sum
        # A return stops at its episode's end, at the newest stored step (the row after it is not this
        # episode's yet, or an old one's), and at the window's end.
        stops = self.dones[window, envs[:, None]] | (window == (self.pos - 1) % self.capacity)
        stops[:, -1] = True
        k = stops.argmax(axis=1)  # the first stop: steps k + 1 are summed
        rewards = self.rewards[window, envs[:, None]]
        if env is not None:
            rewards = np.asarray(env.normalize_reward(rewards), dtype=np.float32)
        powers = np.float32(self.gamma) ** steps.astype(np.float32)
        returns = (rewards * powers * (steps <= k[:, None])).sum(axis=1, dtype=np.float32)
        discounts = np.float32(self.gamma) ** (k + 1).astype(np.float32)
        return window[np.arange(len(rows)), k], returns, discounts

    @staticmethod
    def _normalized(obs: dict, env: Any) -> dict:
        """Sampled observations (``{key: array}``, ``None`` for a non-Dict space) through ``env.normalize_obs``."""
        if None in obs:
            return {None: env.normalize_obs(obs[None])}
        return dict(env.normalize_obs(obs))

    def can_sample(self) -> bool:
        """Whether a minibatch can be drawn: a stored step (two with ``optimize_memory_usage``, whose newest
        step has no next observation yet)."""
        return self.full or self.pos >= (2 if self.optimize_memory_usage else 1)

    def _sample_rows(self, batch_size: int) -> np.ndarray:
        if self.size() == 0:
            raise ValueError("Cannot sample from an empty replay buffer.")
        if not self.optimize_memory_usage:
            return np.random.randint(0, self.capacity if self.full else self.pos, size=batch_size)
        # Memory mode: the newest row's next observation is not written yet, so it is never sampled.
        if self.full:
            # Rows pos, pos+1, ..., pos-2 (mod capacity): all but the newest row, pos - 1.
            return (np.random.randint(0, self.capacity - 1, size=batch_size) + self.pos) % self.capacity
        if self.pos < 2:
            raise ValueError("The replay buffer needs two stored steps before sampling with optimize_memory_usage.")
        return np.random.randint(0, self.pos - 1, size=batch_size)

    def _to_tensor(self, obs: dict, as_stored: bool = False) -> ObsTensor:
        """Sampled observations as the networks take them, or ``as_stored`` in the space's dtype (as SB3's
        ``sample`` gives them)."""
        if as_stored:  # in SB3's layout: a Discrete observation as (B, 1)
            layout = self._sb3_layout(obs)
            if isinstance(layout, dict):
                return {k: torch.as_tensor(v, device=self.device) for k, v in layout.items()}
            return torch.as_tensor(layout, device=self.device)
        if None in obs:
            return batch_to_tensor(obs[None], self.observation_space, self.device)
        return batch_to_tensor(obs, self.observation_space, self.device)

    # ------------------------------------------------------------------ files (no pickle)
    def save(self, path: str | os.PathLike) -> None:
        """Write the buffer to ``path`` (or an open binary file), atomically: an ``.npz`` archive of plain arrays,
        read back with ``allow_pickle=False``. Only the rows written so far are stored (a buffer of a million
        steps after a thousand takes a thousand rows on disk). As SB3 names its replay buffer files, a path
        without a suffix gets ``.pkl`` (the file is still an ``.npz`` archive, not a pickle), and missing folders
        are created."""
        stored = self.size()  # rows at and after pos are still zeros until the ring is full
        arrays = {
            "meta": np.array([self.capacity, self.n_envs, self.pos, int(self.full), int(self.optimize_memory_usage)]),
            "returns": np.array([self.n_steps, int(self.handle_timeout_termination)]),
            "actions": self.actions[:stored],
            "rewards": self.rewards[:stored],
            "terminated": self.terminated[:stored],
            "dones": self.dones[:stored],
        }
        for key, value in self._obs.items():
            arrays[f"obs/{key}"] = value[:stored]
        if self._next_obs is not None:
            for key, value in self._next_obs.items():
                arrays[f"next_obs/{key}"] = value[:stored]
        finals = sorted(self.final_observations)
        arrays["final_index"] = np.array(finals, dtype=np.int64).reshape(-1, 2)
        for key in self.spaces:
            arrays[f"final_obs/{key}"] = (
                np.stack([self.final_observations[i][key] for i in finals])
                if finals
                else np.zeros((0, *self.spaces[key].shape), self.spaces[key].dtype)
            )
        arrays.update(self._extra_arrays(stored))
        if not isinstance(path, (str, os.PathLike)):  # an open binary file
            require_binary(path, "save a replay buffer to")
            np.savez(path, **arrays)
            return
        write_atomically(buffer_path(path), lambda f: np.savez(f, **arrays))

    def load(self, path: str | os.PathLike) -> None:
        """Fill this buffer from a file written by :meth:`save` (shapes must match). A path without a suffix
        that names no file is read with ``.pkl`` added, as :meth:`save` names it."""
        self.fill(*read_buffer_file(path))

    def fill(self, path: Any, data: dict[str, np.ndarray]) -> None:
        """Fill this buffer from the arrays of its file at ``path`` (:func:`read_buffer_file`). Every array is
        checked first (names, shapes, rows, positions): a file this buffer cannot take leaves it unchanged."""
        capacity, n_envs, pos, full, optimize = file_meta(path, data)
        file_returns(path, data)  # a damaged record is named here (the agent's load reads it to build the buffer)
        if (capacity, n_envs, bool(optimize)) != (self.capacity, self.n_envs, self.optimize_memory_usage):
            raise ValueError(
                f"Replay buffer file has capacity {capacity} x {n_envs} envs (optimize_memory_usage="
                f"{bool(optimize)}); this buffer has {self.capacity} x {self.n_envs} "
                f"({self.optimize_memory_usage}). Build the model with the same buffer_size and n_envs."
            )
        # Each array as this buffer stores it, but for its rows (the steps stored: a file of another env is
        # named here, where NumPy would have broadcast a width of 1 or failed with its shapes).
        expected = {
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "dones": self.dones,
        }
        expected.update({f"obs/{key}": value for key, value in self._obs.items()})
        if self._next_obs is not None:
            expected.update({f"next_obs/{key}": value for key, value in self._next_obs.items()})
        rows = capacity if full else pos  # the rows save() wrote
        for name, target in expected.items():
            if name not in data:
                raise ValueError(f"{path} holds no {name!r}: it is not a replay buffer of this model's spaces.")
            stored = data[name]
            if stored.shape[1:] != target.shape[1:]:
                raise ValueError(
                    f"{path} holds {name} of shape {stored.shape[1:]} per step (envs first); this buffer stores "
                    f"{target.shape[1:]} ({self.observation_space} observations, {self.action_space} actions, "
                    f"{self.n_envs} envs). Load it into a model of the env it was saved from."
                )
            if len(stored) not in (rows, len(target)):  # the rows written (older files: every row)
                raise ValueError(
                    f"{path} holds {len(stored)} rows of {name} where its position says {rows} were saved: the "
                    "file is damaged (or was edited). The buffer is unchanged."
                )
        self._check_finals(path, data, rows)
        self._check_extra(path, data, rows)
        # Files hold the rows written so far (older ones every row): the rows after them are zeros.
        fill_rows(self.actions, data["actions"])
        fill_rows(self.rewards, data["rewards"])
        fill_rows(self.terminated, data["terminated"])
        fill_rows(self.dones, data["dones"])
        for key in self.spaces:
            fill_rows(self._obs[key], data[f"obs/{key}"])
            if self._next_obs is not None:
                fill_rows(self._next_obs[key], data[f"next_obs/{key}"])
        finals = data["final_index"]
        stacked = {key: data[f"final_obs/{key}"] for key in self.spaces}
        self.final_observations = {
            (int(r), int(e)): {key: stacked[key][i] for key in self.spaces} for i, (r, e) in enumerate(finals)
        }
        self._load_extra(data)
        self.pos, self.full = pos, bool(full)

    def _check_finals(self, path: Any, data: dict[str, np.ndarray], rows: int) -> None:
        """Raise where the file's final observations (the rows and envs of episodes' last steps, and their
        observations) do not fit this buffer's ``rows`` saved rows and its spaces."""
        if "final_index" not in data:
            raise ValueError(f"{path} holds no 'final_index': it is not a replay buffer file of this covey.")
        index = data["final_index"]
        if index.ndim != 2 or index.shape[1] != 2 or not np.issubdtype(index.dtype, np.integer):
            raise ValueError(f"{path} holds a final_index of shape {index.shape} ({index.dtype}), not (k, 2) ints.")
        if len(index) and (index.min() < 0 or index[:, 0].max() >= rows or index[:, 1].max() >= self.n_envs):
            raise ValueError(
                f"{path} holds final observations for rows or envs outside its {rows} rows of {self.n_envs} envs: "
                "the file is damaged (or was edited). The buffer is unchanged."
            )
        for key, space in self.spaces.items():
            name = f"final_obs/{key}"
            if name not in data or data[name].shape != (len(index), *space.shape):
                found = data[name].shape if name in data else "none"
                raise ValueError(
                    f"{path} holds {name} of shape {found}, where its {len(index)} final observations of "
                    f"{space} take {(len(index), *space.shape)}. Load it into a model of the env it was saved from."
                )

    def _extra_arrays(self, stored: int) -> dict[str, np.ndarray]:
        """Arrays a subclass keeps beside the transitions, saved with them (of per-row arrays, the first
        ``stored`` rows, as :meth:`save` keeps of the transitions)."""
        return {}

    def _check_extra(self, path: Any, data: dict[str, np.ndarray], rows: int) -> None:
        """Raise where the file's arrays ``data`` (of ``rows`` saved rows) lack what :meth:`_load_extra` reads, or
        hold it in other shapes, before the buffer changes."""

    def _load_extra(self, data) -> None:
        """Read back what :meth:`_extra_arrays` saved."""


def read_buffer_file(path: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The path (``.pkl`` added to one without a suffix that names no file, as :meth:`ReplayBuffer.save` names it)
    and every array of a replay buffer file, each read and its checksum checked before a buffer changes."""
    if isinstance(path, (str, os.PathLike)):
        path = pathlib.Path(path)
        if not path.exists() and path.suffix == "" and buffer_path(path).exists():
            path = buffer_path(path)
    return path, _read_arrays(path)


def file_meta(path: Any, data: dict[str, np.ndarray]) -> tuple[int, int, int, bool, bool]:
    """``(capacity, n_envs, pos, full, optimize_memory_usage)`` from the file's ``meta`` array, or the error that
    says the file is damaged where they are not a buffer's."""
    meta = data["meta"]
    if meta.shape != (5,) or not np.issubdtype(meta.dtype, np.integer):
        raise ValueError(
            f"{path} holds a meta array of shape {meta.shape} ({meta.dtype}) where covey's save_replay_buffer writes "
            "5 integers: the file is damaged (or was edited). The buffer is unchanged."
        )
    capacity, n_envs, pos, full, optimize = (int(x) for x in meta)
    if capacity < 1 or n_envs < 1 or not 0 <= pos < capacity or full not in (0, 1) or optimize not in (0, 1):
        raise ValueError(
            f"{path} holds meta {meta.tolist()} (capacity, n_envs, position, full, optimize_memory_usage), which no "
            "buffer has (the position must lie in [0, capacity)): the file is damaged (or was edited). The buffer "
            "is unchanged."
        )
    return capacity, n_envs, pos, bool(full), bool(optimize)


def file_returns(path: Any, data: dict[str, np.ndarray]) -> tuple[int, bool] | None:
    """``(n_steps, handle_timeout_termination)`` of the buffer whose file's arrays are ``data`` (None for a file
    written before covey kept them), or the error that says the file is damaged where they are not a buffer's."""
    if "returns" not in data:
        return None
    returns = data["returns"]
    if (
        returns.shape != (2,)
        or not np.issubdtype(returns.dtype, np.integer)
        or returns[0] < 1
        or returns[1] not in (0, 1)
    ):
        raise ValueError(
            f"{path} holds returns {returns.tolist()} where covey's save_replay_buffer writes (n_steps >= 1, "
            "handle_timeout_termination 0 or 1): the file is damaged (or was edited). The buffer is unchanged."
        )
    return int(returns[0]), bool(returns[1])


def file_layout(path: Any, data: dict[str, np.ndarray]) -> tuple[int, int, bool]:
    """``(capacity, n_envs, optimize_memory_usage)`` of the buffer whose file's arrays are ``data``."""
    capacity, n_envs, _, _, optimize = file_meta(path, data)
    return capacity, n_envs, optimize


def _read_arrays(path: Any) -> dict[str, np.ndarray]:
    """Every array of the replay buffer file at ``path`` (a path, or an open binary file), or the error that says
    why it cannot be read. A file opened here is closed either way: NumPy leaves open the file of an archive too
    truncated to read."""
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(open(path, "rb")) if isinstance(path, pathlib.Path) else path
        require_binary(source, "load a replay buffer from")
        try:
            archive = np.load(source, allow_pickle=False)
        except (zipfile.BadZipFile, EOFError) as error:  # a truncated or damaged file
            raise _corrupt(path, error) from error
        except ValueError as error:
            if "pickle" not in str(error):
                raise
            raise ValueError(
                f"{path} holds pickled data, as SB3's save_replay_buffer writes it. covey reads only its own replay "
                "buffer files (an .npz archive of plain arrays, from covey's save_replay_buffer): unpickling could "
                "run code from the file. Fill the buffer by training with covey, and save it with covey."
            ) from None
        if isinstance(archive, np.lib.npyio.NpzFile):
            with archive:
                if "meta" in archive.files:
                    try:
                        return {name: archive[name] for name in archive.files}
                    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as error:
                        raise _corrupt(path, error) from error
                    except ValueError as error:  # an array of Python objects, which only unpickling reads
                        raise ValueError(
                            f"{path} holds an array of Python objects ({error}), which covey never unpickles: it "
                            "is not a replay buffer file from covey's save_replay_buffer. The buffer is unchanged."
                        ) from None
        raise ValueError(
            f"{path} is not a replay buffer file: covey's save_replay_buffer writes an .npz archive with the "
            "buffer's arrays (a model's .zip file holds none)."
        )


def _corrupt(path: Any, error: Exception) -> ValueError:
    """The error for a replay buffer file that cannot be read whole (a truncated or damaged archive)."""
    return ValueError(f"{path} is a corrupt replay buffer file ({error}); the buffer is unchanged.")
