"""Everything a user may pass as ``env`` becomes an SB3 ``VecEnv``.

covey speaks SB3's VecEnv protocol (so SB3's wrappers, callbacks and ``evaluate_policy`` work), and
adds two adapters: a lean in-process VecEnv and a view of a Gymnasium vector env.
"""

from __future__ import annotations

import copy
import os
import re
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from gymnasium import spaces
from stable_baselines3.common.env_util import is_wrapped
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.util import dict_to_obs

from covey.spaces import check_observation_space, is_image_space

API_SYMPTOMS = (ValueError, TypeError, KeyError, IndexError)
"""What SB3's DummyVecEnv raises on an env off the Gymnasium API (unpacking, broadcasting, a missing Dict key)."""

GYMNASIUM_API = (
    "covey steps Gymnasium envs, as SB3 2.x does: reset(seed=None, options=None) returns (observation, info) and "
    "step(action) returns (observation, reward, terminated, truncated, info), with observations of the env's "
    "observation_space. Update the env (an old Gym env can be wrapped with shimmy's GymV21CompatibilityV0); "
    "stable_baselines3.common.env_checker.check_env(env) lists every mismatch."
)


_IMMUTABLE = (int, float, bool, complex, str, bytes, type(None), np.generic)


def own_info(info: dict) -> dict:
    """A deep copy of a step's ``info``, as SB3's ``DummyVecEnv`` gives, that copies only its mutable values: an env
    may update an array of its info, or the dict itself, in place at its next step."""
    return {key: value if isinstance(value, _IMMUTABLE) else copy.deepcopy(value) for key, value in info.items()}


class FastVecEnv(DummyVecEnv):
    """SB3's ``DummyVecEnv`` with fewer copies per step.

    Semantics are DummyVecEnv's: auto-reset, ``info["terminal_observation"]`` and
    ``info["TimeLimit.truncated"]``, and each step's infos are deep copies (:func:`own_info` copies only their
    mutable values, where DummyVecEnv deep-copies the whole list). Observations are copied once out of the
    buffer, and one of another shape than the space's is named (DummyVecEnv's NumPy assignment broadcasts a
    ``(1,)`` observation into every entry).
    """

    def reset(self):
        try:
            obs = super().reset()
        except API_SYMPTOMS as exc:
            self._explain(exc, "reset")
            raise
        for i, info in enumerate(self.reset_infos):
            if not isinstance(info, dict):  # an old-API reset() returned a 2-long observation, split in two
                raise ValueError(env_api_problem(_inner(self.envs[i]), "reset") or _reset_info_problem(info))
        return obs

    def _save_obs(self, env_idx: int, obs: Any) -> None:
        for key in self.keys:
            try:
                value = obs if key is None else obs[key]
            except (KeyError, TypeError, IndexError):  # a Dict observation without the key, or not a dict
                problem = observation_problem(obs, self.observation_space)
                if problem is None:
                    raise
                raise ValueError(f"The env returned an observation {problem}. {GYMNASIUM_API}") from None
            if np.shape(value) != self.buf_obs[key].shape[1:]:
                # NumPy would broadcast an observation of shape (1,) or () into every entry, silently.
                problem = observation_problem(obs, self.observation_space)
                if problem is not None:
                    raise ValueError(f"The env returned an observation {problem}. {GYMNASIUM_API}")
            self.buf_obs[key][env_idx] = value

    def step_wait(self):
        infos = []
        i, no_number = 0, None
        try:
            for i, env in enumerate(self.envs):
                obs, reward, terminated, truncated, info = env.step(self.actions[i])
                if not isinstance(info, dict):
                    raise ValueError(_info_problem(f"{type(env.unwrapped).__name__}.step()", info))
                info = own_info(info)  # this step's own: an env may update its info's arrays or dict in place
                done = terminated or truncated
                info["TimeLimit.truncated"] = truncated and not terminated
                if done:
                    info["terminal_observation"] = np.copy(obs) if isinstance(obs, np.ndarray) else copy.deepcopy(obs)
                    obs, self.reset_infos[i] = env.reset()
                self._save_obs(i, obs)
                if not_a_scalar(reward):  # NumPy before 2.4 stores an array of one element, silently
                    no_number = reward_problem(f"{type(env.unwrapped).__name__}.step()", reward)
                    break
                self.buf_rews[i] = reward
                self.buf_dones[i] = done
                infos.append(info)
        except API_SYMPTOMS as exc:
            # Raised by the env's own code: its error says what went wrong (stepping it again to look for an API
            # problem would move it on a step). Raised where a wrapper or this VecEnv read what it returned (a
            # 4-tuple unpacked, a reward of shape (1,) made a float): the copy that failed is stepped once more
            # with the same action, to name the problem.
            if _raised_reading_returns(exc):
                problem = env_api_problem(_inner(self.envs[i]), "step", self.actions[i])
                if problem is not None:
                    raise ValueError(problem) from exc
            raise
        if no_number is not None:
            raise ValueError(no_number)
        return self._obs_from_buf(), self.buf_rews.copy(), self.buf_dones.copy(), infos

    def _explain(self, exc: Exception, call: str) -> None:
        """Raise a clear error where ``exc`` (raised by ``reset()``) came from an env that breaks the Gymnasium API
        (:func:`env_api_problem`); return where none does (``exc`` is then the env's own error)."""
        for env in self.envs:
            problem = env_api_problem(_inner(env), call)
            if problem is not None:
                raise ValueError(problem) from exc

    def _obs_from_buf(self):
        return dict_to_obs(self.observation_space, {k: v.copy() for k, v in self.buf_obs.items()})


