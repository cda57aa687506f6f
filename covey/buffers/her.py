"""Hindsight experience replay: the replay buffer relabels sampled transitions with goals reached later."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

from covey.buffers.replay import ReplayBatch, ReplayBuffer, fill_rows
from covey.warning import warn_user

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
_TAG = "__covey__"
"""Marks what JSON has no type for in the infos a buffer file holds: arrays, NumPy scalars, tuples, dicts."""
STRATEGIES = ("future", "final", "episode")
HER_KWARGS = ("n_sampled_goal", "goal_selection_strategy", "copy_info_dict")
"""SB3's HerReplayBuffer arguments that set hindsight replay (its others are the model's, or the buffer's)."""


def goal_strategy(value: Any) -> str:
    """``goal_selection_strategy`` as a name: a string, or SB3's ``GoalSelectionStrategy``."""
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name.lower() not in STRATEGIES:
        raise ValueError(f"goal_selection_strategy={value!r} is invalid: use one of {list(STRATEGIES)}.")
    return name.lower()


def goal_strategy_enum(value: Any) -> GoalSelectionStrategy:
    """``goal_selection_strategy`` as SB3's ``GoalSelectionStrategy`` (what SB3's buffer holds)."""
    return GoalSelectionStrategy[goal_strategy(value).upper()]


