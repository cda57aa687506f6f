"""The env adapters: every accepted kind of env becomes an SB3 VecEnv with SB3's done/final-observation rules."""

import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from covey import PPO
from covey.wrappers import FastVecEnv, GymnasiumVecEnv, as_vec_env


class CountEnv(gym.Env):
    """Observation = steps taken in this episode; reward 1 per step; ends after ``length`` steps."""

    def __init__(self, length: int = 3, truncate: bool = False):
        self.observation_space = spaces.Box(0, 100, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.truncate = length, truncate

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        info = {"t": self.t, "is_success": end}
        return np.array([self.t], np.float32), 1.0, end and not self.truncate, end and self.truncate, info

    def bump(self, by=1):
        self.bumps = getattr(self, "bumps", 0) + by
        return self.bumps


GYMNASIUM = tuple(int(part) for part in gym.__version__.split(".")[:2])
MODES = [gym.vector.AutoresetMode.NEXT_STEP, gym.vector.AutoresetMode.SAME_STEP, gym.vector.AutoresetMode.DISABLED]


@pytest.mark.parametrize("copy_obs", [True, False], ids=["copied", "shared-buffer"])
@pytest.mark.parametrize("mode", MODES)
def test_gymnasium_vector_env_follows_sb3_done_rules(mode, copy_obs):
    """A done env reports its final observation and its final step's infos, and has already been reset, in every
    autoreset mode (also where the vector env writes every step into one array)."""
    fns = [lambda: CountEnv(3), lambda: CountEnv(2)]
    venv = GymnasiumVecEnv(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode, copy=copy_obs))
    first = venv.reset()
    np.testing.assert_array_equal(first[:, 0], [0, 0])
    second, rew, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(second[:, 0], [1, 1])
    obs, rew, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
    # each step's observations are arrays of their own, which later steps leave as they were (a rollout keeps them)
    np.testing.assert_array_equal(first[:, 0], [0, 0])
    np.testing.assert_array_equal(second[:, 0], [1, 1])
    np.testing.assert_array_equal(dones, [False, True])
    np.testing.assert_array_equal(obs[:, 0], [2, 0])  # env 1 was reset in the same step
    assert infos[1]["terminal_observation"][0] == 2
    assert infos[1]["episode"]["r"] == 2.0 and infos[1]["episode"]["l"] == 2
    assert infos[1]["TimeLimit.truncated"] is False
    assert (infos[0]["t"], infos[0]["is_success"], infos[1]["t"], infos[1]["is_success"]) == (2, False, 2, True)
    obs, rew, dones, infos = venv.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(dones, [True, False])
    np.testing.assert_array_equal(obs[:, 0], [0, 1])
    assert infos[0]["terminal_observation"][0] == 3
    np.testing.assert_array_equal(rew, [1.0, 1.0])  # the reset env's step is a real step, not a 0-reward filler


def test_fast_vec_env_matches_dummy_vec_env():
    """FastVecEnv returns what SB3's DummyVecEnv returns, step for step."""

    def make():
        return [lambda: CountEnv(3, truncate=True), lambda: CountEnv(2)]

    fast, dummy = FastVecEnv(make()), DummyVecEnv(make())
    for a, b in zip([fast.reset()], [dummy.reset()]):
        np.testing.assert_array_equal(a, b)
    for _ in range(7):
        actions = np.zeros(2, dtype=np.int64)
        for x, y in zip(fast.step(actions)[:3], dummy.step(actions)[:3]):
            np.testing.assert_array_equal(x, y)