_READERS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep for path in (gym.__file__, stable_baselines3.__file__, __file__)
)


def _raised_reading_returns(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in Gymnasium's wrappers, SB3's Monitor or this module, which read what an env
    returned, rather than in the env's own code (the innermost Python frame of its traceback)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_READERS)


def _inner(env: gym.Env) -> gym.Env:
    """The env under the ``Monitor`` that :func:`as_vec_env` adds (the user's env, whose API is in question)."""
    return env.env if isinstance(env, Monitor) else env


def _info_problem(name: str, info: Any) -> str:
    return f"{name} returned the info {info!r}, where a dict belongs ({{}} for none). {GYMNASIUM_API}"


def _reset_info_problem(info: Any) -> str:
    return f"The env's reset() gave {info!r} where the info dict belongs. {GYMNASIUM_API}"


def env_api_problem(env: gym.Env, call: str, action: Any = None) -> str | None:
    """How ``env`` breaks the Gymnasium API in ``call`` ("reset", or "step" with ``action``), found by calling it
    once more (only after that call failed), or None where nothing does."""
    name = f"{type(env.unwrapped).__name__}.{call}()"
    try:
        out = env.reset(seed=None) if call == "reset" else env.step(action)
    except TypeError as exc:
        if call == "reset" and "seed" in str(exc):
            return f"{name} takes no seed argument ({exc}). {GYMNASIUM_API}"
        return None
    except Exception:  # the env fails on its own; its own error says more
        return None
    n = 2 if call == "reset" else 5
    if not isinstance(out, tuple) or len(out) != n:
        expected = "(observation, info)" if n == 2 else "(observation, reward, terminated, truncated, info)"
        return f"{name} returned {returned(out)}, not {expected}. {GYMNASIUM_API}"
    if call == "reset" and not isinstance(out[1], dict):
        return _reset_info_problem(out[1])
    if call == "step" and not isinstance(out[4], dict):
        return _info_problem(name, out[4])
    reward = out[1] if call == "step" else 0.0  # a list first: np.ndim of a ragged one raises
    if not_a_scalar(reward) or np.ndim(reward) != 0 or isinstance(reward, (str, bytes, type(None))):
        return reward_problem(name, out[1])
    problem = observation_problem(out[0], env.observation_space)
    if problem is not None:
        return f"{name} returned an observation {problem}. {GYMNASIUM_API}"
    return None


def not_a_scalar(value: Any) -> bool:
    """Whether ``value`` is a list, a tuple or an array of one or more dimensions: no reward, where NumPy before 2.4
    stores an array of one element as its number, silently (cheap: a type check first)."""
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim > 0)


