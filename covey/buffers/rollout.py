"""The on-policy rollout buffer: pre-allocated tensors ``(n_steps, n_envs, ...)``, GAE, minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from covey.buffers.returns import gae
from covey.networks.encoders import obs_dtype
from covey.networks.obs import ObsTensor


def _sb3_actions(actions: torch.Tensor) -> torch.Tensor:
    """Actions as SB3's rollout buffer gives them: float32 ``(batch, action_dim)``."""
    return actions.reshape(len(actions), -1).float()


class RolloutBatch(NamedTuple):
    """One minibatch of flattened agent-steps."""

    observations: ObsTensor
    actions: torch.Tensor
    old_values: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


def action_storage(space: spaces.Space) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape of one action and the dtype the buffer keeps it in."""
    if isinstance(space, spaces.Discrete):
        return (), torch.long
    if isinstance(space, spaces.MultiDiscrete):
        return (int(np.prod(space.shape)),), torch.long
    return (int(np.prod(space.shape)),), torch.float32


def _alloc_obs(space: spaces.Space, lead: tuple[int, ...], device) -> ObsTensor:
    if isinstance(space, spaces.Dict):
        return {k: _alloc_obs(s, lead, device) for k, s in space.spaces.items()}
    return torch.zeros((*lead, *space.shape), dtype=obs_dtype(space), device=device)


def _numpy(x: torch.Tensor) -> np.ndarray:
    """The tensor's NumPy view on the CPU, a copy from another device."""
    x = x.detach()
    return x.numpy() if x.device.type == "cpu" else x.cpu().numpy()


def _write(stored: ObsTensor, value: Any, name: str) -> None:
    """``rollout_buffer.<name> = value`` (a callback's, as SB3's buffer fields are plain arrays): the values go into
    the buffer's memory, in its shape (SB3's trailing axes of size 1 fit)."""
    if isinstance(stored, dict):
        if not isinstance(value, dict) or set(value) != set(stored):
            raise ValueError(f"rollout_buffer.{name} takes a dict of arrays with the keys {sorted(stored)}.")
        for key in stored:
            _write(stored[key], value[key], f"{name}[{key!r}]")
        return
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.size != stored.numel():
        raise ValueError(
            f"rollout_buffer.{name} = an array of shape {array.shape}: the buffer holds {tuple(stored.shape)} "
            f"(n_steps, n_envs, ...); give an array of that size."
        )
    with torch.no_grad():
        stored.copy_(torch.as_tensor(array.reshape(stored.shape)).to(stored.dtype))


def _written(stored: torch.Tensor, value: Any, name: str) -> torch.Tensor:
    """:func:`_write` into a new tensor of ``stored``'s shape (the rollout's values and returns may be inference
    tensors, which take no writes outside inference mode)."""
    new = torch.zeros_like(stored)
    _write(new, value, name)
    return new


def _numpy_obs(x: ObsTensor, space: spaces.Space) -> np.ndarray | dict[str, np.ndarray]:
    """Stored observations as SB3 shapes them: a Discrete observation as ``(..., 1)``."""
    if isinstance(x, dict):
        return {k: _numpy_obs(v, space[k]) for k, v in x.items()}
    array = _numpy(x)
    return array.reshape(*array.shape, 1) if isinstance(space, spaces.Discrete) else array