def test_as_vec_env_accepts_every_kind_of_env():
    """Ids, env objects, SB3 VecEnvs and Gymnasium vector envs are accepted; anything else is a clear TypeError."""
    assert as_vec_env("CartPole-v1").num_envs == 1
    assert as_vec_env(gym.make("CartPole-v1")).num_envs == 1
    dummy = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    assert as_vec_env(dummy) is dummy
    assert isinstance(as_vec_env(gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")), GymnasiumVecEnv)
    with pytest.raises(TypeError, match="Gymnasium env id"):
        as_vec_env(42)


class _NoRenderModeEnv(gym.Env):
    """An env whose constructor takes no arguments at all (no render_mode)."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        pass

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


@pytest.mark.filterwarnings("ignore:.*render_mode='rgb_array' that is not in the possible render_modes")
def test_an_env_id_is_made_with_rgb_array_rendering_as_sb3_makes_it():
    """So that model.get_env().render() returns frames (SB3's "make a GIF" recipe); an env whose constructor
    takes no render_mode is still made."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    assert model.get_env().envs[0].render_mode == "rgb_array"
    model.get_env().reset()
    frame = model.get_env().render()
    assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3
    gym.register("CoveyTestNoRenderMode-v0", entry_point=_NoRenderModeEnv)
    try:
        venv = as_vec_env("CoveyTestNoRenderMode-v0", n_envs=2)
        assert venv.num_envs == 2 and venv.reset().shape == (2, 2)
    finally:
        gym.registry.pop("CoveyTestNoRenderMode-v0")


def test_ppo_trains_on_gymnasium_vector_env():
    """PPO accepts a Gymnasium vector env and records SB3-style episode statistics from it."""
    venv = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, seed=0)
    model.learn(256)
    assert model.num_timesteps == 256
    assert len(model.ep_info_buffer) > 0


def test_a_vector_env_that_resets_every_copy_at_once_is_refused():
    """CartPole's own vector env (gym.make_vec's default for it) resets every copy when asked to reset one: each
    episode's end would have cut every other copy's episode."""
    with pytest.raises(ValueError, match="CartPoleVectorEnv resets its copies with.*vectorization_mode='sync'"):
        PPO("MlpPolicy", gym.make_vec("CartPole-v1", num_envs=2))


def test_episode_statistics_of_gymnasium_vector_envs_are_monitors_numbers():
    """covey's own episode count is rounded as SB3's Monitor rounds it, and a vector RecordEpisodeStatistics'
    NumPy scalars come as Python numbers (ep_rew_mean differed from Monitor's in its last digits, and the
    statistics did not go to JSON)."""
    import json

    def tenths():
        return gym.wrappers.TransformReward(CountEnv(length=3), lambda r: 0.1 * r)  # 0.1 + 0.1 + 0.1

    monitor = DummyVecEnv([lambda: Monitor(tenths())])
    same_step = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    gymnasium_envs = [
        as_vec_env(gym.vector.SyncVectorEnv([tenths])),
        as_vec_env(gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv([tenths], **same_step))),
    ]
    for venv in [monitor, *gymnasium_envs]:
        venv.reset()
        for _ in range(2):
            _, _, dones, infos = venv.step(np.zeros(1, dtype=np.int64))
        _, _, dones, infos = venv.step(np.zeros(1, dtype=np.int64))
        episode = infos[0]["episode"]
        assert dones[0] and type(episode["r"]) is float and type(episode["l"]) is int, episode
        json.dumps(episode)
        expected = 0.3 if venv is not gymnasium_envs[1] else 0.1 + 0.1 + 0.1  # the wrapper's own sum, unrounded
        assert (episode["r"], episode["l"]) == (expected, 3)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_env_is_wrapped_looks_into_gymnasium_copies(mode):
    """evaluate_policy reads Monitor's episode returns only where env_is_wrapped(Monitor) says so: copies of a
    Gymnasium vector env wrapped in Monitor, then in a reward scale, score their raw returns as DummyVecEnv's do
    (they scored the scaled ones, and evaluate_policy warned that no Monitor was there)."""
    from stable_baselines3.common.evaluation import evaluate_policy

    def scale(env):
        return gym.wrappers.TransformReward(env, lambda r: 10.0 * r)

    wrappers = [Monitor, scale]
    venv = as_vec_env(gym.make_vec("CartPole-v1", 2, vectorization_mode=mode, wrappers=wrappers))
    bare = as_vec_env(gym.make_vec("CartPole-v1", 2, vectorization_mode=mode))
    try:
        assert venv.env_is_wrapped(Monitor) == [True, True] and venv.env_is_wrapped(Monitor, indices=[1]) == [True]
        assert bare.env_is_wrapped(Monitor) == [False, False]
        assert venv.env_is_wrapped(gym.wrappers.TransformReward) == [True, True]
        assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, True]  # a wrapper with no names of its own
        assert venv.env_is_wrapped(gym.Wrapper) == [True, True]  # the base class, as isinstance says
        for absent in (gym.wrappers.TimeAwareObservation, gym.wrappers.FlattenObservation, gym.wrappers.ClipReward):
            assert venv.env_is_wrapped(absent) == [False, False], absent  # wrappers of the same methods
        if mode == "sync":
            model = PPO("MlpPolicy", "CartPole-v1", seed=0)
            dummy = DummyVecEnv([lambda: scale(Monitor(gym.make("CartPole-v1")))] * 2)
            dummy.seed(0)
            venv.seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no "not wrapped with a Monitor" warning
                assert evaluate_policy(model, venv, n_eval_episodes=4) == evaluate_policy(model, dummy, 4)
    finally:
        venv.close()
        bare.close()