def shape_words(value: Any) -> str:
    """ " of shape (1,)" for an array (or a list NumPy reads as one), "" for a scalar or a ragged list."""
    try:
        return f" of shape {np.shape(value)}" if np.ndim(value) else ""
    except ValueError:  # a ragged list, which NumPy reads as no array
        return ""


def reward_problem(name: str, reward: Any) -> str:
    """The error for a reward that is no number, returned by the call ``name``."""
    return (
        f"{name} returned the reward {reward!r}{shape_words(reward)}, where one float belongs (for an array of one "
        f"element, float(reward) or reward.item() in the env or a wrapper). {GYMNASIUM_API}"
    )


def returned(out: Any) -> str:
    """What a call returned, in words: "4 values" for a tuple, "one ndarray" otherwise."""
    return f"{len(out)} values" if isinstance(out, tuple) else f"one {type(out).__name__}"


def observation_problem(obs: Any, space: spaces.Space) -> str | None:
    """Why ``obs`` cannot be stored as an observation of ``space`` (its shape, or a Dict's keys), or None."""
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict):
            return f"of type {type(obs).__name__}, where the observation_space is a Dict with keys {list(space.spaces)}"
        missing = [k for k in space.spaces if k not in obs]
        if missing:
            return f"without the keys {missing} of the observation_space's Dict"
        for key, sub in space.spaces.items():
            problem = observation_problem(obs[key], sub)
            if problem is not None:
                return f"whose key {key!r} is {problem}"
        return None
    if space.shape is None:
        return None
    if obs is None or isinstance(obs, (dict, str)):  # np.shape would call it "of shape ()"
        return f"of type {type(obs).__name__}, where the observation_space is {space}"
    if np.shape(obs) != tuple(space.shape):  # NumPy would broadcast a (1,) or () observation into every entry
        return f"of shape {np.shape(obs)}, where the observation_space {space} has shape {tuple(space.shape)}"
    return None