class HerReplayBuffer(ReplayBuffer):
    """A replay buffer for goal-conditioned envs (Dict observations with ``observation``, ``achieved_goal`` and
    ``desired_goal``; ``compute_reward(achieved_goal, desired_goal, infos)`` on the env), sampled as SB3's
    ``HerReplayBuffer`` samples: only transitions of finished episodes; of a batch of ``B``, the first
    ``int(B * n_sampled_goal / (n_sampled_goal + 1))`` drawn are relabeled ("virtual") and come last.

    A virtual transition takes as its goal the achieved goal after a step of its own episode: a later one or
    itself (``"future"``), the last (``"final"``) or any (``"episode"``), and the reward
    ``env.env_method("compute_reward", ...)`` gives for it. Draws are SB3's, so under the same NumPy seed both
    buffers return the same batch. An episode partly overwritten by the ring is no longer sampled.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        env: Any = None,
        n_envs: int = 1,
        device: torch.device | str = "cpu",
        n_sampled_goal: int = 4,
        goal_selection_strategy: Any = "future",
        copy_info_dict: bool = False,
        handle_timeout_termination: bool = True,
    ) -> None:
        keys = sorted(observation_space.spaces) if isinstance(observation_space, spaces.Dict) else None
        if keys is None or not set(GOAL_KEYS) <= set(keys):
            raise ValueError(
                f"HerReplayBuffer needs a goal-conditioned env: Dict observations with keys {list(GOAL_KEYS)}, "
                f"got {observation_space if keys is None else keys}."
            )
        if not isinstance(n_sampled_goal, (int, np.integer)) or n_sampled_goal < 0:
            raise ValueError(f"n_sampled_goal={n_sampled_goal!r} is invalid: it must be an int >= 0.")
        super().__init__(
            buffer_size,
            observation_space,
            action_space,
            n_envs,
            optimize_memory_usage=False,
            device=device,
            handle_timeout_termination=handle_timeout_termination,
        )
        self.env = env
        self.n_sampled_goal = int(n_sampled_goal)
        self.goal_selection_strategy = goal_strategy_enum(goal_selection_strategy)  # SB3's enum, as its buffer's
        self.her_ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        self.copy_info_dict = bool(copy_info_dict)
        lead = (self.capacity, n_envs)
        self.infos = np.array([[{} for _ in range(n_envs)] for _ in range(self.capacity)]) if copy_info_dict else None
        # Per stored step: the row its episode started at, and the episode's length once it has ended (0 before).
        self.ep_start = np.zeros(lead, dtype=np.int64)
        self.ep_length = np.zeros(lead, dtype=np.int64)
        self._current_ep_start = np.zeros(n_envs, dtype=np.int64)

    def reset(self) -> None:
        super().reset()
        self.ep_start[:] = 0
        self.ep_length[:] = 0
        self._current_ep_start[:] = 0

    def store(self, obs, next_obs, actions, rewards, terminated, dones, infos: list[dict] | None = None) -> None:
        row = self.pos
        for e in np.flatnonzero(self.ep_length[row] > 0):  # about to overwrite a step of an ended episode
            end = self.ep_start[row, e] + self.ep_length[row, e]
            self.ep_length[np.arange(row, end) % self.capacity, e] = 0
        self.ep_start[row] = self._current_ep_start
        if self.infos is not None and infos is not None:
            self.infos[row] = infos
        super().store(obs, next_obs, actions, rewards, terminated, dones)
        for e in np.flatnonzero(dones):
            self._end_episode(int(e))

    def _end_episode(self, e: int) -> None:
        """Record the episode of env ``e`` that ended with the newest step: its length, on each of its rows."""
        start, end = int(self._current_ep_start[e]), self.pos
        if end <= start:  # the ring wrapped during the episode
            end += self.capacity
        self.ep_length[np.arange(start, end) % self.capacity, e] = end - start
        self._current_ep_start[e] = self.pos

    def truncate_last_trajectory(self) -> bool:
        """End the episodes still running at the newest step (as after loading a buffer saved mid-episode), so
        their steps can be sampled; their last step keeps its bootstrap, as a time limit does. Returns whether
        there were any."""
        running = np.flatnonzero(self._current_ep_start != self.pos)
        for e in running:
            self.dones[(self.pos - 1) % self.capacity, e] = True
            self._end_episode(int(e))
        return len(running) > 0

    def end_episodes(self, next_obs: Any = None) -> None:
        """A reset cuts the episodes running at the newest step: they end there (:meth:`truncate_last_trajectory`)."""
        self.truncate_last_trajectory()

    def can_sample(self) -> bool:
        """Whether a finished episode is stored (hindsight replay samples only those)."""
        return bool((self.ep_length > 0).any())

    def sample_batch(self, batch_size: int, env: Any = None, as_stored: bool = False) -> ReplayBatch:
        valid = self.ep_length > 0
        if not valid.any():
            raise RuntimeError(
                "HerReplayBuffer samples only finished episodes, and none has ended yet: set learning_starts above "
                "the env's longest episode."
            )
        drawn = np.random.choice(np.flatnonzero(valid), size=batch_size, replace=True)
        rows, envs = np.unravel_index(drawn, valid.shape)
        n_virtual = int(self.her_ratio * batch_size)
        # The first n_virtual drawn are relabeled; the batch holds the real ones first, as SB3's does.
        order = np.concatenate([np.arange(n_virtual, batch_size), np.arange(n_virtual)])
        rows, envs = rows[order], envs[order]
        n_real = batch_size - n_virtual
        obs = {k: v[rows, envs] for k, v in self._obs.items()}
        next_obs = {k: v[rows, envs] for k, v in self._next_obs.items()}
        rewards = self.rewards[rows, envs].copy()
        if n_virtual:
            v_rows, v_envs = rows[n_real:], envs[n_real:]
            goals = self._sample_goals(v_rows, v_envs)
            obs["desired_goal"][n_real:] = goals
            next_obs["desired_goal"][n_real:] = goals
            rewards[n_real:] = self._relabeled_rewards(next_obs["achieved_goal"][n_real:], goals, v_rows, v_envs)
        if env is not None:
            rewards = np.asarray(env.normalize_reward(rewards), dtype=np.float32)
        terminated = self.terminated[rows, envs]
        return self._batch(rows, envs, obs, next_obs, rewards, terminated, env=env, as_stored=as_stored)

    def _sample_goals(self, rows: np.ndarray, envs: np.ndarray) -> np.ndarray:
        """The achieved goal after a step of each sample's episode, chosen by the strategy."""
        start, length = self.ep_start[rows, envs], self.ep_length[rows, envs]
        if self.goal_selection_strategy is GoalSelectionStrategy.FINAL:
            offset = length - 1
        elif self.goal_selection_strategy is GoalSelectionStrategy.FUTURE:  # this step or a later one
            offset = np.random.randint((rows - start) % self.capacity, length)
        else:  # "episode"
            offset = np.random.randint(0, length)
        return self._next_obs["achieved_goal"][(start + offset) % self.capacity, envs]

    def _relabeled_rewards(self, achieved: np.ndarray, goals: np.ndarray, rows: np.ndarray, envs: np.ndarray):
        if self.env is None:
            raise RuntimeError(
                "HerReplayBuffer computes the rewards of relabeled goals with the env's compute_reward: give it "
                "the env (model.set_env(env) for a model loaded without one)."
            )
        if self.infos is not None:
            infos = [dict(info) for info in self.infos[rows, envs]]
        else:
            infos = [{} for _ in range(len(rows))]
        # One copy computes them; Gymnasium's AsyncVectorEnv calls every copy at once, and copy 0 answers.
        one = [0] if getattr(self.env, "calls_copies_alone", True) else None
        rewards = self.env.env_method("compute_reward", achieved, goals, infos, indices=one)[0]
        return np.asarray(rewards, dtype=np.float32)

    # The episode bookkeeping travels with the buffer's file, and so do the infos of copy_info_dict, as JSON
    # (numbers, strings, NumPy arrays and scalars, lists, tuples and dicts of them): the file holds no pickle.
    def _extra_arrays(self, stored: int) -> dict[str, np.ndarray]:
        arrays = {
            "her/ep_start": self.ep_start[:stored],
            "her/ep_length": self.ep_length[:stored],
            "her/current": self._current_ep_start,
        }
        if self.infos is not None:
            dropped: dict[str, str] = {}  # key -> what its value was, for the warning
            rows = [[_plain_info(info, dropped) for info in row] for row in self.infos[:stored]]
            if dropped:
                held = ", ".join(f"{key} ({what})" for key, what in dropped.items())
                warn_user(
                    f"The replay buffer's infos (copy_info_dict=True) hold values its file keeps only as plain data "
                    f"(numbers, strings, NumPy arrays, lists, tuples and dicts of them): {held}. Those entries are "
                    "left out, and after loading compute_reward gets each step's info without them."
                )
            arrays["her/infos"] = np.frombuffer(json.dumps(rows).encode(), dtype=np.uint8)
        return arrays

    def _check_extra(self, path, data, rows: int) -> None:
        if "her/ep_length" not in data:
            raise ValueError(
                "The replay buffer file holds no episode bookkeeping for hindsight replay (it was saved from a "
                "buffer without HerReplayBuffer); load it into a model with the same replay_buffer_class."
            )
        shapes = {
            "her/ep_start": (rows, self.n_envs),
            "her/ep_length": (rows, self.n_envs),
            "her/current": (self.n_envs,),
        }
        for name, shape in shapes.items():
            every_row = (self.capacity, *shape[1:]) if name != "her/current" else shape  # older files' layout
            if name not in data or data[name].shape not in (shape, every_row):
                found = data[name].shape if name in data else "none"
                raise ValueError(
                    f"{path} holds {name} of shape {found} where its {rows} rows of {self.n_envs} envs take {shape}: "
                    "the file is damaged (or was edited). The buffer is unchanged."
                )
        if self.infos is not None and "her/infos" in data:
            try:
                json.loads(data["her/infos"].tobytes())
            except ValueError as error:
                raise ValueError(
                    f"{path} holds infos that are not the JSON covey writes ({error}): the file is damaged (or was "
                    "edited). The buffer is unchanged."
                ) from None

    def _load_extra(self, data) -> None:
        fill_rows(self.ep_start, data["her/ep_start"])
        fill_rows(self.ep_length, data["her/ep_length"])
        self._current_ep_start[:] = data["her/current"]
        if self.infos is not None:
            if "her/infos" in data:
                rows = json.loads(data["her/infos"].tobytes())
            else:
                rows = []
                warn_user(
                    "The replay buffer file holds no infos (it was saved without copy_info_dict, or its infos "
                    "were not plain data): compute_reward gets empty infos for its steps."
                )
            for row in range(self.capacity):
                decoded = rows[row] if row < len(rows) else None
                for e in range(self.n_envs):
                    self.infos[row, e] = _decode(decoded[e]) if decoded is not None else {}