def test_env_method_and_set_attr_reach_only_the_copies_named():
    """As SB3's VecEnvs: indices choose the copies, and a list value is one value for each."""
    venv = GymnasiumVecEnv(gym.vector.SyncVectorEnv([lambda: CountEnv(3)] * 3))
    assert venv.env_method("bump", indices=[0]) == [1]
    assert venv.env_method("bump", 5, indices=[1, 2]) == [5, 5]
    assert venv.env_method("bump") == [2, 6, 6]
    venv.set_attr("length", 7, indices=[1])
    assert venv.get_attr("length") == [3, 7, 3]
    venv.set_attr("layout", [1, 2, 3])
    assert venv.get_attr("layout") == [[1, 2, 3]] * 3


def test_env_calls_pass_gymnasiums_vector_wrappers():
    """get_attr, set_attr and env_method reach the copies under Gymnasium's vector wrappers, which do not pass
    them on (AttributeErrors before)."""
    base = gym.vector.SyncVectorEnv([lambda: CountEnv(3)] * 2)
    venv = GymnasiumVecEnv(gym.wrappers.vector.RecordEpisodeStatistics(gym.wrappers.vector.ClipReward(base, 0, 1)))
    venv.set_attr("length", 5, indices=[1])
    assert venv.get_attr("length") == [3, 5]
    assert venv.env_method("bump", 2) == [2, 2]


class LengthLog(gym.Wrapper):
    """Records each episode's true length (and return: CountEnv pays 1 a step)."""

    def __init__(self, env):
        super().__init__(env)
        self.lengths, self.t = [], 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        out = self.env.step(action)
        self.t += 1
        if out[2] or out[3]:
            self.lengths.append(self.t)
        return out


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            mode,
            marks=pytest.mark.skipif(
                mode == gym.vector.AutoresetMode.SAME_STEP and GYMNASIUM < (1, 4),
                reason="Gymnasium before 1.4 counts same-step episodes wrong in RecordEpisodeStatistics itself",
            ),
        )
        for mode in MODES
    ],
)
def test_a_vector_record_episode_statistics_gives_the_true_episodes(mode):
    """Gymnasium's vector RecordEpisodeStatistics, under a reward wrapper: the episodes logged, and those in the
    wrapper's own queues (which scripts read), are the copies' own in every autoreset mode. With next-step or no
    autoreset covey's partial resets restarted every copy's count in the wrapper (the copies not reset keep theirs
    now); with same-step autoreset its numbers, beside the final infos, were passed over."""
    fns = [lambda n=n: LengthLog(CountEnv(n)) for n in (3, 5, 7)]
    stats = gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode))
    venv = gym.wrappers.vector.TransformReward(stats, lambda r: 10 * r)
    model = PPO("MlpPolicy", venv, n_steps=35, batch_size=105, n_epochs=1, seed=0).learn(105)
    true = sorted(sum(stats.unwrapped.get_attr("lengths"), []))
    assert true == sorted([3] * 11 + [5] * 7 + [7] * 5)
    assert sorted(int(e["l"]) for e in model.ep_info_buffer) == true
    assert sorted(e["r"] for e in model.ep_info_buffer) == [float(n) for n in true]  # 1 a step, not 10
    assert all(type(e["r"]) is float and type(e["l"]) is int for e in model.ep_info_buffer)  # as Monitor's
    assert sorted(int(n) for n in stats.length_queue) == true
    assert sorted(float(r) for r in stats.return_queue) == [float(n) for n in true]