class GymnasiumVecEnv(VecEnv):
    """An SB3 VecEnv view of a ``gymnasium.vector.VectorEnv`` (any autoreset mode).

    Done sub-envs are reset in the same step, their final observation goes to
    ``info["terminal_observation"]`` and finished episodes get SB3's ``info["episode"]`` statistics (the
    env's own where it gives them). Each copy's infos are its own entries of the vector env's batched infos (of
    its final step, for a copy that ended). With next-step or no autoreset, a finished copy is reset alone with
    ``reset(options={"reset_mask": ...})``, which Gymnasium's ``SyncVectorEnv`` and ``AsyncVectorEnv`` honour.
    """

    def __init__(self, venv: gym.vector.VectorEnv) -> None:
        self.venv = venv
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        mode = venv.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self.same_step = mode == gym.vector.AutoresetMode.SAME_STEP
        base = venv.unwrapped
        if not self.same_step and not isinstance(base, (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)):
            raise ValueError(
                f"{type(base).__name__} resets its copies with {mode}, and covey resets a finished copy in the "
                "step it ends, as SB3's VecEnvs do, with reset(options={'reset_mask': ...}): only Gymnasium's "
                "SyncVectorEnv and AsyncVectorEnv reset the masked copies alone (a vector env of its own, such as "
                "CartPole's, resets every copy). Make it with gym.make_vec(env_id, n, vectorization_mode='sync'), "
                "or use an SB3 VecEnv (make_vec_env(env_id, n))."
            )
        wrappers = _vector_wrappers(venv)
        refused = {
            "DictInfoToList": "covey reads Gymnasium's batched infos and gives SB3's per-copy list itself: leave it out"
        }
        if not self.same_step:
            refused["NormalizeObservation"] = (
                "it refuses the partial resets covey makes: normalize each copy with gym.make_vec(env_id, n, "
                "vectorization_mode='sync', wrappers=[gym.wrappers.NormalizeObservation]), or use SB3's VecNormalize"
            )
        for wrapper in wrappers:
            reason = refused.get(type(wrapper).__name__) if type(wrapper).__module__.startswith("gymnasium.") else None
            if reason is not None:
                raise ValueError(
                    f"Gymnasium's vector {type(wrapper).__name__} cannot wrap an env covey trains on: {reason}."
                )
        # Gymnasium's vector wrappers that count per copy restart every copy's count at a partial reset (a
        # RecordEpisodeStatistics does not see the reset_mask, which SyncVectorEnv takes out of the options they
        # share; a NormalizeReward ignores it): the copies not reset keep their counts (_reset_copies).
        self._per_copy_state = [
            (wrapper, [name for name in names if hasattr(wrapper, name)])
            for wrapper in wrappers
            for kind, names in _PER_COPY_STATE
            if isinstance(wrapper, kind)
        ]
        # With copy=False the vector env hands back its own arrays, which its next step writes over.
        self._shares_arrays = not getattr(base, "copy", True)
        self.render_mode = getattr(venv, "render_mode", None)
        self._ep_return = np.zeros(self.num_envs)
        self._ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self._t0 = time.time()
        self._actions: np.ndarray | None = None

    def reset(self):
        seeds, options = list(self._seeds), self._options[0]
        self._reset_seeds()
        self._reset_options()
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        # VecEnv.seed(s) asks for seeds s, s+1, ...: one int to a Gymnasium vector env (any takes one), otherwise
        # a list (Gymnasium's SyncVectorEnv and AsyncVectorEnv take one)
        if all(s is None for s in seeds):
            seed = None
        elif seeds[0] is not None and seeds == [seeds[0] + i for i in range(self.num_envs)]:
            seed = int(seeds[0])  # (Gymnasium takes Python ints, not NumPy's)
        else:
            seed = [None if s is None else int(s) for s in seeds]
        obs, info = self.venv.reset(seed=seed, options=dict(options) or None)
        self.reset_infos = [_copy_info(info, i) for i in range(self.num_envs)]
        return self._own(obs)

    def set_options(self, options: list[dict] | dict | None = None) -> None:
        """SB3's: options for the next reset, one dict for every copy (a Gymnasium vector env resets its copies with
        one); a list of different dicts is refused."""
        if isinstance(options, (list, tuple)) and any(not _same_options(o, options[0]) for o in options):
            raise ValueError(
                f"set_options got different options per copy ({options!r}), but a Gymnasium vector env resets its "
                "copies with one options dict. Pass one dict for all copies, or use an SB3 VecEnv "
                "(stable_baselines3.common.env_util.make_vec_env), whose copies take options of their own."
            )
        super().set_options(options)

    def _own(self, obs):
        """The observations as arrays of covey's own (where the vector env hands back its own, copy=False)."""
        return copy.deepcopy(obs) if self._shares_arrays else obs

    def _reset_copies(self, mask: np.ndarray) -> tuple[Any, dict]:
        """Reset the copies of ``mask`` alone; the counts of the vector wrappers that keep some per copy (episode
        statistics, a NormalizeReward's discounted return) stay as they were for the others."""
        saved = [
            (w, name, np.array(getattr(w, name), copy=True)) for w, names in self._per_copy_state for name in names
        ]
        obs, info = self.venv.reset(options={"reset_mask": mask.copy()})
        others = ~mask
        for wrapper, name, before in saved:
            getattr(wrapper, name)[others] = before[others]
        return self._own(obs), info

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self):
        obs, rewards, terminated, truncated, info = self.venv.step(self._actions)
        obs = self._own(obs)
        dones = np.logical_or(terminated, truncated)
        self._ep_return += rewards
        self._ep_length += 1
        final_info = info.get("final_info") if self.same_step else None
        infos = [_copy_info(final_info if done and final_info is not None else info, i) for i, done in enumerate(dones)]
        if dones.any():
            if self.same_step:
                final_obs = info["final_obs"]
                reset_info = info  # the reset copies' infos, beside their final ones
            else:
                # Next-step (or disabled) autoreset: the returned observation is the final one; reset the finished
                # copies now.
                final_obs = obs
                reset_obs, reset_info = self._reset_copies(dones)
                obs = _where_envs(dones, reset_obs, obs)
            for i in np.flatnonzero(dones):
                self.reset_infos[i] = _copy_info(reset_info, i)
                infos[i]["terminal_observation"] = _env_slice(final_obs, i)
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                elapsed = round(time.time() - self._t0, 6)
                # rounded as SB3's Monitor rounds it
                episode = {"r": round(float(self._ep_return[i]), 6), "l": int(self._ep_length[i]), "t": elapsed}
                # The env's own statistics, where it gives them: a copy's (in its final infos) or a vector
                # RecordEpisodeStatistics' (beside them), as plain numbers
                own = infos[i].get("episode")
                if own is None:
                    own = _copy_info({k: info[k] for k in ("episode", "_episode") if k in info}, i).get("episode")
                infos[i]["episode"] = episode if own is None else _plain_numbers(own)
            self._ep_return[dones] = 0.0
            self._ep_length[dones] = 0
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        if attr_name == "render_mode":  # native vector envs (e.g. CartPoleVectorEnv) keep it on themselves
            return [getattr(self.venv, "render_mode", None) for _ in self._get_indices(indices)]
        values = self.venv.unwrapped.get_attr(attr_name)  # the copies' (Gymnasium's vector wrappers do not pass it)
        return [values[i] for i in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        chosen = set(self._get_indices(indices))
        values = [value] * self.num_envs  # a list: Gymnasium takes one value per copy (a list value stays whole)
        if len(chosen) < self.num_envs:  # the other copies keep theirs
            current = self.venv.unwrapped.get_attr(attr_name)
            values = [value if i in chosen else current[i] for i in range(self.num_envs)]
        self.venv.unwrapped.set_attr(attr_name, values)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        chosen = list(self._get_indices(indices))
        if sorted(chosen) == list(range(self.num_envs)):
            results = self.venv.unwrapped.call(method_name, *method_args, **method_kwargs)
            return [results[i] for i in chosen]
        envs = getattr(self.venv.unwrapped, "envs", None)
        if envs is None:
            raise ValueError(
                f"env_method({method_name!r}, indices={indices}): {type(self.venv.unwrapped).__name__} calls a "
                "method on every copy at once; pass indices=None, or use a SyncVectorEnv."
            )
        results = []
        for i in chosen:
            attr = envs[i].get_wrapper_attr(method_name)
            results.append(attr(*method_args, **method_kwargs) if callable(attr) else attr)
        return results

    @property
    def calls_copies_alone(self) -> bool:
        """Whether :meth:`env_method` can call some copies only (a ``SyncVectorEnv``'s, in this process): an
        ``AsyncVectorEnv`` calls a method on every copy at once."""
        return getattr(self.venv.unwrapped, "envs", None) is not None

    def env_is_wrapped(self, wrapper_class, indices=None) -> list[bool]:
        chosen = list(self._get_indices(indices))
        envs = getattr(self.venv.unwrapped, "envs", None)
        if envs is not None:
            return [is_wrapped(envs[i], wrapper_class) for i in chosen]
        # The copies live in worker processes: each tells its wrappers' class names (a gym.Wrapper's str is
        # "<Outer<Inner<...<Env>>>"), matched against wrapper_class's name and its subclasses' (isinstance).
        names, todo = set(), [wrapper_class]
        while todo:
            cls = todo.pop()
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())
        chains = self.venv.unwrapped.call("__str__")
        return [bool(names & set(re.findall(r"<(\w+)", str(chains[i])))) for i in chosen]

    def get_images(self):
        return list(self.venv.render() or [])