def _plain_info(info: dict, dropped: dict[str, str]) -> Any:
    """One step's info as JSON data (:func:`_encode`), without the entries that are not plain data, which are
    recorded in ``dropped`` (the key's repr -> what its value was)."""
    kept = {}
    for key, value in info.items():
        try:
            if not isinstance(key, str):
                raise TypeError(f"a key of type {type(key).__name__}")
            kept[key] = _encode(value)
        except TypeError as err:
            dropped.setdefault(repr(key), str(err))
    return {_TAG: "dict", "items": kept}


def _encode(value: Any) -> Any:
    """``value`` as JSON data, with what JSON has no type for tagged; a TypeError names what cannot be."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufU":
        kind = "array" if isinstance(value, np.ndarray) else "scalar"
        return {_TAG: kind, "dtype": value.dtype.str, "shape": list(np.shape(value)), "data": value.tolist()}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(item) for item in value]}
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {_TAG: "dict", "items": {key: _encode(item) for key, item in value.items()}}
    what = f"a dict with keys {list(value)!r}" if isinstance(value, dict) else f"a value of type {type(value).__name__}"
    raise TypeError(what)


def _decode(value: Any) -> Any:
    """What :func:`_encode` wrote, as it was."""
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    kind = value[_TAG]
    if kind == "dict":
        return {key: _decode(item) for key, item in value["items"].items()}
    if kind == "tuple":
        return tuple(_decode(item) for item in value["items"])
    array = np.array(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return array if kind == "array" else array[()]