@pytest.mark.parametrize("mode", MODES[::2], ids=["NEXT_STEP", "DISABLED"])
def test_a_vector_normalize_reward_scales_as_without_partial_resets(mode):
    """Gymnasium's vector NormalizeReward keeps each copy's discounted return; its reset zeroed every copy's at
    covey's partial reset of one, so the rewards trained on were scaled otherwise than under same-step autoreset,
    which makes no partial resets (the episodes are the same: CountEnv's do not depend on the actions)."""

    def rewards(autoreset_mode):
        fns = [lambda n=n: CountEnv(n) for n in (3, 5, 7)]
        venv = gym.wrappers.vector.NormalizeReward(gym.vector.SyncVectorEnv(fns, autoreset_mode=autoreset_mode))
        model = PPO("MlpPolicy", venv, n_steps=35, batch_size=105, n_epochs=1, seed=0).learn(105)
        return model.rollout_buffer.rewards.copy(), venv.return_rms.var

    (expected, expected_var), (got, var) = rewards(gym.vector.AutoresetMode.SAME_STEP), rewards(mode)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert var == pytest.approx(expected_var)


def test_reset_infos_are_each_copys_and_options_are_one_dict_for_every_copy():
    """SB3's VecEnv.reset_infos: each copy's reset info, at reset and at its episode's end. A vector env resets its
    copies with one options dict: one dict for every copy is passed, a list of different ones refused."""

    class InfoOnReset(CountEnv):
        def reset(self, *, seed=None, options=None):
            obs, _ = super().reset(seed=seed, options=options)
            self.resets = getattr(self, "resets", 0) + 1
            return obs, {"resets": self.resets, "options": options}

    for mode in MODES:
        venv = GymnasiumVecEnv(
            gym.vector.SyncVectorEnv([lambda: InfoOnReset(2), lambda: InfoOnReset(3)], autoreset_mode=mode)
        )
        venv.set_options({"level": 2})
        venv.reset()
        assert [(i["resets"], i["options"]) for i in venv.reset_infos] == [(1, {"level": 2})] * 2
        for _ in range(2):
            venv.step(np.zeros(2, dtype=np.int64))
        assert [i["resets"] for i in venv.reset_infos] == [2, 1], mode  # copy 0 ended and was reset
        with pytest.raises(ValueError, match=r"different options per copy .* one options dict.*make_vec_env"):
            venv.set_options([{"level": 1}, {"level": 2}])
        venv.set_options([{"level": 1}, {"level": 1}])  # the same for every copy
        venv.reset()
        assert [i["options"] for i in venv.reset_infos] == [{"level": 1}] * 2
        venv.set_options([{"goal": np.array([1.0, np.nan])} for _ in range(2)])  # equal arrays, other objects
        venv.reset()
        np.testing.assert_array_equal(venv.reset_infos[1]["options"]["goal"], [1.0, np.nan])
        venv.set_options([{"goal": torch.tensor([1.0, 2.0]), "rate": float("nan")} for _ in range(2)])
        venv.reset()
        with pytest.raises(ValueError, match=r"different options per copy"):
            venv.set_options([{"goal": torch.tensor([1.0, 2.0])}, {"goal": torch.tensor([1.0, 3.0])}])


def test_a_vector_env_of_its_own_is_seeded_with_one_int():
    """SB3's seed(s) asks for s, s+1, ...: a vector env of its own (one that resets in the same step, which covey
    takes) seeds from one int, as Gymnasium's VectorEnv.reset takes it; Sync and Async envs get the same seeds."""
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    class SameStepCartPole(CartPoleVectorEnv):
        metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    venv = GymnasiumVecEnv(SameStepCartPole(num_envs=2))
    venv.seed(3)
    first = venv.reset()
    venv.seed(3)
    np.testing.assert_array_equal(venv.reset(), first)
    model = PPO("MlpPolicy", SameStepCartPole(num_envs=2), seed=0, n_steps=8, batch_size=16)
    assert model.learn(16).num_timesteps == 16
    expected = [gym.make("CartPole-v1").reset(seed=s)[0] for s in (3, 4)]
    for mode in ("sync", "async"):
        copies = GymnasiumVecEnv(gym.make_vec("CartPole-v1", 2, vectorization_mode=mode))
        copies.seed(np.int64(3))  # NumPy's ints too, which Gymnasium takes as Python's
        np.testing.assert_array_equal(copies.reset(), expected)
        copies.close()