class VecImageLayout(VecEnvWrapper):
    """An image VecEnv's observations with each image's channel axis moved (HWC <-> CHW) to where
    ``observation_space``, a model's, has it (terminal observations in the infos too): a model trained on
    channel-last images steps a ``VecTransposeImage`` env, and one trained on channel-first images a raw one,
    as SB3's models take either. Build it where :func:`image_layout_moves` finds moves."""

    def __init__(self, venv: VecEnv, observation_space: spaces.Space) -> None:
        self.moves = image_layout_moves(venv.observation_space, observation_space)
        super().__init__(venv, observation_space=observation_space)

    def _fit(self, obs):
        if isinstance(obs, dict):
            return {k: np.moveaxis(v, *self.moves[k]) if k in self.moves else v for k, v in obs.items()}
        return np.moveaxis(obs, *self.moves[None])

    def reset(self):
        return self._fit(self.venv.reset())

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        for info in infos:
            if "terminal_observation" in info:  # one env's, unbatched: the moves count axes from the end
                info["terminal_observation"] = self._fit(info["terminal_observation"])
        return self._fit(obs), rewards, dones, infos


def image_layout_moves(space: spaces.Space, target: spaces.Space) -> dict[str | None, tuple[int, int]]:
    """``{key: (source axis, destination axis)}`` (key None for a Box) that turn observations of ``space`` into
    ``target``'s, when the two differ only in where their images keep the channel axis; empty otherwise."""
    if isinstance(space, spaces.Dict) and isinstance(target, spaces.Dict):
        if list(space.spaces) != list(target.spaces):
            return {}
        moves = {}
        for key, sub in space.spaces.items():
            move = image_layout_moves(sub, target.spaces[key]).get(None)
            if move is not None:
                moves[key] = move
            elif sub != target.spaces[key]:
                return {}
        return moves
    if not (is_image_space(space) and is_image_space(target)) or space == target:
        return {}
    for move in ((-3, -1), (-1, -3)):  # CHW -> HWC, HWC -> CHW
        moved = spaces.Box(np.moveaxis(space.low, *move), np.moveaxis(space.high, *move), dtype=space.dtype)
        if moved == target:
            return {None: move}
    return {}