def _obs_shape(space: spaces.Space) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """SB3's ``obs_shape``: a Box's shape, ``(1,)`` for Discrete, a dict of them for Dict."""
    if isinstance(space, spaces.Dict):
        return {k: _obs_shape(s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        return (1,)
    return tuple(space.shape)


def _action_dim(space: spaces.Space) -> int:
    """SB3's ``action_dim``: the number of numbers one action is stored as."""
    return 1 if isinstance(space, spaces.Discrete) else int(np.prod(space.shape))


def _flat(x: ObsTensor, n: int) -> ObsTensor:
    if isinstance(x, dict):
        return {k: v.reshape(n, *v.shape[2:]) for k, v in x.items()}
    return x.reshape(n, *x.shape[2:])  # (T, N, ...) -> (T * N, ...)


def _index(x: ObsTensor, idx) -> ObsTensor:
    return {k: v[idx] for k, v in x.items()} if isinstance(x, dict) else x[idx]


class RolloutBuffer:
    """Fixed-size storage for one rollout of ``n_steps`` steps of ``n_envs`` environments.

    Filled step by step with :meth:`add`; values and old log-probabilities are written once for the
    whole rollout (one batched pass after collection), then :meth:`compute_returns` runs GAE.

    The agents work on the ``*_tensor`` fields. SB3's names (``observations``, ``actions``, ``values``,
    ``log_probs``, ``advantages``, ``returns``, beside the NumPy ``rewards`` and ``episode_starts``) are
    NumPy arrays ``(buffer_size, n_envs, ...)`` as in SB3, so a callback's ``np.mean(buffer.returns)``
    works: on the CPU they are views of the same memory (a callback's in-place change reaches training, as
    in SB3), on another device copies. Actions are ``(buffer_size, n_envs, action_dim)`` as SB3 keeps them,
    in the dtype covey stores them (int64 for discrete actions, where SB3 has float32).

    >>> buf = RolloutBuffer(4, 2, spaces.Box(-1, 1, (3,)), spaces.Discrete(2))
    >>> buf.observations.shape, buf.actions.shape
    ((4, 2, 3), (4, 2, 1))
    """

    def __init__(
        self,
        n_steps: int,
        n_envs: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: torch.device | str = "cpu",
    ) -> None:
        self.n_steps, self.n_envs = n_steps, n_envs
        self.buffer_size = n_steps  # SB3's name
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = _obs_shape(observation_space)
        self.action_dim = _action_dim(action_space)
        self.device = torch.device(device)
        # Where the policy's actions are those stored less a start (a user's SB3 policy class acts from 0 in a
        # Discrete space with a start): get() gives the policy's, as SB3's train() hands them to it
        self.policy_action_start: np.ndarray | None = None
        self._next_starts = np.ones(n_envs, dtype=bool)  # for an add() not given episode_starts
        self.gamma, self.gae_lambda = 0.99, 0.95  # those of the last compute_returns
        self.td_error_abs = 0.0
        self._sb3_steps = False  # whether add() was given SB3's form (values and log-probs with each step)
        self.reset()

    def _allocate(self) -> None:
        """New zeroed storage for a rollout, as SB3's ``reset`` allocates it: arrays a callback kept from the last
        rollout (``rollout_buffer.observations`` in ``_on_rollout_end``, without a copy) keep that rollout's."""
        n_steps, n_envs, device = self.n_steps, self.n_envs, self.device
        self.observations_tensor = _alloc_obs(self.observation_space, (n_steps, n_envs), device)
        act_shape, act_dtype = action_storage(self.action_space)
        self.actions_tensor = torch.zeros((n_steps, n_envs, *act_shape), dtype=act_dtype, device=device)
        # On the CPU, NumPy views of the same memory: a step's NumPy arrays are written straight into them (a
        # fraction of what a tensor made of them and written by PyTorch costs)
        cpu = device.type == "cpu"
        plain = cpu and not isinstance(self.observations_tensor, dict)
        self._observations_np = self.observations_tensor.numpy() if plain else None
        self._actions_np = self.actions_tensor.numpy() if cpu else None
        self.rewards = np.zeros((n_steps, n_envs), dtype=np.float32)
        self.terminated = np.zeros((n_steps, n_envs), dtype=bool)
        self.dones = np.zeros((n_steps, n_envs), dtype=bool)
        # SB3's episode_starts: 1.0 where the step's observation is the first of an episode.
        self.episode_starts = np.zeros((n_steps, n_envs), dtype=np.float32)
        # Bootstrap values for truncated steps: V(true final observation), filled in after collection.
        self.truncation_values = np.zeros((n_steps, n_envs), dtype=np.float32)
        # the last rollout's may be inference tensors, or read by a callback still
        self.values_tensor, self.log_probs_tensor, self.advantages_tensor, self.returns_tensor = (
            torch.zeros(n_steps, n_envs, dtype=torch.float32, device=device) for _ in range(4)
        )

    # SB3's fields, as NumPy arrays
    @property
    def observations(self) -> np.ndarray | dict[str, np.ndarray]:
        return _numpy_obs(self.observations_tensor, self.observation_space)

    @observations.setter
    def observations(self, value) -> None:
        _write(self.observations_tensor, value, "observations")

    @property
    def actions(self) -> np.ndarray:
        return _numpy(self.actions_tensor).reshape(self.n_steps, self.n_envs, -1)

    @actions.setter
    def actions(self, value) -> None:
        _write(self.actions_tensor, value, "actions")

    @property
    def values(self) -> np.ndarray:
        return _numpy(self.values_tensor)

    @values.setter
    def values(self, value) -> None:
        self.values_tensor = _written(self.values_tensor, value, "values")

    @property
    def log_probs(self) -> np.ndarray:
        return _numpy(self.log_probs_tensor)

    @log_probs.setter
    def log_probs(self, value) -> None:
        self.log_probs_tensor = _written(self.log_probs_tensor, value, "log_probs")

    @property
    def advantages(self) -> np.ndarray:
        return _numpy(self.advantages_tensor)

    @advantages.setter
    def advantages(self, value) -> None:
        self.advantages_tensor = _written(self.advantages_tensor, value, "advantages")

    @property
    def returns(self) -> np.ndarray:
        return _numpy(self.returns_tensor)

    @returns.setter
    def returns(self, value) -> None:
        self.returns_tensor = _written(self.returns_tensor, value, "returns")

    @property
    def full(self) -> bool:
        return self.pos == self.n_steps

    def reset(self) -> None:
        """Start a rollout at position 0 in new zeroed storage, as SB3's reset starts one (a callback's
        ``_on_rollout_start`` finds none of the last rollout's, and arrays kept from it stay as they were)."""
        self.pos = 0
        self._allocate()

    def add(
        self,
        obs: ObsTensor | np.ndarray,
        actions: torch.Tensor | np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        dones: np.ndarray,
        episode_starts: np.ndarray | None = None,
    ) -> None:
        """Store one step of every env: the observation acted on, the action, and what followed. The
        observation and the action may be tensors or NumPy arrays, converted to the buffer's dtypes as PyTorch
        converts them (a CPU buffer writes arrays through its NumPy views). ``episode_starts`` says which
        observations begin an episode; without it the buffer follows the ``dones`` it was given.

        SB3's ``add(obs, action, reward, episode_start, value, log_prob)`` (``value`` and ``log_prob`` tensors, as
        SB3's ``collect_rollouts`` passes them in a subclass's copy of it) is taken as SB3's: see :meth:`_add_sb3`."""
        if isinstance(dones, torch.Tensor) and isinstance(episode_starts, torch.Tensor):
            self._add_sb3(obs, actions, rewards, terminated, dones, episode_starts)
            return
        self._sb3_steps = False
        self._store(obs, actions)
        t = self.pos
        self.rewards[t] = rewards
        self.terminated[t] = terminated
        self.dones[t] = dones
        self.episode_starts[t] = self._next_starts if episode_starts is None else episode_starts
        self._next_starts = np.array(dones, dtype=bool)  # a copy: a caller may refill its array in place
        self.pos += 1

    def _add_sb3(self, obs, actions, rewards, episode_starts, values: torch.Tensor, log_probs: torch.Tensor) -> None:
        """One step in SB3's form: the step's values and log-probabilities come with it, and the rewards hold
        the time limits' bootstraps (SB3's loop adds them), so every episode end is a terminal one for GAE. The
        ends are known one step late, from the next step's ``episode_starts``, and the last step's from the
        ``dones`` given to :meth:`compute_returns_and_advantage`."""
        self._sb3_steps = True
        self._store(obs, actions)
        t = self.pos
        self.rewards[t] = rewards
        self.episode_starts[t] = episode_starts
        if t > 0:
            self.dones[t - 1] = self.terminated[t - 1] = np.asarray(episode_starts, dtype=bool)
        self.dones[t] = self.terminated[t] = False
        self.values_tensor[t] = values.detach().reshape(self.n_envs)
        self.log_probs_tensor[t] = log_probs.detach().reshape(self.n_envs)
        self.pos += 1

    def _store(self, obs: ObsTensor | np.ndarray, actions: torch.Tensor | np.ndarray) -> None:
        t = self.pos
        if isinstance(obs, dict):
            for key, value in obs.items():
                self.observations_tensor[key][t] = value
        elif isinstance(obs, np.ndarray) and self._observations_np is not None:
            self._observations_np[t] = obs
        else:
            self.observations_tensor[t] = torch.as_tensor(obs)
        if isinstance(actions, np.ndarray) and self._actions_np is not None:
            self._actions_np[t] = actions.reshape(self._actions_np.shape[1:])
        else:
            self.actions_tensor[t] = torch.as_tensor(actions).reshape(self.actions_tensor.shape[1:])

    def flat_observations(self) -> ObsTensor:
        """All stored observations as one batch ``(n_steps * n_envs, ...)``."""
        return _flat(self.observations_tensor, self.n_steps * self.n_envs)

    def flat_actions(self) -> torch.Tensor:
        return self.actions_tensor.reshape(self.n_steps * self.n_envs, *self.actions_tensor.shape[2:])

    def compute_returns(self, last_values: np.ndarray, gamma: float, gae_lambda: float) -> None:
        """GAE over the stored rollout; ``last_values`` is V(observation after the last step) per env."""
        self.gamma, self.gae_lambda = gamma, gae_lambda
        values = self.values_tensor.cpu().numpy().astype(np.float64)
        next_values = np.empty_like(values)
        next_values[:-1] = values[1:]
        next_values[-1] = last_values
        # After a done the next stored value belongs to a new episode; the real bootstrap for a
        # truncation is V(final observation), written into truncation_values by the agent.
        next_values = np.where(self.dones, self.truncation_values, next_values)
        adv, ret = gae(self.rewards, values, next_values, self.terminated, self.dones, gamma, gae_lambda)
        # Diagnostic: mean absolute one-step TD error of the critic over the rollout.
        td = self.rewards + gamma * next_values * (1.0 - self.terminated) - values
        self.td_error_abs = float(np.abs(td).mean())
        self.advantages_tensor = torch.as_tensor(adv, dtype=torch.float32, device=self.device)
        self.returns_tensor = torch.as_tensor(ret, dtype=torch.float32, device=self.device)

    def compute_returns_and_advantage(self, last_values: torch.Tensor | np.ndarray, dones: np.ndarray) -> None:
        """SB3's name, for a callback that changes the rewards at the rollout's end (an intrinsic bonus) and
        computes the returns again: :meth:`compute_returns` with the ``gamma`` and ``gae_lambda`` of the last
        computation. ``last_values``: V(observation after the last step), one per env (a tensor or an array,
        ``(n_envs,)`` or ``(n_envs, 1)``); ``dones``: the last step's, which the buffer holds already (the time
        limits' bootstraps too), so they must be the ones it stored."""
        if isinstance(last_values, torch.Tensor):
            last_values = last_values.detach().cpu().numpy()
        last_values = np.asarray(last_values, dtype=np.float64)
        if last_values.size != self.n_envs:
            raise ValueError(
                f"last_values has shape {last_values.shape}: pass one value per env ({self.n_envs},), e.g. "
                "policy.predict_values(obs_tensor) of the observation after the rollout's last step."
            )
        if self._sb3_steps:  # steps stored in SB3's form: their last ends are these
            self.dones[self.pos - 1] = self.terminated[self.pos - 1] = np.asarray(dones, dtype=bool).reshape(-1)
        elif not np.array_equal(np.asarray(dones, dtype=bool).reshape(-1), self.dones[self.pos - 1]):
            raise ValueError(
                "dones are not the rollout's last step's: pass the callback's self.locals['dones'] (the buffer "
                "holds every step's, and computes with them)."
            )
        self.compute_returns(last_values.reshape(self.n_envs), self.gamma, self.gae_lambda)

    def size(self) -> int:
        """Steps stored per env (SB3's ``size()``)."""
        return self.pos

    def get(self, batch_size: int | None = None) -> Iterator[RolloutBatch]:
        """SB3's ``get``: shuffled minibatches of ``batch_size`` samples (the whole rollout when None) with
        SB3's field names (``observations``, ``actions``, ``old_values``, ``old_log_prob``, ``advantages``,
        ``returns``), each ``(batch, ...)``; it needs a full buffer with its returns computed, as SB3's does. The
        actions are SB3's too: float32 ``(batch, action_dim)``, a Discrete action one column (SB3's ``train`` takes
        them as ``actions.long().flatten()``)."""
        if not self.full:
            raise ValueError(
                f"The rollout buffer holds {self.pos} of its {self.n_steps} steps; get() reads a full rollout "
                "(after collect_rollouts)."
            )
        batches = self.minibatches(batch_size if batch_size is not None else self.n_steps * self.n_envs)
        start = self.policy_action_start
        shift = 0.0 if start is None else torch.as_tensor(start, dtype=torch.float32, device=self.device).reshape(1, -1)
        return (batch._replace(actions=_sb3_actions(batch.actions) - shift) for batch in batches)

    def minibatches(self, batch_size: int) -> Iterator[RolloutBatch]:
        """Shuffled minibatches over all ``n_steps * n_envs`` samples (the last one may be smaller).

        When one minibatch holds the whole rollout, its order does not change the gradient: no shuffle.
        """
        n = self.n_steps * self.n_envs
        obs = self.flat_observations()
        flat = (
            self.flat_actions(),
            self.values_tensor.reshape(n),
            self.log_probs_tensor.reshape(n),
            self.advantages_tensor.reshape(n),
            self.returns_tensor.reshape(n),
        )
        if batch_size >= n:
            yield RolloutBatch(obs, *flat)
            return
        perm = torch.randperm(n, device=self.device)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            yield RolloutBatch(_index(obs, idx), *(x[idx] for x in flat))