@pytest.mark.parametrize(
    ("wrap", "message"),
    [
        (gym.wrappers.vector.NormalizeObservation, r"NormalizeObservation cannot wrap.*wrappers=\[gym.wrappers.Norm"),
        (gym.wrappers.vector.DictInfoToList, r"DictInfoToList cannot wrap.*leave it out"),
    ],
    ids=["NormalizeObservation", "DictInfoToList"],
)
def test_vector_wrappers_covey_cannot_train_under_are_refused_with_the_fix(wrap, message):
    """A vector NormalizeObservation refuses covey's partial resets (at the first episode's end, before), and
    DictInfoToList's list of infos broke the adapter: both are named at the constructor; the per-copy
    normalization the message gives trains."""
    with pytest.raises(ValueError, match=message):
        PPO("MlpPolicy", wrap(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")))
    per_copy = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", wrappers=[gym.wrappers.NormalizeObservation])
    assert PPO("MlpPolicy", per_copy, n_steps=64, batch_size=64, seed=0).learn(128).num_timesteps == 128


def test_truncation_bootstraps_from_final_observation():
    """At a time limit the buffer keeps terminated=False and bootstraps from V(true final observation)."""
    env = DummyVecEnv([lambda: CountEnv(3, truncate=True), lambda: CountEnv(2)])
    model = PPO("MlpPolicy", env, n_steps=6, batch_size=12, seed=0)
    _, callback = model._setup_learn(12, None, True, "test", False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buf = model.rollout_buffer
    # env 0 is truncated at steps 2 and 5; env 1 terminates at steps 1, 3, 5.
    np.testing.assert_array_equal(buf.dones[:, 0], [0, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(buf.terminated[:, 0], [0] * 6)
    np.testing.assert_array_equal(buf.terminated[:, 1], [0, 1, 0, 1, 0, 1])
    with torch.no_grad():
        v_final = model.critic(torch.tensor([[3.0]], device=model.device)).item()
    assert buf.truncation_values[2, 0] == pytest.approx(v_final, abs=1e-6)
    assert buf.truncation_values[5, 0] == pytest.approx(v_final, abs=1e-6)
    assert buf.truncation_values[1, 1] == 0.0
    # The return at the truncated step is r + gamma * V(final observation) (lambda-weighted, A = delta there).
    expected = 1.0 + model.gamma * v_final
    assert buf.returns[2, 0] == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------------------------------- envs off the Gymnasium API
class OffApiEnv(CountEnv):
    """CountEnv with one way of breaking the Gymnasium API, as custom envs often do."""

    def __init__(self, fault: str):
        super().__init__(length=5)
        self.fault = fault
        if fault == "reset_obs_only_2d":
            self.observation_space = spaces.Box(0, 100, (2,), np.float32)
        if fault in ("dict_missing_key", "dict_key_lost"):
            self.observation_space = spaces.Dict({"t": spaces.Box(0, 100, (1,)), "v": spaces.Box(0, 1, (2,))})

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        if self.fault == "reset_obs_only":  # the old Gym API
            return obs
        if self.fault == "reset_obs_only_2d":  # the old Gym API with a 2-long observation: unpacks without error
            return np.zeros(2, np.float32)
        if self.fault == "reset_shape":
            return np.zeros(3, np.float32), info
        if self.fault == "dict_missing_key":
            return {"t": obs}, info
        if self.fault == "dict_key_lost":
            return {"t": obs, "v": np.zeros(2, np.float32)}, info
        if self.fault == "reset_dict":  # a dict for a Box space
            return {"t": obs}, info
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.fault == "step_four":  # the old Gym API: one done flag
            return obs, reward, terminated or truncated, info
        if self.fault == "step_shape":
            return np.zeros((2, 2), np.float32), reward, terminated, truncated, info
        if self.fault == "step_info_none":
            return obs, reward, terminated, truncated, None
        if self.fault == "own_error":  # a failure of the env's own, which the check must leave as it is
            raise ValueError("the simulator diverged")
        if self.fault == "reward_array":
            return obs, np.array([reward], np.float32), terminated, truncated, info
        if self.fault == "dict_key_lost" and self.t == 3:
            return {"t": obs}, reward, terminated, truncated, info
        if self.fault == "dict_key_lost":
            return {"t": obs, "v": np.zeros(2, np.float32)}, reward, terminated, truncated, info
        return obs, reward, terminated, truncated, info


class NoSeedEnv(CountEnv):
    def reset(self):  # the old Gym signature
        self.t = 0
        return np.array([0.0], np.float32), {}


@pytest.mark.parametrize(
    "fault, message",
    [
        ("reset_obs_only", r"OffApiEnv\.reset\(\) returned one ndarray, not \(observation, info\)"),
        ("reset_obs_only_2d", r"OffApiEnv\.reset\(\) returned one ndarray, not \(observation, info\)"),
        ("reset_shape", r"reset\(\) returned an observation of shape \(3,\), where the observation_space .* \(1,\)"),
        ("dict_missing_key", r"reset\(\) returned an observation without the keys \['v'\]"),
        ("step_four", r"OffApiEnv\.step\(\) returned 4 values, not \(observation, reward, terminated, truncated"),
        ("step_shape", r"step\(\) returned an observation of shape \(2, 2\), where the observation_space"),
        ("reset_dict", r"reset\(\) returned an observation of type dict, where the observation_space is Box"),
        ("step_info_none", r"OffApiEnv\.step\(\) returned the info None, where a dict belongs"),
        ("reward_array", r"step\(\) returned the reward array\(\[1\.\], dtype=float32\) of shape \(1,\), where one"),
        ("dict_key_lost", r"The env returned an observation without the keys \['v'\]"),
    ],
)
def test_an_env_off_the_gymnasium_api_gets_an_error_that_names_the_fault_and_the_fix(fault, message):
    """What SB3's DummyVecEnv reports as an unpacking or broadcasting error (or, for an old-API reset of a 2-long
    observation, not at all) is named at learn(): which call, what it returned, and the API covey expects."""
    model = PPO("MlpPolicy", OffApiEnv(fault), n_steps=8, batch_size=8)
    with pytest.raises(ValueError, match=message) as info:
        model.learn(16)
    assert "(observation, reward, terminated, truncated, info)" in str(info.value)
    assert "check_env" in str(info.value)


def test_a_reset_without_a_seed_argument_is_named():
    model = PPO("MlpPolicy", NoSeedEnv(), n_steps=8, batch_size=8)
    with pytest.raises(ValueError, match=r"NoSeedEnv\.reset\(\) takes no seed argument") as info:
        model.learn(16)
    assert "reset(seed=None, options=None)" in str(info.value)


class DivergingEnv(CountEnv):
    """CountEnv that counts its steps and fails on its own (a ValueError of its simulator) at the 6th."""

    def __init__(self):
        super().__init__(length=100)
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls == 6:
            raise ValueError("the simulator diverged")
        return super().step(action)


def test_an_envs_own_error_passes_through_unchanged_and_no_env_is_stepped_again():
    """An env's own error is the env's: every copy used to be stepped once more (to look for an API problem),
    which moved the copies a step past what the model holds and ran the failing step's side effects twice."""
    model = PPO("MlpPolicy", OffApiEnv("own_error"), n_steps=8, batch_size=8)
    with pytest.raises(ValueError, match="^the simulator diverged$"):
        model.learn(16)
    envs = [DivergingEnv() for _ in range(3)]
    model = PPO("MlpPolicy", FastVecEnv([lambda env=env: env for env in envs]), n_steps=8, batch_size=8)
    with pytest.raises(ValueError, match="^the simulator diverged$"):
        model.learn(64)
    assert [env.calls for env in envs] == [6, 5, 5]


class OneInfoDictEnv(gym.Env):
    """Returns the same info dict every step, updated in place with an array it also updates in place, and its
    state array as the observation (as some simulators' wrappers do)."""

    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self):
        self.info = {"t": 0, "position": np.zeros(2)}
        self.state = np.zeros(2, np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.state[:] = 0.0
        return self.state, {}

    def step(self, action):
        self.t += 1
        self.info["t"] = self.t
        self.info["position"][:] = self.t
        self.state[:] = self.t / 10
        return self.state, 1.0, False, self.t >= 3, self.info


def test_each_steps_infos_are_its_own_and_the_envs_dict_is_left_as_it_was():
    """DummyVecEnv hands out deep copies of the infos: a callback that keeps them keeps each step's, arrays and
    terminal observations included. covey's vector env copies them too, and writes its keys
    (terminal_observation, TimeLimit.truncated) into the copy (DummyVecEnv writes them into the env's dict)."""
    venv = FastVecEnv([OneInfoDictEnv])
    venv.reset()
    kept = [venv.step(np.array([0]))[3][0] for _ in range(4)]
    assert [info["t"] for info in kept] == [1, 2, 3, 1]
    assert [info["position"][0] for info in kept] == [1, 2, 3, 1]
    assert ["terminal_observation" in info for info in kept] == [False, False, True, False]
    np.testing.assert_allclose(kept[2]["terminal_observation"], [0.3, 0.3], rtol=1e-6)
    assert [info["TimeLimit.truncated"] for info in kept] == [False, False, True, False]
    assert set(venv.envs[0].unwrapped.info) == {"t", "position"}


class BroadcastableObsEnv(gym.Env):
    """Observations of shape ``shape`` for a (3,) Box: NumPy broadcasts (1,) and () into the (3,) buffer."""

    observation_space = spaces.Box(-1, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, shape=(1,), at_step=False):
        self.shape, self.at_step = shape, at_step

    def _obs(self, bad):
        return np.full(self.shape if bad else (3,), 0.5, np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(not self.at_step), {}

    def step(self, action):
        return self._obs(True), 0.0, False, False, {}


@pytest.mark.parametrize("shape", [(1,), ()])
@pytest.mark.parametrize("at_step", [False, True], ids=["reset", "step"])
def test_an_observation_numpy_would_broadcast_into_the_space_is_named(shape, at_step):
    model = PPO("MlpPolicy", BroadcastableObsEnv(shape, at_step), n_steps=16, batch_size=16)
    with pytest.raises(ValueError, match=rf"observation of shape {re.escape(str(shape))}, where the observation_space"):
        model.learn(16)


def test_a_team_observation_numpy_would_broadcast_is_named():
    from pettingzoo import ParallelEnv

    from covey import POCA

    class Team(ParallelEnv):
        metadata = {"name": "team_v0"}
        possible_agents = ["a", "b"]

        def observation_space(self, agent):
            return spaces.Box(-1, 1, (3,), np.float32)

        def action_space(self, agent):
            return spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            self.agents = list(self.possible_agents)
            return {a: np.zeros(3 if a == "a" else 1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

        def step(self, actions):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match=r"agent 'b' an observation of shape \(1,\) that does not fit"):
        POCA("MlpPolicy", Team, n_steps=8, batch_size=8).learn(8)


def test_normalized_observations_of_a_uint8_vector_space_reach_the_networks_as_floats():
    """SB3's VecNormalize gives floats and keeps the env's space: a uint8 Box that is no image (an Atari RAM) is
    taken as floats, in predict and in the rollout, where it was cast back to uint8 (-0.6 read as 0)."""
    from envs import SpaceEnv
    from stable_baselines3.common.vec_env import VecNormalize

    space = spaces.Box(0, 255, (4,), np.uint8)
    venv = VecNormalize(DummyVecEnv([lambda: SpaceEnv(space, spaces.Discrete(2))]), norm_reward=False)
    model = PPO("MlpPolicy", venv, n_steps=16, batch_size=16, seed=0)
    obs = np.array([[-0.6, 0.7, 1.3, 2.4]], np.float32)
    tensor, _ = model.actor.obs_to_tensor(obs)
    torch.testing.assert_close(model.actor.encoder(tensor), torch.as_tensor(obs))
    model.learn(16)
    stored = model.rollout_buffer.observations
    assert stored.dtype == np.float32 and not np.allclose(stored, np.round(stored))  # normalized, not whole


class DictObsEnv(gym.Env):
    """A Dict observation of one key; episodes of 5 steps, truncated (so the final observation is bootstrapped)."""

    observation_space = spaces.Dict({"observation": spaces.Box(-1, 1, (3,), np.float32)})
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {"observation": np.zeros(3, np.float32)}, {}

    def step(self, action):
        self.t += 1
        return {"observation": np.full(3, self.t / 10, np.float32)}, 1.0, False, self.t >= 5, {}


def extract_key(fix_terminal: bool):
    """SB3's tutorial wrapper that turns Dict observations into one key's; as the tutorial writes it (its infos'
    terminal_observation left a dict), or with that one extracted too."""
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class VecExtractDictObs(VecEnvWrapper):
        def __init__(self, venv):
            super().__init__(venv, observation_space=venv.observation_space["observation"])

        def reset(self):
            return self.venv.reset()["observation"]

        def step_wait(self):
            obs, rewards, dones, infos = self.venv.step_wait()
            if fix_terminal:
                for info in infos:
                    if "terminal_observation" in info:
                        info["terminal_observation"] = info["terminal_observation"]["observation"]
            return obs["observation"], rewards, dones, infos

    return VecExtractDictObs(DummyVecEnv([DictObsEnv, DictObsEnv]))


@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_a_terminal_observation_unlike_the_observations_is_named_with_the_wrapper_to_fix(agent):
    """Where a VecEnv wrapper changes obs but not infos' terminal_observation, the error names both (it was
    a TypeError from deep in a tensor conversion); the wrapper that changes both trains."""
    from covey import SAC

    def build(env):
        if agent == "ppo":
            return PPO("MlpPolicy", env, n_steps=8, batch_size=16)
        return SAC("MlpPolicy", env, learning_starts=4, batch_size=8)

    with pytest.raises(
        ValueError,
        match=r"infos\[0\]\['terminal_observation'\] is a dict of keys \['observation'\], "
        r"where the step's observations are arrays of shape \(3,\)",
    ):
        build(extract_key(fix_terminal=False)).learn(16)
    assert build(extract_key(fix_terminal=True)).learn(16).num_timesteps == 16


class ExtraKeyEnv(DictObsEnv):
    """DictObsEnv whose observations hold a key its space has not (a debug value)."""

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return {**obs, "debug": np.zeros(2)}, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return {**obs, "debug": np.zeros(2)}, reward, terminated, truncated, info


@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_a_dict_observations_extra_key_is_left_out_at_episode_ends_too(agent):
    """The space's keys are read and the others left out, the episode's last observation included: it was
    refused there as a wrapper's mistake (SB3's SAC trains on such an env)."""
    from covey import SAC

    if agent == "ppo":
        model = PPO("MultiInputPolicy", ExtraKeyEnv(), n_steps=8, batch_size=8)
    else:
        model = SAC("MultiInputPolicy", ExtraKeyEnv(), learning_starts=4, batch_size=8)
    assert model.learn(16).num_timesteps == 16


def test_an_off_space_observation_a_vecenv_copied_is_named_as_the_envs_at_its_episodes_end():
    """SB3's DummyVecEnv copies a (1,) observation into every entry of a (3,) space and keeps the (1,) one as
    the episode's last: the error named only a VecEnv wrapper as the cause."""
    env = DummyVecEnv([lambda: gym.wrappers.TimeLimit(BroadcastableObsEnv((1,), at_step=True), 4)])
    with pytest.raises(ValueError, match=r"the env returns observations of another shape.*check_env\(env\)"):
        PPO("MlpPolicy", env, n_steps=8, batch_size=8).learn(16)


@pytest.mark.parametrize("reward", [np.array([1.0], np.float32), [1.0], [1.0, [2.0]]], ids=["array", "list", "ragged"])
def test_a_reward_that_is_no_number_is_named_a_list_and_a_ragged_one_too(reward):
    """A reward array of one element was named only where NumPy (2.4 and newer) refused to make it a float;
    NumPy before 2.4 stored it silently. A list is named too, and a ragged one, whose shape NumPy's own error
    was about."""

    class ListReward(OffApiEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, reward, terminated, truncated, info

    env = ListReward("none")
    with pytest.raises(ValueError, match=r"ListReward\.step\(\) returned the reward .*, where one float belongs"):
        PPO("MlpPolicy", env, n_steps=8, batch_size=8).learn(16)