def _same_options(a: Any, b: Any) -> bool:
    """Whether two copies' options are equal, arrays in them compared by value."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_options(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_options, a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x for x in (a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        try:
            return np.array_equal(a, b, equal_nan=True)
        except TypeError:  # an array of objects, which NaN cannot be among
            return np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:  # NaN, as the same value
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError, RuntimeError):  # a value without a truth value: the same object only
        return a is b


_PER_COPY_STATE = (
    (
        gym.wrappers.vector.RecordEpisodeStatistics,
        ("episode_start_times", "episode_returns", "episode_lengths", "prev_dones"),
    ),
    (gym.wrappers.vector.NormalizeReward, ("accumulated_reward", "_prev_dones")),
)
"""Gymnasium's vector wrappers that count per copy, and their per-copy arrays (``GymnasiumVecEnv._reset_copies``)."""


def _vector_wrappers(venv: gym.vector.VectorEnv) -> list[gym.vector.VectorWrapper]:
    """The Gymnasium vector wrappers around ``venv``'s base vector env, outermost first."""
    wrappers = []
    while isinstance(venv, gym.vector.VectorWrapper):
        wrappers.append(venv)
        venv = venv.env
    return wrappers


def _copy_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Copy ``i``'s entries of a Gymnasium vector env's batched ``info`` (a key's ``_key`` mask says which
    copies have it; nested dicts are batched the same way), as a dict of its own."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        out[key] = _copy_info(value, i) if isinstance(value, dict) else copy.deepcopy(value[i])
    return out


def _plain_numbers(episode: dict[str, Any]) -> dict[str, Any]:
    """An episode's statistics with NumPy scalars as Python numbers, as SB3's Monitor gives them (JSON takes them)."""
    return {
        k: v.item() if isinstance(v, np.generic) or (isinstance(v, np.ndarray) and v.ndim == 0) else v
        for k, v in episode.items()
    }


def _env_slice(obs, i: int):
    if isinstance(obs, dict):
        return {k: v[i] for k, v in obs.items()}
    return obs[i]


def _where_envs(mask: np.ndarray, a, b):
    if isinstance(a, dict):
        return {k: _where_envs(mask, a[k], b[k]) for k in a}
    shape = (-1,) + (1,) * (np.ndim(a) - 1)
    return np.where(mask.reshape(shape), a, b)


def _monitored(make: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        env = make()
        return env if is_wrapped(env, Monitor) else Monitor(env)

    return thunk


def _say_wrapping(env: gym.Env, verbose: int) -> None:
    """SB3's words (``verbose >= 1``) for the wrappers a single env gets: a Monitor (where it has none), then the
    vector env (a DummyVecEnv there, covey's :class:`FastVecEnv`, a subclass of it, here)."""
    if verbose >= 1:
        if not is_wrapped(env, Monitor):
            print("Wrapping the env with a `Monitor` wrapper")
        print("Wrapping the env in a DummyVecEnv.")


def make_named(env_id: str) -> gym.Env:
    """``gym.make(env_id)`` with ``render_mode="rgb_array"`` where the env takes one, as SB3 makes an env from
    its id (so that ``model.get_env().render()`` returns frames, e.g. to record a video or a GIF)."""
    try:
        return gym.make(env_id, render_mode="rgb_array")
    except TypeError:  # an env constructor without a render_mode argument
        return gym.make(env_id)


def as_vec_env(env: str | gym.Env | VecEnv | gym.vector.VectorEnv, n_envs: int = 1, verbose: int = 0) -> VecEnv:
    """Wrap what a user passes as ``env`` into a VecEnv, as SB3 does, saying so with ``verbose >= 1`` in SB3's
    words.

    - an env id: ``n_envs`` copies made with ``gym.make`` (:func:`make_named`), each wrapped in SB3's ``Monitor``;
    - a Gymnasium env: wrapped in ``Monitor`` (unless it is already) and vectorized;
    - an SB3 VecEnv: used as it is;
    - a Gymnasium vector env: adapted with :class:`GymnasiumVecEnv`.
    """
    if isinstance(env, VecEnv):
        return env
    if isinstance(env, gym.vector.VectorEnv):
        return GymnasiumVecEnv(env)
    if isinstance(env, str):
        env_id = env
        if verbose >= 1:
            print(f"Creating environment from the given name '{env_id}'")
        first = make_named(env_id)
        check_observation_space(first.observation_space)
        _say_wrapping(first, verbose)
        makers = [lambda: first] + [lambda: make_named(env_id) for _ in range(n_envs - 1)]
        return FastVecEnv([_monitored(make) for make in makers])
    if isinstance(env, gym.Env):
        # Check before vectorizing: SB3's buffers cannot even be allocated for unsupported spaces.
        check_observation_space(env.observation_space)
        _say_wrapping(env, verbose)
        return FastVecEnv([_monitored(lambda: env)])
    raise TypeError(
        f"env must be a Gymnasium env id, a gymnasium.Env, a gymnasium vector env or an SB3 VecEnv, "
        f"got {type(env).__name__}. (For PettingZoo envs, use covey's POCA.)"
    )
