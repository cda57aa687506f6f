"""SB3 user scripts run unchanged on covey when only the import changes to ``from covey import PPO``.

The tests follow Stable-Baselines3's documented user API (docs pages "Examples", "Callbacks",
"Vectorized Environments", "Custom Policy Network", "Base RL Class"): the calls a user script makes,
and what it can observe afterwards.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import NormExtractor, SpaceEnv, image_space
from gymnasium import spaces
from gymnasium.utils import EzPickle
from mpe2 import simple_spread_v3
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    CheckpointCallback,
    EvalCallback,
    EveryNTimesteps,
    ProgressBarCallback,
    StopTrainingOnNoModelImprovement,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, NatureCNN
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecFrameStack,
    VecNormalize,
    VecTransposeImage,
)

from covey import PPO, SAC

# Small budgets: one rollout of 32 steps per env, two epochs, minibatches that tile the rollout.
FAST = dict(n_steps=32, batch_size=32, n_epochs=2, seed=0)


# ---------------------------------------------------------------------------- tiny helper envs
class ImageEnv(gym.Env):
    """Channel-last uint8 images (36, 36, 3), two actions, episodes of 8 steps; action 1 pays 1."""

    observation_space = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8), {}

    def step(self, action):
        self._t += 1
        obs = self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)
        return obs, float(action == 1), self._t >= 8, False, {}


class ConstantEnv(gym.Env):
    """Every episode lasts 5 steps and pays 1 per step, whatever the agent does: every evaluation is 5.0."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self._t += 1
        return np.zeros(2, np.float32), 1.0, self._t >= 5, False, {}


class DictEnv(gym.Env):
    """Dict observations (a vector and a discrete position), three actions, episodes of 6 steps."""

    observation_space = spaces.Dict(
        {"vec": spaces.Box(-1.0, 1.0, (3,), np.float32), "pos": spaces.Discrete(4)},
    )
    action_space = spaces.Discrete(3)

    def __init__(self) -> None:
        self._t = 0

    def _obs(self):
        return {
            "vec": self.np_random.uniform(-1, 1, 3).astype(np.float32),
            "pos": int(self.np_random.integers(4)),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(action == 2), self._t >= 6, False, {}


class TinyExtractor(BaseFeaturesExtractor):
    """A user-written SB3 features extractor: Linear + ReLU."""

    def __init__(self, observation_space: spaces.Box, features_dim: int = 16) -> None:
        super().__init__(observation_space, features_dim)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(int(np.prod(observation_space.shape)), features_dim), torch.nn.ReLU()
        )

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.net(observations)


class CountingCallback(BaseCallback):
    """Counts the SB3 hooks it sees and the timesteps at which ``_on_step`` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.steps_seen: list[int] = []
        self.training_started = False
        self.training_ended = False

    def _on_training_start(self) -> None:
        self.training_started = True

    def _on_step(self) -> bool:
        self.steps_seen.append(self.num_timesteps)
        return True

    def _on_training_end(self) -> None:
        self.training_ended = True


def linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def cartpole_obs_batch(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.2, 0.2, (n, 4)).astype(np.float32)


# ---------------------------------------------------------------------------- 1. the docs' examples
def test_docs_basic_example_cartpole(tmp_path):
    """SB3's "Examples" basic usage: learn, step the model's VecEnv, evaluate, save/del/load."""
    model = PPO("MlpPolicy", "CartPole-v1", verbose=0, n_steps=64, batch_size=64, n_epochs=2, seed=0)
    model.learn(total_timesteps=128)
    assert model.num_timesteps == 128

    vec_env = model.get_env()
    obs = vec_env.reset()
    assert obs.shape == (1, 4)
    action, _states = model.predict(obs, deterministic=True)
    assert _states is None
    assert action.shape == (1,) and vec_env.action_space.contains(int(action[0]))
    obs, rewards, dones, info = vec_env.step(action)
    assert obs.shape == (1, 4) and rewards.shape == (1,) and dones.shape == (1,)
    assert isinstance(info, list) and len(info) == 1

    mean_reward, std_reward = evaluate_policy(model, model.get_env(), n_eval_episodes=5)
    assert isinstance(mean_reward, float) and isinstance(std_reward, float)
    assert 1.0 <= mean_reward <= 500.0 and std_reward >= 0.0

    batch = cartpole_obs_batch(32)
    before, _ = model.predict(batch, deterministic=True)
    model.save(tmp_path / "ppo_cartpole")
    assert (tmp_path / "ppo_cartpole.zip").is_file()
    del model
    model = PPO.load(tmp_path / "ppo_cartpole")
    after, _ = model.predict(batch, deterministic=True)
    np.testing.assert_array_equal(before, after)
    assert model.get_env() is None
    assert model.num_timesteps == 128


def test_docs_eval_callback_stops_on_reward_threshold(tmp_path):
    """EvalCallback + StopTrainingOnRewardThreshold: a threshold reached at once stops training at the
    first evaluation, after the best model was saved."""
    eval_env = Monitor(gym.make("CartPole-v1"))
    callback_on_best = StopTrainingOnRewardThreshold(reward_threshold=0.0, verbose=0)
    eval_callback = EvalCallback(
        eval_env,
        callback_on_new_best=callback_on_best,
        eval_freq=32,
        n_eval_episodes=2,
        best_model_save_path=str(tmp_path),
        verbose=0,
    )
    model = PPO("MlpPolicy", "CartPole-v1", verbose=0, **FAST)
    model.learn(total_timesteps=10_000, callback=eval_callback)
    assert model.num_timesteps == 32  # stopped inside the first rollout, at the first evaluation
    assert eval_callback.best_mean_reward >= 0.0
    best = tmp_path / "best_model.zip"
    assert best.is_file()
    loaded = PPO.load(best)
    action, _ = loaded.predict(np.zeros(4, np.float32), deterministic=True)
    assert action.shape == ()


def test_docs_vec_normalize_save_load_round_trip(tmp_path):
    """SB3's "PyBullet: Normalizing input features" pattern, on Pendulum."""
    vec_env = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    vec_env = VecNormalize(vec_env, norm_obs=True, norm_reward=True, clip_obs=10.0)
    model = PPO("MlpPolicy", vec_env, **FAST)
    model.learn(total_timesteps=64)
    assert vec_env.obs_rms.count > 64  # statistics were updated while training

    model_path = str(tmp_path / "ppo_pendulum")
    stats_path = str(tmp_path / "vec_normalize.pkl")
    model.save(model_path)
    vec_env.save(stats_path)

    raw = np.random.default_rng(0).uniform(-1.0, 1.0, (16, 3)).astype(np.float32)
    normalized = vec_env.normalize_obs(raw)
    expected, _ = model.predict(normalized, deterministic=True)

    new_env = VecNormalize.load(stats_path, DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    new_env.training = False
    new_env.norm_reward = False
    loaded = PPO.load(model_path, env=new_env)

    np.testing.assert_array_equal(new_env.obs_rms.mean, vec_env.obs_rms.mean)
    np.testing.assert_array_equal(new_env.normalize_obs(raw), normalized)
    actions, _ = loaded.predict(new_env.normalize_obs(raw), deterministic=True)
    np.testing.assert_array_equal(actions, expected)
    assert loaded.get_vec_normalize_env() is new_env
    assert loaded.get_env() is new_env


# ---------------------------------------------------------------------------- 2. callbacks
def test_eval_callback_writes_evaluations_npz(tmp_path):
    eval_env = Monitor(gym.make("CartPole-v1"))
    eval_callback = EvalCallback(
        eval_env,
        eval_freq=32,
        n_eval_episodes=2,
        log_path=str(tmp_path / "logs"),
        best_model_save_path=str(tmp_path / "best"),
        deterministic=True,
    )
    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(128, callback=eval_callback)
    data = np.load(tmp_path / "logs" / "evaluations.npz")
    np.testing.assert_array_equal(data["timesteps"], [32, 64, 96, 128])
    assert data["results"].shape == (4, 2) and data["ep_lengths"].shape == (4, 2)
    assert eval_callback.best_mean_reward == pytest.approx(data["results"].mean(axis=1).max())
    assert (tmp_path / "best" / "best_model.zip").is_file()


def test_eval_callback_syncs_vec_normalize_statistics():
    """EvalCallback copies the training VecNormalize statistics into a VecNormalize eval env."""
    train_env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    eval_env = VecNormalize(DummyVecEnv([lambda: Monitor(gym.make("Pendulum-v1"))]), training=False, norm_reward=False)
    eval_callback = EvalCallback(eval_env, eval_freq=32, n_eval_episodes=1)
    PPO("MlpPolicy", train_env, **FAST).learn(64, callback=eval_callback)
    assert eval_callback.n_calls == 64
    np.testing.assert_array_equal(eval_env.obs_rms.mean, train_env.obs_rms.mean)
    np.testing.assert_array_equal(eval_env.obs_rms.var, train_env.obs_rms.var)


def test_stop_training_on_reward_threshold_alone_in_eval_callback(tmp_path):
    """The threshold is tested on each new best only: an unreachable one never stops training."""
    eval_env = Monitor(gym.make("CartPole-v1"))
    stopper = StopTrainingOnRewardThreshold(reward_threshold=1e9, verbose=0)
    eval_callback = EvalCallback(eval_env, callback_on_new_best=stopper, eval_freq=32, n_eval_episodes=1)
    model = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(96, callback=eval_callback)
    assert model.num_timesteps == 96
    assert stopper.n_calls >= 1  # called on the first (new best) evaluation


def test_stop_training_on_no_model_improvement():
    """Every evaluation of ConstantEnv is 5.0: after min_evals=1, two evaluations without a new best
    (more than max_no_improvement_evals=1) stop training at the third evaluation."""
    stopper = StopTrainingOnNoModelImprovement(max_no_improvement_evals=1, min_evals=1, verbose=0)
    eval_callback = EvalCallback(
        Monitor(ConstantEnv()), eval_freq=16, n_eval_episodes=2, callback_after_eval=stopper, verbose=0
    )
    model = PPO("MlpPolicy", ConstantEnv(), **FAST)
    model.learn(total_timesteps=5_000, callback=eval_callback)
    assert eval_callback.best_mean_reward == 5.0
    assert stopper.n_calls == 3
    assert model.num_timesteps == 3 * 16


def test_checkpoint_callback_saves_loadable_checkpoints(tmp_path):
    checkpoint = CheckpointCallback(save_freq=32, save_path=str(tmp_path), name_prefix="rl_model")
    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(96, callback=checkpoint)
    names = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "*.zip")))
    assert names == ["rl_model_32_steps.zip", "rl_model_64_steps.zip", "rl_model_96_steps.zip"]
    loaded = PPO.load(tmp_path / "rl_model_64_steps.zip")
    assert loaded.num_timesteps == 64
    assert loaded.predict(np.zeros(4, np.float32))[0].shape == ()


def test_checkpoint_callback_saves_vec_normalize(tmp_path):
    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    checkpoint = CheckpointCallback(save_freq=32, save_path=str(tmp_path), name_prefix="ckpt", save_vecnormalize=True)
    PPO("MlpPolicy", env, **FAST).learn(64, callback=checkpoint)
    for steps in (32, 64):
        assert (tmp_path / f"ckpt_{steps}_steps.zip").is_file()
        assert (tmp_path / f"ckpt_vecnormalize_{steps}_steps.pkl").is_file()
    stats = VecNormalize.load(
        str(tmp_path / "ckpt_vecnormalize_64_steps.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    )
    np.testing.assert_allclose(stats.obs_rms.mean, env.obs_rms.mean)
    PPO.load(tmp_path / "ckpt_64_steps.zip", env=stats)


def test_callback_list_calls_every_inner_callback():
    first, second = CountingCallback(), CountingCallback()
    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64, callback=CallbackList([first, second]))
    for cb in (first, second):
        assert cb.n_calls == 64 and cb.steps_seen == list(range(1, 65))
        assert cb.training_started and cb.training_ended


def test_plain_list_of_callbacks_is_a_callback_list():
    first, second = CountingCallback(), CountingCallback()
    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(32, callback=[first, second])
    assert first.n_calls == second.n_calls == 32


def test_function_callback_is_called_each_step():
    calls = []

    def on_step(locals_, globals_):
        calls.append(1)
        return True

    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(32, callback=on_step)
    assert len(calls) == 32


def test_every_n_timesteps_triggers_its_callback():
    inner = CountingCallback()
    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(256, callback=EveryNTimesteps(n_steps=50, callback=inner))
    assert inner.n_calls == 5
    assert inner.steps_seen == [50, 100, 150, 200, 250]


def test_every_n_timesteps_counts_steps_of_all_envs():
    inner = CountingCallback()
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    PPO("MlpPolicy", env, n_steps=16, batch_size=64, n_epochs=1, seed=0).learn(
        256, callback=EveryNTimesteps(n_steps=50, callback=inner)
    )
    assert inner.steps_seen == [52, 104, 156, 208]


def test_progress_bar_callback():
    progress = ProgressBarCallback()
    model = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64, callback=progress)
    assert model.num_timesteps == 64
    assert progress.pbar.n == 64 and progress.pbar.total == 64


def test_progress_bar_flag():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64, progress_bar=True)
    assert model.num_timesteps == 64


class LocalsCallback(BaseCallback):
    """Records what a user callback reads from ``self.locals`` every step."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[dict] = []
        self.episodes: list[dict] = []
        self.actions: list = []

    def _on_step(self) -> bool:
        assert self.training_env is self.model.get_env()
        assert self.num_timesteps == self.model.num_timesteps
        rewards, dones, infos = self.locals["rewards"], self.locals["dones"], self.locals["infos"]
        self.shapes.append(
            {
                "rewards": np.asarray(rewards).shape,
                "dones": np.asarray(dones).shape,
                "infos": len(infos),
                "new_obs": np.asarray(self.locals["new_obs"]).shape,
            }
        )
        self.actions.append(self.locals["actions"])
        self.episodes += [info["episode"] for info in infos if "episode" in info]
        return True


def test_user_callback_reads_rewards_dones_infos_new_obs():
    env = make_vec_env("CartPole-v1", n_envs=3, seed=0)
    callback = LocalsCallback()
    PPO("MlpPolicy", env, n_steps=32, batch_size=96, n_epochs=1, seed=0).learn(96, callback=callback)
    assert len(callback.shapes) == 32
    for shapes in callback.shapes:
        assert shapes == {"rewards": (3,), "dones": (3,), "infos": 3, "new_obs": (3, 4)}
    # Random CartPole episodes last ~20 steps: some finish, and Monitor reports them in the infos.
    assert callback.episodes and all({"r", "l", "t"} <= set(ep) for ep in callback.episodes)


def test_user_callback_actions_local_is_numpy_like_sb3():
    """SB3's rollout loop holds ``actions`` as a numpy array of shape (n_envs, *action_shape)."""
    env = make_vec_env("CartPole-v1", n_envs=3, seed=0)
    callback = LocalsCallback()
    PPO("MlpPolicy", env, n_steps=32, batch_size=96, n_epochs=1, seed=0).learn(32 * 3, callback=callback)
    for actions in callback.actions:
        assert isinstance(actions, np.ndarray)
        assert actions.shape == (3,)


class RolloutEndValues(BaseCallback):
    """Keeps ``self.locals["values"]`` at each rollout's end, with the critic's values of the last observations."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        with torch.no_grad():
            expected = self.model.policy.predict_values(torch.as_tensor(self.locals["new_obs"]))
        self.seen.append((self.locals["values"], expected))


@pytest.mark.parametrize("numpy_acting", [True, False])
def test_callback_locals_hold_actions_of_the_spaces_shape_and_the_last_values_as_sb3s(monkeypatch, numpy_acting):
    """SB3 holds ``actions`` as ``(n_envs, *action_space.shape)`` and, at the rollout's end, ``values`` as
    V(last observations) ``(n_envs, 1)``."""
    from envs import SpaceEnv

    monkeypatch.setattr(PPO, "numpy_acting", numpy_acting)
    env = DummyVecEnv([lambda: SpaceEnv(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2, 2)))] * 3)
    steps, ends = LocalsCallback(), RolloutEndValues()
    model = PPO("MlpPolicy", env, n_steps=8, batch_size=24, n_epochs=1, seed=0)
    model.learn(48, callback=[steps, ends])
    assert {actions.shape for actions in steps.actions} == {(3, 2, 2)}
    assert len(ends.seen) == 2
    for values, expected in ends.seen:
        assert isinstance(values, torch.Tensor) and values.shape == (3, 1)
        torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-6)


class LocalNames(BaseCallback):
    """Records the names of ``self.locals`` at every step and the values of a few of them."""

    def __init__(self, keep: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.kept: list[dict] = []
        self.keep = keep
        self.at_start: set[str] = set()

    def _on_training_start(self) -> None:
        self.at_start = set(self.locals)

    def _on_step(self) -> bool:
        self.names |= set(self.locals)
        self.kept.append({name: self.locals[name] for name in self.keep})
        return True


# Locals of SB3's loops that covey's do not have: PPO computes values and log-probabilities in one pass
# after the rollout, not per step; done/idx are SB3's leftovers from its truncation loop; continue_training
# is SB3's return flag.
NOT_IN_COVEY = {"PPO": {"values", "log_probs", "done", "idx"}, "SAC": {"continue_training"}}
# (values is there at the rollout's end, as SB3's V(last observations); not at each step)


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_callback_locals_have_sb3s_names(name):
    """A callback reading ``self.locals[...]`` finds SB3's names: the same callback run on SB3's agent."""
    import stable_baselines3

    import covey

    if name == "PPO":
        env_id, kwargs = "CartPole-v1", dict(n_steps=16, batch_size=16, n_epochs=1)
        keep = ("rollout_buffer", "n_steps", "n_rollout_steps")
    else:
        env_id, kwargs = "Pendulum-v1", dict(learning_starts=8, batch_size=8)
        keep = ("replay_buffer", "num_collected_steps", "actions", "buffer_actions", "train_freq", "learning_starts")
    names = {}
    for lib in (stable_baselines3, covey):
        callback = LocalNames(keep if lib is covey else ())
        model = getattr(lib, name)("MlpPolicy", env_id, seed=0, **kwargs).learn(32, callback=callback)
        names[lib] = callback.names
    assert names[stable_baselines3] - NOT_IN_COVEY[name] <= names[covey]
    assert "iteration" in callback.at_start or name == "SAC"
    if name == "PPO":
        assert all(k["rollout_buffer"] is model.rollout_buffer for k in callback.kept)
        assert [k["n_steps"] for k in callback.kept] == [*range(16), *range(16)]
        assert {k["n_rollout_steps"] for k in callback.kept} == {16}
    else:
        assert all(k["replay_buffer"] is model.replay_buffer for k in callback.kept)
        assert [k["num_collected_steps"] for k in callback.kept] == [1] * 32  # train_freq=1: one step per call
        assert {k["learning_starts"] for k in callback.kept} == {8}
        for k in callback.kept:  # actions as Pendulum takes them ([-2, 2]); the buffer's in [-1, 1]
            np.testing.assert_allclose(k["actions"], 2.0 * k["buffer_actions"], rtol=1e-5, atol=1e-6)


ROLLOUT_FIELDS = (
    *("observations", "actions", "rewards", "values"),
    *("log_probs", "advantages", "returns", "episode_starts"),
)


class RolloutFields(BaseCallback):
    """Reads the rollout buffer at each rollout's end as SB3 callbacks do: NumPy arrays by SB3's names."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        fields = {
            name: {k: np.array(v) for k, v in x.items()} if isinstance(x, dict) else np.array(x)
            for name, x in ((name, getattr(buf, name)) for name in ROLLOUT_FIELDS)
        }
        fields["types"] = {name: type(getattr(buf, name)) for name in ROLLOUT_FIELDS}
        fields["mean_return"] = float(np.mean(buf.returns))  # a torch tensor fails here
        fields["sizes"] = (buf.buffer_size, buf.n_envs, buf.obs_shape, buf.action_dim, buf.full, buf.size())
        fields["gae"] = (buf.gamma, buf.gae_lambda)
        self.seen.append(fields)


@pytest.mark.parametrize(
    "obs_space, action_space",
    [
        (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(3)),
        (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Box(-1.0, 1.0, (2,), np.float32)),
        (spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.MultiDiscrete([2, 3])),
        (spaces.Dict({"vec": spaces.Box(-1.0, 1.0, (3,), np.float32), "pos": spaces.Discrete(4)}), spaces.Discrete(3)),
    ],
    ids=["discrete", "box", "multidiscrete", "dict"],
)
def test_a_callback_reads_the_rollout_buffer_as_in_sb3(obs_space, action_space):
    """The same callback on SB3's PPO and covey's: every field a NumPy array (a dict of them for Dict
    observations) of SB3's shape, SB3's episode starts across rollouts, and SB3's sizes and GAE settings."""
    import stable_baselines3
    from envs import SpaceEnv

    policy = "MultiInputPolicy" if isinstance(obs_space, spaces.Dict) else "MlpPolicy"
    seen = {}
    for cls in (stable_baselines3.PPO, PPO):
        # Episodes of 5 steps, rollouts of 8: episodes cross the rollouts' boundaries.
        env = make_vec_env(lambda: SpaceEnv(obs_space, action_space, episode_length=5), n_envs=2, seed=0)
        reader = RolloutFields()
        cls(policy, env, n_steps=8, batch_size=16, n_epochs=1, gamma=0.9, gae_lambda=0.8, seed=0).learn(
            32, callback=reader
        )
        seen[cls] = reader.seen
    ours, sb3 = seen[PPO], seen[stable_baselines3.PPO]
    assert len(ours) == len(sb3) == 2
    for mine, theirs in zip(ours, sb3):
        for name in ROLLOUT_FIELDS:
            a, b = mine[name], theirs[name]
            if isinstance(b, dict):
                assert mine["types"][name] is dict and set(a) == set(b)
                assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
            else:
                assert mine["types"][name] is np.ndarray, name
                assert a.shape == b.shape, name
        for name in ("rewards", "values", "log_probs", "advantages", "returns", "episode_starts"):
            assert mine[name].dtype == theirs[name].dtype == np.float32, name
        np.testing.assert_array_equal(mine["episode_starts"], theirs["episode_starts"])
        np.testing.assert_allclose(mine["returns"], mine["advantages"] + mine["values"], rtol=1e-5, atol=1e-5)
        assert mine["mean_return"] == pytest.approx(float(mine["returns"].mean()))
        assert mine["sizes"] == theirs["sizes"] and mine["gae"] == theirs["gae"] == (0.9, 0.8)
    # The first rollout starts episodes at steps 0 and 5, the second at steps 2 and 7 (10 and 15 overall).
    np.testing.assert_array_equal(ours[0]["episode_starts"][:, 0], [1, 0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(ours[1]["episode_starts"][:, 0], [0, 0, 1, 0, 0, 0, 0, 1])


class ZeroAdvantages(BaseCallback):
    """A callback that edits the rollout in place before the update, as SB3 code may do."""

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.model.rollout_buffer.advantages[:] = 0.0


@pytest.mark.parametrize("edit", [False, True])
def test_a_callback_writing_the_rollout_buffer_changes_the_update_as_in_sb3(edit):
    """On the CPU the arrays are the buffer's memory: zeroed advantages leave the policy where it was (no
    entropy bonus), while the value function still learns; untouched, both move."""
    import stable_baselines3

    for cls in (stable_baselines3.PPO, PPO):
        model = cls(
            "MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=2, ent_coef=0.0, seed=0, device="cpu"
        )
        if cls is PPO:
            policy, value = model.actor, model.critic
        else:
            policy, value = model.policy.mlp_extractor.policy_net, model.policy.mlp_extractor.value_net
        before = [torch.cat([p.detach().flatten().clone() for p in net.parameters()]) for net in (policy, value)]
        model.learn(32, callback=ZeroAdvantages() if edit else None)
        after = [torch.cat([p.detach().flatten() for p in net.parameters()]) for net in (policy, value)]
        assert torch.equal(before[0], after[0]) == edit, cls
        assert not torch.equal(before[1], after[1]), cls


class IntrinsicBonus(BaseCallback):
    """SB3's intrinsic-reward habit: at the rollout's end add a bonus to the rewards and compute the returns again
    with the rollout buffer's compute_returns_and_advantage; keeps what it saw to check."""

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buffer = self.model.rollout_buffer
        self.returns_before = buffer.returns.copy()
        buffer.rewards += 0.5
        with torch.no_grad():
            obs = self.model.policy.obs_to_tensor(self.locals["new_obs"])[0]
            self.last_values = self.model.policy.predict_values(obs)
        buffer.compute_returns_and_advantage(last_values=self.last_values, dones=self.locals["dones"])
        self.seen = {name: np.array(getattr(buffer, name)) for name in ("rewards", "values", "episode_starts")}
        self.seen.update(returns=buffer.returns.copy(), advantages=buffer.advantages.copy(), dones=self.locals["dones"])


def test_a_callback_computes_the_returns_again_as_sb3s_buffer_does():
    """covey's rollout buffer takes SB3's compute_returns_and_advantage: after a reward bonus its returns and
    advantages are those SB3's own buffer computes from the same rewards, values and episode starts."""
    from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = PPO("MlpPolicy", env, n_steps=64, gamma=0.9, gae_lambda=0.8, seed=0, device="cpu")
    callback = IntrinsicBonus()
    model.learn(128, callback=callback)
    seen = callback.seen
    assert (seen["returns"] >= callback.returns_before + 0.5 - 1e-5).all()  # each return gained the bonus once or more
    theirs = SB3RolloutBuffer(64, model.observation_space, model.action_space, n_envs=2, gamma=0.9, gae_lambda=0.8)
    theirs.rewards[:], theirs.values[:], theirs.episode_starts[:] = (
        seen["rewards"],
        seen["values"],
        seen["episode_starts"],
    )
    theirs.compute_returns_and_advantage(callback.last_values, seen["dones"])
    np.testing.assert_allclose(seen["advantages"], theirs.advantages, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(seen["returns"], theirs.returns, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one value per env"):
        model.rollout_buffer.compute_returns_and_advantage(torch.zeros(3), seen["dones"])
    with pytest.raises(ValueError, match="not the rollout's last step's"):
        model.rollout_buffer.compute_returns_and_advantage(callback.last_values, ~np.asarray(seen["dones"]))


class StopAfter(BaseCallback):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.training_ended = False

    def _on_step(self) -> bool:
        return self.n_calls < self.n

    def _on_training_end(self) -> None:
        self.training_ended = True


def test_user_callback_returning_false_stops_training():
    stopper = StopAfter(5)
    model = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(10_000, callback=stopper)
    assert model.num_timesteps == 5
    assert stopper.n_calls == 5 and stopper.training_ended


# ---------------------------------------------------------------------------- 3. VecEnv wrappers
def test_dummy_vec_env():
    env = DummyVecEnv([lambda: gym.make("CartPole-v1"), lambda: gym.make("CartPole-v1")])
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0).learn(64)
    assert model.n_envs == 2 and model.num_timesteps == 64
    assert model.predict(env.reset())[0].shape == (2,)


def test_subproc_vec_env():
    env = SubprocVecEnv([lambda: gym.make("CartPole-v1") for _ in range(2)], start_method="fork")
    try:
        model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0).learn(64)
        assert model.num_timesteps == 64
        action, _ = model.predict(env.reset(), deterministic=True)
        assert action.shape == (2,)
        obs, rewards, dones, infos = env.step(action)
        assert obs.shape == (2, 4) and rewards.shape == (2,)
    finally:
        env.close()


def test_vec_normalize_env():
    env = VecNormalize(make_vec_env("CartPole-v1", n_envs=2, seed=0))
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0).learn(64)
    assert model.get_vec_normalize_env() is env
    assert env.obs_rms.count > 64
    assert model.predict(env.reset())[0].shape == (2,)


def test_vec_frame_stack():
    env = VecFrameStack(DummyVecEnv([lambda: gym.make("CartPole-v1")]), n_stack=4)
    model = PPO("MlpPolicy", env, **FAST).learn(64)
    assert model.observation_space.shape == (16,)
    assert linears(model.policy)[0].in_features == 16
    obs = env.reset()
    assert obs.shape == (1, 16)
    assert model.predict(obs)[0].shape == (1,)


def test_vec_transpose_image_with_cnn_policy():
    env = VecTransposeImage(DummyVecEnv([ImageEnv]))
    assert env.observation_space.shape == (3, 36, 36)
    model = PPO("CnnPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(32)
    assert model.observation_space.shape == (3, 36, 36)
    obs = env.reset()
    assert obs.shape == (1, 3, 36, 36)
    assert model.predict(obs)[0].shape == (1,)
    assert model.predict(obs[0])[0].shape == ()


class ImageDictEnv(gym.Env):
    """ImageEnv under the key "image", beside a vector under "vec"."""

    observation_space = spaces.Dict({"image": ImageEnv.observation_space, "vec": spaces.Box(-1, 1, (2,), np.float32)})
    action_space = ImageEnv.action_space

    def __init__(self) -> None:
        self.images = ImageEnv()

    def _obs(self, image: np.ndarray) -> dict:
        return {"image": image, "vec": np.full(2, 0.5, np.float32)}

    def reset(self, *, seed=None, options=None):
        image, info = self.images.reset(seed=seed)
        return self._obs(image), info

    def step(self, action):
        image, *rest = self.images.step(action)
        return self._obs(image), *rest


class ChannelFirstImageDictEnv(ImageDictEnv):
    """ImageDictEnv with its images channel first, (3, 36, 36)."""

    observation_space = spaces.Dict(
        {"image": spaces.Box(0, 255, (3, 36, 36), np.uint8), "vec": ImageDictEnv.observation_space["vec"]}
    )

    def _obs(self, image: np.ndarray) -> dict:
        return super()._obs(np.ascontiguousarray(image.transpose(2, 0, 1)))


def image(obs):
    return obs["image"] if isinstance(obs, (dict, spaces.Dict)) else obs


def test_a_dict_model_steps_envs_with_images_in_either_channel_order():
    model = PPO("MultiInputPolicy", ImageDictEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    model.set_env(DummyVecEnv([ChannelFirstImageDictEnv]))
    model.learn(32)  # episodes of 8 steps: terminal observations are moved too
    assert tuple(image(model.rollout_buffer.observations).shape[-3:]) == (36, 36, 3)
    model.get_env().seed(5)
    raw = DummyVecEnv([ImageDictEnv])
    raw.seed(5)
    ours, theirs = model.get_env().reset(), raw.reset()
    np.testing.assert_array_equal(ours["image"], theirs["image"])
    np.testing.assert_array_equal(ours["vec"], theirs["vec"])


def test_a_model_steps_envs_with_images_in_either_channel_order(tmp_path):
    """As SB3's models do: one trained on channel-last images takes a VecTransposeImage env in set_env and load,
    and one trained on channel-first images a raw env; the rollouts hold images in the model's own layout."""
    policy, make = "CnnPolicy", ImageEnv
    model = PPO(policy, make(), n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16)
    hwc = image(model.observation_space).shape
    assert hwc == (36, 36, 3)
    model.set_env(VecTransposeImage(DummyVecEnv([make])))
    model.learn(32, reset_num_timesteps=False)
    assert model.num_timesteps == 48 and image(model.observation_space).shape == hwc
    assert tuple(image(model.rollout_buffer.observations).shape[-3:]) == hwc
    # The wrapper moves the axes back, so the model sees the images a raw env gives for the same seed.
    model.get_env().seed(5)
    raw = DummyVecEnv([make])
    raw.seed(5)
    np.testing.assert_array_equal(image(model.get_env().reset()), image(raw.reset()))
    actions = np.array([1])
    model.get_env().step_async(actions)
    raw.step_async(actions)
    for ours, theirs in zip(model.get_env().step_wait()[:3], raw.step_wait()[:3]):  # obs, rewards, dones
        np.testing.assert_array_equal(ours, theirs)
    model.save(tmp_path / "hwc")
    PPO.load(tmp_path / "hwc", env=VecTransposeImage(DummyVecEnv([make]))).learn(16)

    chw_model = PPO(policy, VecTransposeImage(DummyVecEnv([make])), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    assert image(chw_model.observation_space).shape == (3, 36, 36)
    chw_model.set_env(DummyVecEnv([make]))
    chw_model.learn(16)
    assert tuple(image(chw_model.rollout_buffer.observations).shape[-3:]) == (3, 36, 36)
    with pytest.raises(ValueError, match="Observation spaces do not match"):
        model.set_env(DummyVecEnv([lambda: gym.make("CartPole-v1")]))


def test_make_vec_env_four_envs():
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=64, n_epochs=1, seed=0).learn(128)
    assert model.n_envs == 4 and model.num_timesteps == 128
    assert model.predict(env.reset())[0].shape == (4,)


# ---------------------------------------------------------------------------- 4. policy_kwargs
def test_net_arch_list():
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[32, 16]), **FAST)
    assert [m.out_features for m in linears(model.actor.trunk)] == [32, 16]
    assert [m.out_features for m in linears(model.critic.trunk)] == [32, 16]
    assert model.actor.trunk is not model.critic.trunk  # same sizes, separate weights (SB3 >= 1.8)
    model.learn(32)


def test_net_arch_dict():
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=dict(pi=[32], vf=[64, 8])), **FAST)
    assert [m.out_features for m in linears(model.actor.trunk)] == [32]
    assert [m.out_features for m in linears(model.critic.trunk)] == [64, 8]
    model.learn(32)


def test_net_arch_in_sb3s_old_list_form_is_read_as_its_dict_with_a_warning():
    """SB3 still takes net_arch=[dict(pi=..., vf=...)] (its form before 1.8) with a warning, as its dict."""
    with pytest.warns(FutureWarning, match=r"net_arch=\[dict\(\.\.\.\)\] is SB3's form from before"):
        model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[dict(pi=[32], vf=[64, 8])]), **FAST)
    assert [m.out_features for m in linears(model.actor.trunk)] == [32]
    assert [m.out_features for m in linears(model.critic.trunk)] == [64, 8]
    with pytest.raises(ValueError, match=r"\[64, dict\(pi=\.\.\., vf=\.\.\.\)\], with shared layers, is gone"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[64, dict(pi=[32], vf=[64])]))


def test_activation_fn_relu(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(activation_fn=torch.nn.ReLU), **FAST)
    for net in (model.policy, model.critic):
        kinds = {type(m) for m in net.modules()}
        assert torch.nn.ReLU in kinds and torch.nn.Tanh not in kinds
    model.learn(32)
    model.save(tmp_path / "relu")
    loaded = PPO.load(tmp_path / "relu")
    assert any(isinstance(m, torch.nn.ReLU) for m in loaded.policy.modules())


@pytest.mark.parametrize("ortho_init", [True, False])
def test_ortho_init(ortho_init):
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(ortho_init=ortho_init), **FAST)
    head = model.actor.head.proj.weight.detach().cpu().numpy()  # (2, 64)
    first = linears(model.actor.trunk)[0].weight.detach().cpu().numpy()  # (64, 4)
    head_gram = head @ head.T
    first_gram = first.T @ first
    if ortho_init:
        # SB3: gain 0.01 on the action layer, sqrt(2) on the hidden layers.
        np.testing.assert_allclose(head_gram, 1e-4 * np.eye(2), atol=1e-9)
        np.testing.assert_allclose(first_gram, 2.0 * np.eye(4), atol=1e-5)
    else:
        assert np.linalg.norm(head, axis=1).min() > 0.1
        assert not np.allclose(first_gram, 2.0 * np.eye(4), atol=1e-2)


def test_log_std_init():
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(log_std_init=-1.0), **FAST)
    np.testing.assert_allclose(model.actor.head.log_std.detach().exp().cpu().numpy(), [np.exp(-1.0)], rtol=1e-6)
    # Observable: stochastic actions spread around the deterministic one with std e^-1.
    obs = np.tile(np.array([1.0, 0.0, 0.0], np.float32), (4000, 1))
    model.set_random_seed(0)
    mode, _ = model.predict(obs[:1], deterministic=True)
    samples, _ = model.predict(obs, deterministic=False)
    assert samples.shape == (4000, 1)
    assert np.std(samples - mode) == pytest.approx(np.exp(-1.0), rel=0.05)


def test_normalize_images_false_with_cnn_policy():
    """With normalize_images=False the pixels reach the CNN unscaled: a 1-valued image under False gives
    what a 255-valued image gives under True (same seed, same initial weights)."""
    scaled = PPO("CnnPolicy", ImageEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    raw = PPO(
        "CnnPolicy",
        ImageEnv(),
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(normalize_images=False),
    )
    ones = np.ones((1, 36, 36, 3), np.uint8)
    with torch.no_grad():
        out_raw = raw.actor.distribution_params(raw.policy.obs_to_tensor(ones)[0])
        out_scaled = scaled.actor.distribution_params(scaled.policy.obs_to_tensor(ones * 255)[0])
        out_scaled_ones = scaled.actor.distribution_params(scaled.policy.obs_to_tensor(ones)[0])
    torch.testing.assert_close(out_raw, out_scaled)
    assert not torch.allclose(out_raw, out_scaled_ones)
    raw.learn(32)
    assert raw.num_timesteps == 32


@pytest.mark.parametrize("share", [True, False])
def test_share_features_extractor(share):
    model = PPO(
        "CnnPolicy",
        ImageEnv(),
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(share_features_extractor=share),
    )
    assert (model.actor.encoder is model.critic.encoder) == share
    actor_ids = {id(p) for p in model.actor.encoder.parameters()}
    critic_ids = {id(p) for p in model.critic.encoder.parameters()}
    assert bool(actor_ids & critic_ids) == share
    model.learn(32)


def test_sac_share_features_extractor_without_encoder_weights_trains_as_separate_encoders():
    """SAC's encoder on vector observations has no weights, so sharing it (SB3's share_features_extractor=True)
    changes nothing that trains: the same seed gives the same networks after training, bit for bit."""
    kwargs = dict(learning_starts=32, batch_size=16, seed=0)
    # each built and trained in turn: building a model reseeds the global generators that training draws from
    shared = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(share_features_extractor=True, net_arch=[16]), **kwargs)
    shared.learn(96)
    apart = SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(share_features_extractor=False, net_arch=[16]), **kwargs)
    apart.learn(96)
    assert shared.critic.encoder is shared.actor.encoder and apart.critic.encoder is not apart.actor.encoder
    assert shared.policy.share_features_extractor and not apart.policy.share_features_extractor
    for ours, theirs in zip(shared.policy.state_dict().values(), apart.policy.state_dict().values()):
        assert torch.equal(ours, theirs)


def _shared_cnn_sac(**kwargs) -> SAC:
    env = SpaceEnv(image_space((36, 36, 3)), spaces.Box(-1, 1, (2,), np.float32))
    policy_kwargs = dict(share_features_extractor=True, features_extractor_kwargs=dict(features_dim=32))
    return SAC("CnnPolicy", env, policy_kwargs=policy_kwargs, buffer_size=200, batch_size=8, seed=0, **kwargs)


@pytest.mark.cpu
def test_sac_with_a_shared_cnn_trains_it_with_the_actors_loss_alone():
    """SB3's share_features_extractor=True for SAC: one CNN for actor and critics; the critics' optimizer leaves it
    out and no gradient reaches it through the Q values, so the critics' update does not move it and the actor's
    does; the target critics' copy of it follows the actor's by Polyak averaging."""
    model = _shared_cnn_sac(learning_starts=16, tau=0.1).learn(24)
    encoder = list(model.actor.encoder.parameters())
    assert model.critic.encoder is model.actor.encoder and encoder
    assert {id(p) for p in model._critic_params}.isdisjoint(map(id, encoder))
    assert {id(p) for p in model._critic_params} | set(map(id, encoder)) == {id(p) for p in model.critic.parameters()}
    obs, actions = model.replay_buffer.sample_batch(8).observations, torch.zeros(8, 2)
    grads = [None if p.grad is None else p.grad.clone() for p in encoder]  # what the last actor step left
    model.critic(obs, actions)[0].sum().backward()
    assert all(torch.equal(p.grad, g) if g is not None else p.grad is None for p, g in zip(encoder, grads))
    batch = model.replay_buffer.sample_batch(8)
    for group in model.actor_optimizer.param_groups:
        group["lr"] = 0.0
    before = [p.detach().clone() for p in encoder]
    heads = [p.detach().clone() for p in model._critic_params]
    model._gradient_step(batch)  # the critics' step alone (the actor's learning rate is 0)
    assert all(torch.equal(a, p) for a, p in zip(before, encoder))
    assert any(not torch.equal(a, p) for a, p in zip(heads, model._critic_params))
    for group in model.actor_optimizer.param_groups:
        group["lr"] = 3e-4
    target_before = [p.detach().clone() for p in model.critic_target.encoder.parameters()]
    model.train(gradient_steps=1, batch_size=8)
    assert any(not torch.equal(a, p) for a, p in zip(before, encoder))  # the actor's step moves it
    for old, new, source in zip(target_before, model.critic_target.encoder.parameters(), encoder):
        torch.testing.assert_close(new, old + 0.1 * (source - old))


def test_custom_features_extractor_class(tmp_path):
    policy_kwargs = dict(features_extractor_class=TinyExtractor, features_extractor_kwargs=dict(features_dim=16))
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs, **FAST)
    extractors = [m for m in model.policy.modules() if isinstance(m, TinyExtractor)]
    assert len(extractors) == 1 and extractors[0].features_dim == 16
    # SB3's attributes hold the user's extractor object itself
    assert model.policy.features_extractor is model.policy.pi_features_extractor is extractors[0]
    assert model.policy.vf_features_extractor is extractors[0] and model.policy.features_extractor.net is not None
    assert model.actor.encoder.out_dim == 16
    assert linears(model.actor.trunk)[0].in_features == 16
    before = extractors[0].net[0].weight.detach().clone()
    model.learn(64)
    assert not torch.equal(before, extractors[0].net[0].weight)  # the extractor is trained

    # covey (on purpose) does not unpickle classes: the custom class is passed again at load.
    batch = cartpole_obs_batch(16)
    expected, _ = model.predict(batch, deterministic=True)
    model.save(tmp_path / "custom")
    with pytest.raises(Exception, match="custom_objects"):
        PPO.load(tmp_path / "custom")
    loaded = PPO.load(tmp_path / "custom", custom_objects={"policy_kwargs": policy_kwargs})
    np.testing.assert_array_equal(loaded.predict(batch, deterministic=True)[0], expected)


@pytest.mark.parametrize("algo", ["PPO", "SAC"])
def test_predict_runs_the_policy_in_evaluation_mode_as_sb3s(algo):
    """SB3's predict calls set_training_mode(False): dropout is off and batch norm uses its running statistics,
    so deterministic actions repeat."""
    model = (PPO if algo == "PPO" else SAC)(
        "MlpPolicy", "Pendulum-v1", policy_kwargs=dict(features_extractor_class=NormExtractor)
    )
    model.policy.set_training_mode(True)
    obs = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
    first = model.predict(obs, deterministic=True)[0]
    assert not model.policy.training and not model.actor.training and not model.critic.training
    for _ in range(3):
        np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], first)


@pytest.mark.parametrize("share", [True, False])
def test_ppo_rollouts_run_both_networks_in_evaluation_mode_and_updates_in_training_mode(share):
    """As in SB3: the rollout (one env, so batch norm could not train on its single rows) acts and values in
    evaluation mode, the update trains."""
    policy_kwargs = dict(features_extractor_class=NormExtractor, share_features_extractor=share)
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=policy_kwargs, n_steps=16, batch_size=16, n_epochs=1)
    extractors = [m for m in model.policy.modules() if isinstance(m, NormExtractor)]
    assert len(extractors) == (1 if share else 2)
    model.learn(32)
    for extractor in extractors:
        rollout = [training for rows, training in extractor.calls if rows == 1]
        update = [training for rows, training in extractor.calls if rows == 16]
        assert rollout and update and not any(rollout) and all(update)
    for mode in (False, True):  # the mode SB3's mlp_extractor reports is the policy's (a view of its layers)
        model.policy.set_training_mode(mode)
        assert model.policy.mlp_extractor.training is mode and model.policy.training is mode


def test_sac_target_critics_run_in_evaluation_mode_with_the_critics_batch_norm_statistics():
    """SB3's target critics never train: their batch norm statistics are copied from the critics at each target
    update (tau or not) and they run in evaluation mode, whatever mode the policy is set to."""
    model = SAC(
        "MlpPolicy",
        "Pendulum-v1",
        policy_kwargs=dict(features_extractor_class=NormExtractor, share_features_extractor=False),
        learning_starts=10,
        batch_size=8,
        seed=0,
    )
    model.policy.set_training_mode(True)
    model.learn(14)  # 4 gradient steps, each followed by a target update
    target = dict(model.critic_target.named_buffers())
    stats = {name: b for name, b in model.critic.named_buffers() if "running_" in name}
    assert stats and not model.critic_target.training
    for name, b in stats.items():
        torch.testing.assert_close(target[name], b, rtol=0, atol=0)
    assert int(target["encoder.extractor.net.1.num_batches_tracked"]) == 0  # never ran in training mode
    extractor = next(m for m in model.critic_target.modules() if isinstance(m, NormExtractor))
    assert extractor.calls and not any(training for _, training in extractor.calls)


def test_sb3_nature_cnn_as_features_extractor_class():
    policy_kwargs = dict(features_extractor_class=NatureCNN, features_extractor_kwargs=dict(features_dim=32))
    model = PPO("CnnPolicy", ImageEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0, policy_kwargs=policy_kwargs)
    assert any(isinstance(m, NatureCNN) for m in model.policy.modules())
    assert model.actor.encoder.out_dim == 32
    # extract_features with the policy's extractor prepares the images as SB3 does (channel-first, scaled)
    assert isinstance(model.policy.features_extractor, NatureCNN)
    images = torch.as_tensor(np.stack([ImageEnv().reset(seed=s)[0] for s in range(3)]))
    with torch.no_grad():
        features = model.policy.extract_features(images, model.policy.features_extractor)
        torch.testing.assert_close(features, model.policy.extract_features(images), rtol=0, atol=0)
        expected = model.policy.features_extractor(images.permute(0, 3, 1, 2).float() / 255.0)
        torch.testing.assert_close(features, expected)  # x * (1 / 255) against x / 255: within float rounding
    assert linears(model.actor.trunk) == []  # SB3: NatureCNN feeds the action layer directly
    model.learn(32)
    obs = ImageEnv().reset(seed=0)[0]
    assert model.predict(obs)[0].shape == ()
    assert model.predict(obs[None])[0].shape == (1,)


def test_nature_cnn_extractor_with_mlp_policy_gets_no_hidden_layers():
    """SB3 chooses the default net_arch from the extractor class: [] for NatureCNN, whatever the policy name."""
    model = PPO(
        "MlpPolicy",
        ImageEnv(),
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(features_extractor_class=NatureCNN),
    )
    assert linears(model.actor.trunk) == []
    assert linears(model.critic.trunk) == []


def test_optimizer_class_and_kwargs(tmp_path):
    policy_kwargs = dict(optimizer_class=torch.optim.RMSprop, optimizer_kwargs=dict(alpha=0.9))
    model = PPO("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs, **FAST)
    assert isinstance(model.optimizer, torch.optim.RMSprop)
    assert model.optimizer.param_groups[0]["alpha"] == 0.9
    model.learn(32)
    model.save(tmp_path / "rms")
    loaded = PPO.load(tmp_path / "rms")
    assert isinstance(loaded.optimizer, torch.optim.RMSprop)
    assert loaded.optimizer.param_groups[0]["alpha"] == 0.9


# ---------------------------------------------------------------------------- 5. attributes callbacks touch
def test_num_timesteps_and_learn_returns_self():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    assert model.num_timesteps == 0
    assert model.learn(64) is model
    assert model.num_timesteps == 64
    model.learn(32, reset_num_timesteps=False)
    assert model.num_timesteps == 96
    model.learn(32)
    assert model.num_timesteps == 32


def test_policy_predict_obs_to_tensor_set_training_mode():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    batch = cartpole_obs_batch(8)
    np.testing.assert_array_equal(
        model.policy.predict(batch, deterministic=True)[0], model.predict(batch, deterministic=True)[0]
    )
    tensor, vectorized = model.policy.obs_to_tensor(batch[0])
    assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (1, 4) and vectorized is False
    tensor, vectorized = model.policy.obs_to_tensor(batch)
    assert tuple(tensor.shape) == (8, 4) and vectorized is True
    model.policy.set_training_mode(False)
    assert not model.policy.training
    model.policy.set_training_mode(True)
    assert model.policy.training


@pytest.mark.parametrize(
    "policy_kwargs",
    [
        {},
        dict(optimizer_kwargs=dict(weight_decay=1e-4)),
        dict(optimizer_class=torch.optim.AdamW),
        dict(optimizer_kwargs=dict(eps=1e-7)),
    ],
    ids=["default", "kwargs-without-eps", "adamw", "eps-given"],
)
def test_ppo_optimizer_gets_sb3s_arguments(policy_kwargs):
    """SB3's rule for PPO's Adam: ``eps=1e-5`` only when no ``optimizer_kwargs`` are given, and only for Adam."""
    import stable_baselines3

    optimizers = [
        cls("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs, device="cpu").policy.optimizer
        for cls in (stable_baselines3.PPO, PPO)
    ]
    theirs, ours = ({k: g[k] for k in ("eps", "weight_decay", "lr")} for g in (o.param_groups[0] for o in optimizers))
    assert type(optimizers[1]) is type(optimizers[0]) and ours == theirs
    assert (theirs["eps"] == 1e-5) == (not policy_kwargs)


POLICY_SETTINGS = (
    *("net_arch", "activation_fn", "normalize_images", "optimizer_class", "optimizer_kwargs"),
    *("features_extractor_kwargs", "share_features_extractor"),
)


@pytest.mark.parametrize(
    "name, env, policy, policy_kwargs",
    [
        ("PPO", "CartPole-v1", "MlpPolicy", {}),
        (
            "PPO",
            "Pendulum-v1",
            "MlpPolicy",
            dict(
                net_arch=dict(pi=[32], vf=[16]),
                activation_fn=torch.nn.ReLU,
                ortho_init=False,
                log_std_init=-1.0,
                optimizer_kwargs=dict(eps=1e-6),
                share_features_extractor=False,
            ),
        ),
        ("PPO", ImageEnv, "CnnPolicy", dict(features_extractor_kwargs=dict(features_dim=32))),
        ("SAC", "Pendulum-v1", "MlpPolicy", {}),
        ("SAC", "Pendulum-v1", "MlpPolicy", dict(net_arch=[32, 32], activation_fn=torch.nn.Tanh)),
        ("SAC", "Pendulum-v1", "MlpPolicy", dict(share_features_extractor=True)),
    ],
    ids=["ppo", "ppo-kwargs", "ppo-cnn", "sac", "sac-kwargs", "sac-shared"],
)
def test_the_policy_keeps_its_settings_as_sb3s_does(name, env, policy, policy_kwargs):
    """``model.policy.net_arch``, ``activation_fn``, ... read as on SB3's policy built with the same arguments
    (SB3's defaults filled in), and so does ``is_vectorized_observation``."""
    import stable_baselines3

    import covey

    env = env if isinstance(env, str) else env()
    theirs = getattr(stable_baselines3, name)(policy, env, policy_kwargs=policy_kwargs, device="cpu").policy
    ours = getattr(covey, name)(policy, env, policy_kwargs=policy_kwargs).policy
    names = [*POLICY_SETTINGS, *(("ortho_init", "log_std_init", "use_sde") if name == "PPO" else ())]
    assert {n: getattr(ours, n) for n in names} == {n: getattr(theirs, n) for n in names}
    batch = np.stack([ours.observation_space.sample()] * 3)
    for obs in (batch, batch[0]):
        assert ours.is_vectorized_observation(obs) == theirs.is_vectorized_observation(obs)
    if policy_kwargs:  # what was given, not a default
        assert ours.net_arch == policy_kwargs.get("net_arch", ours.net_arch)


def test_get_env_and_set_env():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(32)
    new_env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
    model.set_env(new_env)
    assert model.get_env() is new_env
    model.learn(32)
    assert model.num_timesteps == 32


def test_set_env_with_other_spaces_names_both():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    pendulum = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    with pytest.raises(ValueError) as err:
        model.set_env(pendulum)
    assert str(model.observation_space) in str(err.value)
    assert str(pendulum.observation_space) in str(err.value)


def test_set_logger(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    new_logger = configure(str(tmp_path), ["csv"])
    model.set_logger(new_logger)
    assert model.logger is new_logger
    model.learn(128)
    assert model.logger is new_logger
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in ("train/value_loss", "train/policy_gradient_loss", "train/approx_kl", "time/fps"):
        assert key in header


def test_get_and_set_parameters():
    model_a = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64)
    model_b = PPO("MlpPolicy", "CartPole-v1", **{**FAST, "seed": 1})
    batch = cartpole_obs_batch(64)
    with torch.no_grad():
        logits_a = model_a.actor.distribution_params(model_a.policy.obs_to_tensor(batch)[0])
        assert not torch.allclose(logits_a, model_b.actor.distribution_params(model_b.policy.obs_to_tensor(batch)[0]))
    model_b.set_parameters(model_a.get_parameters())
    with torch.no_grad():
        torch.testing.assert_close(
            model_b.actor.distribution_params(model_b.policy.obs_to_tensor(batch)[0]), logits_a, rtol=0, atol=0
        )
    np.testing.assert_array_equal(
        model_b.predict(batch, deterministic=True)[0], model_a.predict(batch, deterministic=True)[0]
    )


class RecordLearningRates(BaseCallback):
    """Appends ``(num_timesteps, learning rate)`` to ``seen`` at each rollout's start, after the previous update set
    the rate (PPO's policy optimizer, SAC's actor optimizer)."""

    def __init__(self, name: str, seen: list[tuple[int, float]]) -> None:
        super().__init__()
        self.name, self.seen = name, seen

    def _on_rollout_start(self) -> None:
        optimizer = self.model.policy.optimizer if self.name == "PPO" else self.model.actor.optimizer
        self.seen.append((self.num_timesteps, optimizer.param_groups[0]["lr"]))

    def _on_step(self) -> bool:
        return True


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_schedules_continue_across_learn_calls_as_in_sb3(name):
    """``learn(n, reset_num_timesteps=False)`` continues a run: its schedules' progress counts from step 0 over
    the whole budget, as in SB3, instead of starting over with the call."""
    import stable_baselines3

    import covey

    def learning_rates(cls) -> list[tuple[int, float]]:
        seen: list[tuple[int, float]] = []

        if name == "PPO":
            model = cls("MlpPolicy", "CartPole-v1", learning_rate=lambda p: 1e-3 * p, **FAST)
        else:
            model = cls(
                "MlpPolicy", "Pendulum-v1", learning_rate=lambda p: 1e-3 * p, learning_starts=0, train_freq=32, seed=0
            )
        model.learn(64, callback=RecordLearningRates(name, seen))
        model.learn(128, callback=RecordLearningRates(name, seen), reset_num_timesteps=False)
        return seen

    ours, sb3 = learning_rates(getattr(covey, name)), learning_rates(getattr(stable_baselines3, name))
    assert [step for step, _ in ours] == [step for step, _ in sb3]
    np.testing.assert_allclose([lr for _, lr in ours], [lr for _, lr in sb3], rtol=1e-6)
    assert sb3[-1] == (160, pytest.approx(1e-3 * (1 - 160 / 192)))  # the whole run's progress, 192 steps


def test_log_every_n_timesteps_writes_rows(tmp_path):
    from stable_baselines3.common.callbacks import LogEveryNTimesteps

    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(128, callback=LogEveryNTimesteps(n_steps=32), log_interval=None)  # rows only from the callback
    rows = (tmp_path / "progress.csv").read_text().splitlines()
    steps = [int(float(row.split(",")[rows[0].split(",").index("time/total_timesteps")])) for row in rows[1:]]
    assert steps == [32, 64, 96, 128]


def test_verbose_names_the_device_as_sb3_does(capsys):
    PPO("MlpPolicy", "CartPole-v1", verbose=1, device="cpu", **FAST)
    assert "Using cpu device" in capsys.readouterr().out
    PPO("MlpPolicy", "CartPole-v1", device="cpu", **FAST)
    assert capsys.readouterr().out == ""


def test_load_keeps_the_seed_and_takes_custom_objects_as_sb3(tmp_path, capsys):
    PPO("MlpPolicy", "CartPole-v1", **{**FAST, "seed": 7}).save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m", custom_objects={"verbose": 1, "tensorboard_log": str(tmp_path / "tb")})
    assert (loaded.seed, loaded.verbose, loaded.tensorboard_log) == (7, 1, str(tmp_path / "tb"))
    assert PPO.load(tmp_path / "m", seed=3, verbose=2).seed == 3  # keyword arguments win, as in SB3
    PPO.load(tmp_path / "m", print_system_info=True)
    printed = capsys.readouterr().out
    assert "== CURRENT SYSTEM INFO ==" in printed and "== SAVED MODEL SYSTEM INFO ==" in printed
    assert printed.count(f"- PyTorch: {torch.__version__}") == 2


def test_get_vec_normalize_env_is_none_without_vec_normalize():
    assert PPO("MlpPolicy", "CartPole-v1", **FAST).get_vec_normalize_env() is None


def test_learning_rate_attribute():
    model = PPO("MlpPolicy", "CartPole-v1", learning_rate=1e-3, **FAST)
    assert model.learning_rate == 1e-3
    model.learn(32)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_set_random_seed_makes_sampling_reproducible():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    batch = cartpole_obs_batch(128)
    model.set_random_seed(3)
    first, _ = model.predict(batch, deterministic=False)
    model.set_random_seed(3)
    again, _ = model.predict(batch, deterministic=False)
    model.set_random_seed(4)
    other, _ = model.predict(batch, deterministic=False)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_ep_info_buffer_after_learning():
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    assert len(model.ep_info_buffer) == 0
    model.learn(256)
    assert len(model.ep_info_buffer) > 0
    assert all({"r", "l"} <= set(ep) for ep in model.ep_info_buffer)
    assert all(ep["r"] == ep["l"] for ep in model.ep_info_buffer)  # CartPole pays 1 per step


def test_device():
    model = PPO("MlpPolicy", "CartPole-v1", device="cpu", **FAST)
    assert model.device == torch.device("cpu")
    assert all(p.device == model.device for p in model.policy.parameters())
    auto = PPO("MlpPolicy", "CartPole-v1", **FAST)
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("device", ["tpu", "cuda:abc", 3.5])
def test_a_device_torch_does_not_know_is_a_value_error_naming_the_devices(device):
    """Where torch.device raised its own RuntimeError (and the CLI showed a traceback)."""
    from covey import POCA, SAC
    from covey.envs import EarlyExitEnv

    for build in (
        lambda: PPO("MlpPolicy", "CartPole-v1", device=device, **FAST),
        lambda: SAC("MlpPolicy", "Pendulum-v1", device=device),
        lambda: POCA("MlpPolicy", EarlyExitEnv, device=device),
    ):
        with pytest.raises(ValueError, match=r"device=.* is not a torch device: use 'auto' .*'cpu', 'cuda'"):
            build()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback of a machine without an accelerator")
def test_an_int_device_is_the_accelerator_of_that_index_and_falls_back_as_cuda_n_does():
    """torch reads ``device=0`` as the first accelerator; without one, it falls back to the CPU as ``"cuda:0"``
    does, where the error said that 0 is not a torch device."""
    with pytest.warns(UserWarning, match=r"device='cuda:0' was asked for, but CUDA is not available"):
        model = PPO("MlpPolicy", "CartPole-v1", device=0, **FAST)
    assert model.device == torch.device("cpu")
    with pytest.raises(ValueError, match="an accelerator's index is 0 or more"):
        PPO("MlpPolicy", "CartPole-v1", device=-1, **FAST)


def test_set_parameters_checks_its_device_and_keeps_the_models(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    model.save(tmp_path / "m.zip")
    for device in ("cuad", None):
        with pytest.raises(ValueError, match=r"is not a torch device"):
            model.set_parameters(tmp_path / "m.zip", device=device)
    other = PPO("MlpPolicy", "CartPole-v1", seed=1, **{k: v for k, v in FAST.items() if k != "seed"})
    other.set_parameters(tmp_path / "m.zip", device="cpu")
    assert other.device == torch.device("cpu")
    for a, b in zip(other.policy.parameters(), model.policy.parameters()):
        assert a.device == other.device and torch.equal(a, b)


def test_learn_names_the_device_when_the_policy_was_moved_off_the_models():
    """``policy.to("meta")`` replaces the parameter objects; learn said only that parameters were replaced."""
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    model.policy.to("meta")
    with pytest.raises(ValueError, match=r"moved to meta \(by policy.to\(\.\.\.\), say\) after it was built on cpu"):
        model.learn(64)


def test_policy_optimizer_is_the_models_optimizer_as_in_sb3(tmp_path):
    """SB3 code reads and changes the optimizer through model.policy.optimizer (e.g. its learning rate)."""
    from covey import POCA, SAC
    from covey.envs import EarlyExitEnv

    models = [
        PPO("MlpPolicy", "CartPole-v1", learning_rate=1e-3, **FAST),
        POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, learning_rate=1e-3, seed=0),
        SAC("MlpPolicy", "Pendulum-v1", learning_starts=10, learning_rate=1e-3, seed=0),
    ]
    for model in models:
        own = model.actor_optimizer if isinstance(model, SAC) else model.optimizer
        assert model.policy.optimizer is own
        model.learn(64)
        assert model.policy.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
        model.save(tmp_path / "model.zip")
        loaded = type(model).load(tmp_path / "model.zip")
        assert loaded.policy.optimizer is (loaded.actor_optimizer if isinstance(model, SAC) else loaded.optimizer)


def test_cuda_on_a_machine_without_cuda_falls_back_to_the_cpu_with_a_warning(monkeypatch, tmp_path):
    """As SB3 does (silently there): device='cuda' where CUDA is unavailable trains on the CPU."""
    from covey import POCA, SAC
    from covey.envs import EarlyExitEnv

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    builds = [
        lambda: PPO("MlpPolicy", "CartPole-v1", device="cuda", **FAST),
        lambda: SAC("MlpPolicy", "Pendulum-v1", device=torch.device("cuda:0"), learning_starts=10, seed=0),
        lambda: POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0, device="cuda"),
    ]
    for build in builds:
        with pytest.warns(UserWarning, match="CUDA is not available: using the CPU") as record:
            model = build()
        assert len(record) == 1 and record[0].filename == __file__  # the warning points at the user's line
        # a model that runs on the CPU only says that a machine with CUDA refuses the device (the script would
        # fail there: test_cpu_only_models_take_the_cpu_for_auto_and_refuse_cuda)
        cpu_only = "runs on the CPU only, and where CUDA is available device='cuda' is refused"
        assert (cpu_only in str(record[0].message)) == isinstance(model, POCA)
        assert model.device == torch.device("cpu")
        assert all(p.device.type == "cpu" for p in model.policy.parameters())
        model.learn(64)
    model.save(tmp_path / "poca.zip")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        assert type(model).load(tmp_path / "poca.zip", device="cuda").device == torch.device("cpu")


@pytest.mark.parametrize("make", ["poca", "recurrent ppo"])
def test_cpu_only_models_take_the_cpu_for_auto_and_refuse_cuda(monkeypatch, tmp_path, make):
    """POCA and recurrent PPO keep rollouts and memories on the CPU: where CUDA is available, device='auto'
    picks the CPU for them (also when loading) and an explicit CUDA device is refused with the fix."""
    from covey import POCA
    from covey.envs import EarlyExitEnv

    def build(device):
        if make == "poca":
            return POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0, device=device)
        return PPO("MlpLstmPolicy", "CartPole-v1", device=device, **FAST)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    model = build("auto")
    assert model.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in model.policy.parameters())
    model.save(tmp_path / "model.zip")
    assert type(model).load(tmp_path / "model.zip").device == torch.device("cpu")
    for device in ("cuda", torch.device("cuda:0")):
        with pytest.raises(ValueError, match="runs on the CPU only.*Pass device='cpu'"):
            build(device)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        type(model).load(tmp_path / "model.zip", device="cuda")


def test_tensorboard_log(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **FAST)
    model.learn(64, tb_log_name="first_run")
    assert glob.glob(str(tmp_path / "first_run_1" / "events.out.tfevents.*"))
    model.learn(32, tb_log_name="first_run", reset_num_timesteps=False)  # SB3: continues in the same run dir
    assert not (tmp_path / "first_run_2").exists()
    model.learn(32, tb_log_name="first_run")
    assert glob.glob(str(tmp_path / "first_run_2" / "events.out.tfevents.*"))


def test_each_learn_closes_the_last_learns_tensorboard_writer(tmp_path):
    """A script that calls learn in a loop (to save between calls) with tensorboard_log set keeps one TensorBoard
    writer, and its thread, open at a time; SB3's loop leaves one more open per call."""
    import threading

    model = PPO("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **FAST)
    model.learn(32)
    threads = threading.active_count()
    for _ in range(4):
        model.learn(32, reset_num_timesteps=False)
    assert threading.active_count() == threads
    assert len(glob.glob(str(tmp_path / "PPO_1" / "events.out.tfevents.*"))) == 5  # the run goes on in its folder


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_a_collected_models_tensorboard_writer_is_closed(tmp_path, agent):
    """A sweep that builds, trains and drops a model per trial with tensorboard_log set leaves no TensorBoard
    writer thread behind (SB3 leaves one per model): the logger a model's learn made closes once nothing holds it
    (the model collected). A model still in use keeps its logger open, as does a script that holds the logger."""
    import gc
    import threading

    def make():
        if agent == "PPO":
            return PPO("MlpPolicy", "CartPole-v1", tensorboard_log=str(tmp_path), **FAST)
        return SAC("MlpPolicy", "Pendulum-v1", tensorboard_log=str(tmp_path), learning_starts=8, batch_size=8)

    gc.collect()  # models of earlier tests, whose writers close as they are collected
    threads = threading.active_count()
    for _ in range(3):
        model = make()
        model.learn(16)
        del model
        gc.collect()
    assert threading.active_count() == threads
    kept = make().learn(16)
    kept.learn(16)  # the first learn's writer is closed here, the second's stays open
    gc.collect()
    assert threading.active_count() == threads + 1
    kept.logger.record("custom/after_learn", 1.0)
    kept.logger.dump(kept.num_timesteps)  # a script may still log after learn
    # SB3's way to go on in one TensorBoard run after a reload: the logger outlives the model that made it
    held = make()
    held.learn(16)
    logger = held.logger
    del held
    gc.collect()
    reloaded = make()
    reloaded.set_logger(logger)
    reloaded.learn(16)
    logger.record("custom/after_reload", 1.0)
    logger.dump(reloaded.num_timesteps)
    del reloaded, logger
    gc.collect()
    assert threading.active_count() == threads + 1
    custom = configure(str(tmp_path / "own"), ["tensorboard"])
    mine = make()
    mine.set_logger(custom)
    mine.learn(16)
    del mine
    gc.collect()
    custom.record("custom/later", 2.0)
    custom.dump(0)  # the script's logger is left open
    assert threading.active_count() == threads + 2
    custom.close()
    del kept
    gc.collect()
    assert threading.active_count() == threads


# ---------------------------------------------------------------------------- 6. SB3 policy classes
def test_sb3_policy_classes(tmp_path):
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.ppo import CnnPolicy, MlpPolicy, MultiInputPolicy

    model = PPO(MlpPolicy, "CartPole-v1", **FAST).learn(32)
    assert model.predict(np.zeros(4, np.float32))[0].shape == ()
    model.save(tmp_path / "mlp")
    assert PPO.load(tmp_path / "mlp").predict(np.zeros(4, np.float32))[0].shape == ()

    PPO(ActorCriticPolicy, "CartPole-v1", **FAST).learn(32)
    cnn = PPO(CnnPolicy, ImageEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0)
    assert any(isinstance(m, torch.nn.Conv2d) for m in cnn.policy.modules())
    multi = PPO(MultiInputPolicy, DictEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16)
    assert multi.num_timesteps == 16


# ---------------------------------------------------------------------------- 7. predict
def test_predict_image_in_either_channel_order():
    model = PPO("CnnPolicy", ImageEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(32)
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (8, 36, 36, 3), dtype=np.uint8)
    chw = np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))
    with torch.no_grad():
        torch.testing.assert_close(
            model.actor.distribution_params(model.policy.obs_to_tensor(hwc)[0]),
            model.actor.distribution_params(model.policy.obs_to_tensor(chw)[0]),
        )
    np.testing.assert_array_equal(model.predict(hwc, deterministic=True)[0], model.predict(chw, deterministic=True)[0])
    assert model.predict(hwc[0], deterministic=True)[0] == model.predict(chw[0], deterministic=True)[0]
    assert model.predict(chw[0])[0].shape == ()


def test_predict_dict_observations():
    model = PPO("MultiInputPolicy", DictEnv(), n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(32)
    single = {"vec": np.zeros(3, np.float32), "pos": 2}
    action, _ = model.predict(single, deterministic=True)
    assert action.shape == () and 0 <= int(action) < 3
    batched = {"vec": np.zeros((5, 3), np.float32), "pos": np.array([0, 1, 2, 3, 0])}
    actions, _ = model.predict(batched, deterministic=True)
    assert actions.shape == (5,)
    vec_env = model.get_env()
    assert model.predict(vec_env.reset())[0].shape == (1,)


def test_predict_clips_box_actions_to_bounds():
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(log_std_init=2.0), **FAST)
    obs = np.tile(np.array([1.0, 0.0, 0.0], np.float32), (1000, 1))
    actions, _ = model.predict(obs, deterministic=False)
    assert actions.shape == (1000, 1)
    assert actions.min() >= -2.0 and actions.max() <= 2.0
    assert np.isclose(np.abs(actions), 2.0).mean() > 0.5  # std e^2 ~ 7.4: most samples were clipped


@pytest.mark.parametrize(
    ("env_id", "obs_dim", "action_shape"),
    [("CartPole-v1", 4, ()), ("Pendulum-v1", 3, (1,))],
)
def test_predict_single_and_batched_shapes(env_id, obs_dim, action_shape):
    model = PPO("MlpPolicy", env_id, **FAST)
    single = np.zeros(obs_dim, np.float32)
    action, state = model.predict(single)
    assert isinstance(action, np.ndarray) and action.shape == action_shape and state is None
    assert model.predict(np.zeros((7, obs_dim), np.float32))[0].shape == (7, *action_shape)
    assert model.predict(np.zeros((1, obs_dim), np.float32))[0].shape == (1, *action_shape)
    assert model.action_space.contains(action if action_shape else int(action))  # the action is a valid env action


# ---------------------------------------------------------------------------- hyperparameters as attributes
def _parameters(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.policy.parameters()]


class _SetAttributes(BaseCallback):
    """Sets model attributes at the start of training, as a curriculum callback does."""

    def __init__(self, **values) -> None:
        super().__init__()
        self.values = values

    def _on_training_start(self) -> None:
        for name, value in self.values.items():
            setattr(self.model, name, value)

    def _on_step(self) -> bool:
        return True


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written-gradients", "autograd"])
def test_a_hyperparameter_set_on_the_model_is_the_one_training_uses(monkeypatch, manual):
    """SB3's PPO reads model.ent_coef, model.vf_coef, model.max_grad_norm... at each update, so callbacks change
    them (an entropy schedule); set on covey's model, they train exactly as when given to the constructor."""
    monkeypatch.setattr(PPO, "manual_gradients", manual)
    changed = dict(ent_coef=0.2, vf_coef=0.1, max_grad_norm=0.05, n_epochs=3, batch_size=16, gae_lambda=0.5)
    built = PPO("MlpPolicy", "CartPole-v1", **{**FAST, **changed}).learn(64)
    assigned = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64, callback=_SetAttributes(**changed))
    default = PPO("MlpPolicy", "CartPole-v1", **FAST).learn(64)
    for a, b in zip(_parameters(built), _parameters(assigned), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(_parameters(built), _parameters(default), strict=True))
    assert assigned._n_updates == built._n_updates == 2 * 3
    assert assigned.config.ent_coef == assigned.ent_coef == 0.2


def test_sac_gradient_steps_and_tau_set_on_the_model_count_as_in_sb3():
    """SB3's SAC reads model.gradient_steps and model.tau at each collection: the same number of updates."""
    from stable_baselines3 import SAC as SB3SAC

    from covey import SAC

    counts = []
    for cls in (SB3SAC, SAC):
        model = cls("MlpPolicy", "Pendulum-v1", learning_starts=10, batch_size=8, seed=0).learn(20)
        model.gradient_steps, model.tau = 3, 0.5
        model.learn(10, reset_num_timesteps=False)
        counts.append(model._n_updates)
    assert counts[0] == counts[1] == 10 + 3 * 10


def test_a_hyperparameter_set_on_the_model_is_saved(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    model.gamma, model.target_kl = 0.9, 0.02
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model")
    assert (loaded.gamma, loaded.target_kl) == (0.9, 0.02)
    assert (loaded.config.gamma, loaded.config.target_kl) == (0.9, 0.02)


def test_setting_a_hyperparameter_checks_it_as_the_constructor_does():
    from covey import SAC

    model = PPO("MlpPolicy", "CartPole-v1", **FAST)
    with pytest.raises(ValueError, match="gamma"):
        model.gamma = 1.5
    assert model.gamma == 0.99  # the refused value is not kept
    sac = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10, batch_size=8, seed=0)
    sac.train_freq = (2, "episode")  # converted, as the constructor converts it
    assert (sac.train_freq.frequency, sac.train_freq.unit.value) == (2, "episode")


@pytest.mark.parametrize(
    ("agent", "env_id", "name", "value", "what"),
    [
        ("PPO", "CartPole-v1", "n_steps", 64, "rollout buffer"),
        ("SAC", "Pendulum-v1", "buffer_size", 100, "replay buffer"),
        ("SAC", "Pendulum-v1", "ent_coef", 0.1, "temperature"),
    ],
)
def test_a_setting_the_networks_or_buffers_are_built_from_is_refused_after_setup(agent, env_id, name, value, what):
    import covey

    cls = getattr(covey, agent)
    model = cls("MlpPolicy", env_id, seed=0)
    before = getattr(model, name)
    with pytest.raises(ValueError, match=rf"{name} shapes the .*{what}.*{agent}\.load\(path, env, {name}=\.\.\.\)"):
        setattr(model, name, value)
    assert getattr(model, name) == before
    unbuilt = cls("MlpPolicy", env_id, seed=0, _init_setup_model=False)
    setattr(unbuilt, name, value)  # before the model is set up it is a setting like any other
    unbuilt._setup_model()
    assert getattr(unbuilt, name) == value


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_sb3_linear_schedules_go_on_after_save_and_load_as_in_sb3(name, tmp_path):
    """SB3's ``LinearSchedule`` is kept whole in the file: ``learn(n, reset_num_timesteps=False)`` after ``load``
    goes on with it where it stood, with the rates SB3's load of its own file trains at (before, the file kept the
    rate at save time, and training went on at it, constant)."""
    import stable_baselines3
    from stable_baselines3.common.utils import LinearSchedule

    import covey

    def rates_after_load(cls) -> tuple[list[tuple[int, float]], float | None]:
        seen: list[tuple[int, float]] = []

        learning_rate = LinearSchedule(1e-3, 1e-4, 0.8)
        if name == "PPO":
            env_id, extra = "CartPole-v1", dict(clip_range=LinearSchedule(0.3, 0.1, 1.0), **FAST)
        else:
            env_id, extra = "Pendulum-v1", dict(learning_starts=0, train_freq=32, seed=0)
        path = tmp_path / f"{cls.__module__.split('.')[0]}.zip"
        cls("MlpPolicy", env_id, learning_rate=learning_rate, **extra).learn(128).save(path)
        model = cls.load(path, env=gym.make(env_id))
        assert isinstance(model.learning_rate, LinearSchedule) and model._current_progress_remaining <= 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing stood in for a schedule, so nothing to warn of
            model.learn(128, callback=RecordLearningRates(name, seen), reset_num_timesteps=False)
        return seen, model.logger.name_to_value.get("train/clip_range")

    (ours, our_clip), (sb3, sb3_clip) = (
        rates_after_load(getattr(covey, name)),
        rates_after_load(getattr(stable_baselines3, name)),
    )
    assert [step for step, _ in ours] == [step for step, _ in sb3]
    np.testing.assert_allclose([lr for _, lr in ours], [lr for _, lr in sb3], rtol=1e-6)
    assert len({lr for _, lr in ours}) > 2  # the rate moved: the schedule went on
    if name == "PPO":
        assert our_clip == pytest.approx(sb3_clip) and our_clip < 0.3


def test_a_schedule_the_file_kept_as_a_number_is_named_at_the_next_learn(tmp_path):
    """A schedule written as a function is code, which a covey file does not keep: the first ``learn`` after
    ``load`` warns, once, that it trains at a constant rate, and names the ``custom_objects`` fix, at the user's
    line. ``load`` alone (an evaluation loop over checkpoints) stays quiet, and so does a schedule given again."""
    from covey import PPO

    model = PPO("MlpPolicy", "CartPole-v1", learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, **FAST)
    model.learn(64).save(tmp_path / "m.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = PPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    with pytest.warns(UserWarning, match="schedules that are functions") as caught:
        loaded.learn(64, reset_num_timesteps=False)
    (warning,) = [w for w in caught if "schedules" in str(w.message)]
    message = str(warning.message)
    assert "learning_rate=0.001" in message and "clip_range=0.2" in message and "custom_objects" in message
    assert warning.filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded.learn(64, reset_num_timesteps=False)  # said once
        given = PPO.load(
            tmp_path / "m.zip",
            env=gym.make("CartPole-v1"),
            custom_objects={"learning_rate": lambda p: 1e-3 * p, "clip_range": lambda p: 0.2 * p},
        )
        given.learn(64, reset_num_timesteps=False)
    set_again = PPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    set_again.clip_range = lambda p: 0.2 * p  # a schedule set on the model before learn is not named
    with pytest.warns(UserWarning, match="schedules that are functions") as caught:
        set_again.learn(64, reset_num_timesteps=False)
    (message,) = [str(w.message) for w in caught if "schedules" in str(w.message)]
    assert "learning_rate=0.001" in message and "clip_range" not in message


@pytest.mark.parametrize("schedule", ["sb3", "covey"])
def test_constant_schedule_objects_are_saved_as_their_number(schedule, tmp_path):
    from stable_baselines3.common.utils import ConstantSchedule as SB3ConstantSchedule
    from stable_baselines3.common.utils import FloatSchedule

    from covey import PPO
    from covey.agents.base import ConstantSchedule

    rate = FloatSchedule(SB3ConstantSchedule(3e-4)) if schedule == "sb3" else ConstantSchedule(3e-4)
    PPO("MlpPolicy", "CartPole-v1", learning_rate=rate, **FAST).learn(64).save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    assert loaded.learning_rate == pytest.approx(3e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded.learn(64, reset_num_timesteps=False)


def test_progress_remaining_is_restored_at_load_as_in_sb3(tmp_path):
    """SB3's load restores ``_current_progress_remaining``, which a schedule read before the next ``learn`` and a
    save straight after load see: covey's load of its own file and of SB3's does too."""
    import stable_baselines3

    from covey import PPO

    PPO("MlpPolicy", "CartPole-v1", **FAST).learn(48).save(tmp_path / "covey.zip")
    stable_baselines3.PPO("MlpPolicy", "CartPole-v1", **FAST).learn(48).save(tmp_path / "sb3.zip")
    for path in ("covey.zip", "sb3.zip"):
        assert PPO.load(tmp_path / path)._current_progress_remaining == pytest.approx(1 - 64 / 48)  # 64 steps done
    assert stable_baselines3.PPO.load(tmp_path / "sb3.zip")._current_progress_remaining == pytest.approx(1 - 64 / 48)


def test_learning_rate_attribute_and_setup_lr_schedule_as_in_sb3():
    """model.learning_rate = x alone leaves the schedule in force (SB3 too); _setup_lr_schedule() applies it."""
    from stable_baselines3 import PPO as SB3PPO

    rates = {}
    for cls in (SB3PPO, PPO):
        model = cls("MlpPolicy", "CartPole-v1", **FAST).learn(32)
        model.learning_rate = 1e-5
        model.learn(32, reset_num_timesteps=False)
        alone = model.policy.optimizer.param_groups[0]["lr"]
        model._setup_lr_schedule()
        model.learn(32, reset_num_timesteps=False)
        rates[cls.__module__.split(".")[0]] = (alone, model.policy.optimizer.param_groups[0]["lr"])
    assert rates["covey"] == rates["stable_baselines3"] == (3e-4, 1e-5)


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_policy_aliases_name_the_policy_classes_as_in_sb3(agent):
    import stable_baselines3

    import covey

    cls, sb3_cls = getattr(covey, agent), getattr(stable_baselines3, agent)
    assert cls.policy_aliases.keys() == sb3_cls.policy_aliases.keys()
    policies = getattr(covey, agent.lower()).policies
    for name, policy_class in cls.policy_aliases.items():
        assert policy_class is getattr(policies, name)
    env_id = "CartPole-v1" if agent == "PPO" else "Pendulum-v1"
    assert cls(cls.policy_aliases["MlpPolicy"], env_id, seed=0).policy_name == "MlpPolicy"


@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_load_keeps_verbose_tensorboard_log_and_the_episode_statistics(tmp_path, agent):
    """As SB3's load: verbose and tensorboard_log come back, and so do the episode counter and the episodes
    behind rollout/ep_rew_mean, so learn(reset_num_timesteps=False) after load goes on with them."""
    import stable_baselines3 as sb3

    import covey

    def build(lib):
        kwargs = dict(verbose=1, tensorboard_log=str(tmp_path / lib.__name__), seed=0, device="cpu")
        if agent == "ppo":
            return lib.PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=1, **kwargs)
        return lib.SAC("MlpPolicy", "Pendulum-v1", learning_starts=100, train_freq=50, **kwargs)

    models = {}
    for lib in (sb3, covey):
        model = build(lib).learn(450 if agent == "sac" else 512, log_interval=None if agent == "sac" else 1)
        model.save(tmp_path / f"{lib.__name__}.zip")
        loaded = type(model).load(tmp_path / f"{lib.__name__}.zip")
        models[lib.__name__] = (model, loaded)
    for model, loaded in models.values():
        assert loaded.verbose == 1 and loaded.tensorboard_log == model.tensorboard_log
        assert loaded._episode_num == model._episode_num
        assert [ep["r"] for ep in loaded.ep_info_buffer] == pytest.approx([ep["r"] for ep in model.ep_info_buffer])
        assert [ep["l"] for ep in loaded.ep_info_buffer] == [ep["l"] for ep in model.ep_info_buffer]
        assert loaded.ep_info_buffer.maxlen == model.ep_info_buffer.maxlen
    covey_model, covey_loaded = models["covey"]
    assert len(covey_loaded.ep_info_buffer) > 0 and (agent == "ppo" or covey_loaded._episode_num == 2)
    # Training on after load counts on from the saved episodes.
    covey_loaded.set_env(covey_model.get_env())
    covey_loaded.learn(10, reset_num_timesteps=False)
    assert covey_loaded._episode_num >= covey_model._episode_num and len(covey_loaded.ep_info_buffer) >= len(
        covey_model.ep_info_buffer
    )


@pytest.mark.parametrize("value", [np.float32(64), np.int64(64), 64.0])
def test_learn_takes_any_real_number_of_timesteps(value):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1).learn(value)
    assert model.num_timesteps == 64


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "64", True, None])
def test_learn_refuses_timesteps_that_are_not_a_finite_number(value):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1)
    with pytest.raises(ValueError, match="total_timesteps must be a finite number >= 0"):
        model.learn(value)


@pytest.mark.parametrize("agent", ["ppo", "sac", "poca"])
def test_a_replaced_optimizer_is_refused_at_learn_with_the_way_to_choose_one(agent):
    """SB3's update steps model.policy.optimizer (SAC's: actor.optimizer and critic.optimizer), so a script may
    swap them; covey steps the fused optimizer it built, and says so instead of never using the new one."""
    from covey import POCA
    from covey.envs import EarlyExitEnv

    if agent == "ppo":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32)
        slots = {"policy.optimizer": model.policy}
    elif agent == "sac":
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10)
        slots = {"actor.optimizer": model.actor, "critic.optimizer": model.critic, "policy.optimizer": model.policy}
    else:
        model = POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8)
        slots = {"policy.optimizer": model.policy}
    model.learn(32)  # the optimizers as built
    for name, owner in slots.items():
        own = owner.optimizer
        owner.optimizer = torch.optim.SGD(owner.parameters(), lr=0.1)
        with pytest.raises(ValueError, match=rf"model\.{name} was replaced \(by SGD\).*optimizer_class"):
            model.learn(32)
        owner.optimizer = own
    model.learn(32)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: PPO("MlpPolicy", "CartPole-v1", seed=1.5), r"seed=1.5 is invalid: pass a whole number"),
        (lambda: PPO("MlpPolicy", "CartPole-v1", seed=-1), r"seed=-1 is invalid"),
        (lambda: PPO("MlpPolicy", "CartPole-v1", policy_kwargs=[1]), r"policy_kwargs=\[1\] is invalid: pass a dict"),
        (lambda: SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=[1]), r"policy_kwargs=\[1\] is invalid"),
        (lambda: PPO("MlpPolicy", "CartPole-v1", verbose="1"), r"verbose='1' is invalid"),
        (lambda: SAC("MlpPolicy", "Pendulum-v1", action_noise="normal"), r"action_noise='normal' is invalid"),
        (
            lambda: PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(features_extractor_class=int)),
            r"features_extractor_class=<class 'int'> is invalid",
        ),
        (
            lambda: PPO("MultiInputPolicy", SpaceEnv(spaces.Dict({}), spaces.Discrete(2))),
            r"empty Dict: the policy would observe nothing",
        ),
    ],
    ids=["seed-float", "seed-negative", "ppo-kwargs-list", "sac-kwargs-list", "verbose", "noise", "extractor", "dict"],
)
def test_constructor_arguments_of_the_wrong_kind_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_poca_n_envs_of_the_wrong_kind_is_named():
    from covey import POCA
    from covey.envs import EarlyExitEnv

    for n_envs in (2.5, 0, True):  # a whole float (2.0) is the int, as in the hyperparameters
        with pytest.raises(ValueError, match=rf"n_envs={n_envs!r} is invalid: it must be an int >= 1"):
            POCA("MlpPolicy", EarlyExitEnv, n_envs=n_envs)


def test_a_numpy_integer_seed_is_a_seed():
    a = PPO("MlpPolicy", "CartPole-v1", seed=np.int64(3), n_steps=32, batch_size=32).learn(32)
    b = PPO("MlpPolicy", "CartPole-v1", seed=3, n_steps=32, batch_size=32).learn(32)
    assert a.seed == 3 and type(a.seed) is int
    assert all(torch.equal(x, y) for x, y in zip(a.policy.parameters(), b.policy.parameters(), strict=True))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"callback": "my_callback"}, r"callback='my_callback' is invalid: pass an SB3 BaseCallback"),
        ({"callback": [5]}, r"callback=\[5\] is invalid"),
        ({"log_interval": 0}, r"log_interval=0 is invalid: it must be a whole number other than 0"),
        ({"log_interval": 2.5}, r"log_interval=2.5 is invalid: it must be a whole number other than 0"),
    ],
)
@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_learn_names_a_callback_or_log_interval_of_the_wrong_kind_before_any_step(agent, kwargs, message):
    if agent == "ppo":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32)
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10)
    with pytest.raises(ValueError, match=message):
        model.learn(32, **kwargs)
    assert model.num_timesteps == 0


@pytest.mark.parametrize("log_interval", [-1, 1.0, np.int64(-2)])
@pytest.mark.parametrize("agent", ["ppo", "sac"])
def test_log_interval_counts_as_sb3s_modulo_does(agent, log_interval):
    """SB3 logs where ``count % log_interval == 0``: -1 and 1.0 log every iteration (SAC: episode), -2 every
    second one. Both libraries write rows at the same step counts."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.logger import KVWriter, Logger

    import covey

    def rows_written(lib) -> list[int]:
        steps = []

        class Record(KVWriter):
            def write(self, key_values, key_excluded, step=0):
                steps.append(int(key_values["time/total_timesteps"]))

        if agent == "ppo":
            model = lib.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0)
            budget = 64
        else:
            env = gym.wrappers.TimeLimit(gym.make("Pendulum-v1").unwrapped, 20)
            model = lib.SAC("MlpPolicy", env, learning_starts=10, batch_size=8, seed=0)
            budget = 80
        model.set_logger(Logger(None, [Record()]))
        model.learn(budget, log_interval=log_interval)
        return steps

    every = {"ppo": [16, 32, 48, 64], "sac": [20, 40, 60, 80]}[agent]  # iterations / episodes end at these steps
    expected = every if abs(log_interval) == 1 else every[1::2]
    assert rows_written(sb3) == expected
    assert rows_written(covey) == expected


def test_the_rollouts_step_count_in_callback_locals_is_sb3s_while_stepping_and_at_the_end():
    import stable_baselines3 as sb3
    from stable_baselines3.common.callbacks import BaseCallback

    class Record(BaseCallback):
        def _on_training_start(self) -> None:
            self.seen = []

        def _on_step(self) -> bool:
            self.seen.append(("step", self.locals["n_steps"]))
            return True

        def _on_rollout_end(self) -> None:
            self.seen.append(("end", self.locals["n_steps"]))

    runs = []
    for lib in (sb3, __import__("covey")):
        callback = Record()
        lib.PPO("MlpPolicy", "CartPole-v1", n_steps=4, batch_size=4, n_epochs=1, seed=0).learn(8, callback=callback)
        runs.append(callback.seen)
    assert runs[1] == runs[0] == [*(("step", t) for t in range(4)), ("end", 4)] * 2


def test_sac_behind_vecnormalize_stores_images_in_the_models_layout_from_an_env_of_the_other(tmp_path):
    """A model trained on channel-last images loaded with a channel-first env behind a VecNormalize: the replay
    buffer keeps the VecNormalize's original observations, moved into the model's layout as the observations
    the model acts on are (they were stored in the env's and learn failed with a broadcast error)."""

    def env(shape):
        obs = spaces.Dict({"image": image_space(shape), "vec": spaces.Box(-1, 1, (2,), np.float32)})
        venv = DummyVecEnv([lambda: SpaceEnv(obs, spaces.Box(-1, 1, (1,), np.float32), episode_length=6)])
        return VecNormalize(venv, norm_obs_keys=["vec"])

    SAC("MultiInputPolicy", env((36, 36, 1)), learning_starts=4, batch_size=4, buffer_size=64).save(tmp_path / "m")
    model = SAC.load(tmp_path / "m", env=env((1, 36, 36)))
    model.learn(10)  # episodes of 6 steps: the newest step is not an episode's end
    buffer = model.replay_buffer
    assert buffer.size() == 10 and buffer.observations["image"].shape[2:] == (36, 36, 1)
    env_image = model.get_vec_normalize_env().get_original_obs()["image"][0]  # channel-first, the env's
    np.testing.assert_array_equal(buffer.next_observations["image"][9, 0], np.moveaxis(env_image, 0, -1))
    np.testing.assert_array_equal(buffer.observations["image"][9, 0], buffer.next_observations["image"][8, 0])


@pytest.mark.parametrize("agent", ["ppo", "sac", "poca"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_model_trains_saves_and_loads_as_its_own(tmp_path, agent, how):
    """copy.deepcopy(model) and pickle (as SB3's models allow): the copy predicts as the original, trains on its
    own parameters (its optimizer and NumPy acting follow them; the original stays), saves a file that loads,
    keeps its schedules, replay buffer and counters, and copying leaves the global random state alone."""
    import copy
    import pickle

    from covey import POCA
    from covey.envs import EarlyExitEnv

    if agent == "ppo":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0, learning_rate=lambda p: 1e-3 * p)
        obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    elif agent == "sac":
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0)
        obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    else:
        model = POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8, seed=0)
        obs = {f"agent_{i}": model.observation_space.sample() for i in range(3)}
    model.learn(64)
    before = [p.detach().clone() for p in model.policy.parameters()]
    random_state = np.random.get_state()[1].copy()
    if how == "deepcopy":
        assert copy.copy(model).policy is model.policy  # a shallow copy shares, as any object's does
        clone = copy.deepcopy(model)
    else:
        if agent == "ppo":
            model.learning_rate = 1e-3  # a lambda does not pickle (nor in SB3)
            model._setup_lr_schedule()
        clone = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(np.random.get_state()[1], random_state)
    assert clone is not model and clone.num_timesteps == model.num_timesteps == 64
    assert clone._n_updates == model._n_updates and clone._episode_num == model._episode_num
    if agent == "ppo" and how == "deepcopy":
        assert clone.learning_rate is model.learning_rate  # the schedule as given
    if agent == "sac":
        assert clone.replay_buffer is not model.replay_buffer and clone.replay_buffer.size() == 64
        np.testing.assert_array_equal(clone.replay_buffer.observations, model.replay_buffer.observations)

    def actions(m):
        out = m.predict(obs, deterministic=True)[0]
        return np.stack([out[k] for k in sorted(out)]) if isinstance(out, dict) else np.asarray(out)

    np.testing.assert_array_equal(actions(clone), actions(model))
    clone.learn(64, reset_num_timesteps=False)
    assert clone.num_timesteps == 128 and model.num_timesteps == 64
    assert all(torch.equal(a, b) for a, b in zip(before, model.policy.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before, clone.policy.parameters(), strict=True))
    clone.save(tmp_path / "clone")
    loaded = type(model).load(tmp_path / "clone")
    np.testing.assert_array_equal(actions(loaded), actions(clone))


class RebuiltEnv(gym.Env, EzPickle):
    """An env that pickles as Gymnasium's EzPickle does (Box2D's, and PettingZoo's mpe2, butterfly and sisl envs):
    by its constructor's arguments, so a copy is a new env that needs a reset before its first step."""

    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 10):
        EzPickle.__init__(self, length)
        self.length, self.t = length, None

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        assert self.t is not None, "step() before reset()"
        self.t += 1
        return np.full(2, self.t / self.length, np.float32), 1.0, self.t >= self.length, False, {}


@pytest.mark.parametrize("agent", ["ppo", "poca"])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_a_model_whose_env_pickles_by_its_arguments_trains_from_a_reset(agent, how):
    """Such an env's copy is a new env, not the one in mid-episode: the copy's next learn starts from a reset,
    where its first step failed inside the env (mpe2: no agent_selection; LunarLander: no lander)."""
    import copy
    import pickle

    from covey import POCA

    if agent == "ppo":
        model = PPO("MlpPolicy", RebuiltEnv(), n_steps=16, batch_size=16, seed=0).learn(24)  # ends mid-episode
    else:
        make = functools.partial(simple_spread_v3.parallel_env, N=2)
        model = POCA("MlpPolicy", make, n_steps=8, batch_size=16, seed=0)
        model.learn(20)
    clone = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    clone.learn(32, reset_num_timesteps=False)
    assert clone.num_timesteps == model.num_timesteps + 32
    model.learn(16, reset_num_timesteps=False)  # the original goes on where it was


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_keeps_policy_kwargs_the_file_cannot_hold(how):
    """A copy is rebuilt from the model's file, which names a user's extractor class and cannot hold an array: the
    copy takes them from the model (as SB3's pickle copies them), where load needs custom_objects."""
    import copy
    import pickle

    kwargs = dict(features_extractor_class=NormExtractor)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0, policy_kwargs=kwargs).learn(32)
    clone = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert type(clone.policy.features_extractor) is NormExtractor
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_array_equal(clone.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


def test_policy_kwargs_the_file_cannot_hold_warn_at_save_and_come_back_from_custom_objects(tmp_path):
    from stable_baselines3.common.policies import ActorCriticPolicy

    from covey.serialization import ModelFileError

    class Scaled(ActorCriticPolicy):  # a user's class with a setting of its own, an array
        def __init__(self, *args, scale=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.scale = scale

    scale = np.array([0.5, 2.0])
    model = PPO(Scaled, "CartPole-v1", n_steps=32, seed=0, policy_kwargs=dict(scale=scale, ortho_init=False))
    with pytest.warns(UserWarning, match=r"policy_kwargs\['scale'\] \(a ndarray\) is not in the model file"):
        model.save(tmp_path / "m")
    with pytest.raises(ModelFileError, match=r"policy_kwargs\['scale'\], a ndarray.*custom_objects=\{'policy_kwargs'"):
        PPO.load(tmp_path / "m.zip", custom_objects={"policy_class": Scaled})
    given = {"policy_class": Scaled, "policy_kwargs": {"scale": scale}}
    loaded = PPO.load(tmp_path / "m.zip", custom_objects=given)
    assert loaded.policy.scale is scale and loaded.policy_kwargs["ortho_init"] is False  # the file's others kept


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_sb3s_private_stats_window_size_reads_and_sets_the_window(agent):
    """SB3 keeps the window as _stats_window_size, which scripts and callbacks read (an AttributeError before)."""
    import stable_baselines3 as sb3

    import covey

    env = "CartPole-v1" if agent == "PPO" else "Pendulum-v1"
    ours, theirs = (getattr(lib, agent)("MlpPolicy", env, stats_window_size=5) for lib in (covey, sb3))
    assert ours._stats_window_size == theirs._stats_window_size == 5
    ours._stats_window_size = 3
    assert ours.stats_window_size == 3
    ours.learn(ours.n_steps if agent == "PPO" else 10)
    assert ours.ep_info_buffer.maxlen == 3


@pytest.mark.parametrize(
    ("name", "advice"),
    [
        ("DQN", "from stable_baselines3 import DQN"),
        ("MaskablePPO", "from sb3_contrib import MaskablePPO"),
        ("RecurrentPPO", "PPO('MlpLstmPolicy', ...)"),
    ],
)
def test_importing_an_algorithm_covey_lacks_says_where_it_is(name, advice):
    """``from covey import DQN`` in a script switched from SB3 names where the algorithm lives (it was Python's bare
    "cannot import name"); a name that is no algorithm stays an AttributeError (hasattr answers False)."""
    import covey

    with pytest.raises(ImportError, match=re.escape(advice)):
        exec(f"from covey import {name}", {})
    assert not hasattr(covey, "NoSuchThing")
    if name == "RecurrentPPO":  # the advice, as written, builds a recurrent PPO
        assert covey.PPO("MlpLstmPolicy", "CartPole-v1", n_steps=8, batch_size=8).actor.memory is not None


def test_load_prints_nothing_as_sb3s_load(tmp_path, capsys):
    """SB3's load builds the model without its verbose, so loading a file saved with verbose=1 prints nothing (covey
    printed "Using cpu device" on every load); the loaded model keeps verbose=1 and logs as it did."""
    PPO("MlpPolicy", "CartPole-v1", verbose=1, device="cpu", **FAST).save(tmp_path / "model.zip")
    capsys.readouterr()
    model = PPO.load(tmp_path / "model.zip", env=make_vec_env("CartPole-v1", n_envs=1))
    assert capsys.readouterr().out == ""
    assert model.verbose == 1
    model.learn(32)
    assert "total_timesteps | 32" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"verbose=-1 is invalid"):
        PPO.load(tmp_path / "model.zip", verbose=-1)


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_module_hooks_are_honoured_in_training(name):
    """A forward hook on a policy module (SB3 scripts bound or cut logits this way) acts in training: the
    hand-written passes call no module, so they stand aside while one is registered. Here the hook zeroes the
    module's output, so no gradient reaches the weights below it: they stay where they started (the hand-written
    update moved them, ignoring the hook). Without the hook they move."""
    import covey

    def trained(hooked: bool):
        if name == "PPO":
            model = covey.PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=2, seed=0)
            module = model.policy.action_net
        else:
            model = covey.SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0)
            module = model.actor.latent_pi
        before = [p.detach().clone() for p in module.parameters()]
        if hooked:
            module.register_forward_hook(lambda mod, inputs, output: output * 0.0)
        model.learn(128)
        return [torch.equal(b, p) for b, p in zip(before, module.parameters(), strict=True)]

    assert all(trained(hooked=True))
    assert not any(trained(hooked=False))


def test_a_forward_hook_on_a_module_covey_never_calls_as_a_whole_warns_with_the_layers_to_hook():
    """SB3's PPO calls model.policy (and its mlp_extractor) at each rollout step, so hooks there record acting;
    covey calls the layers, so a hook on those wholes would silently never run in training: it warns, naming the
    layers whose hooks do run (and which record acting here, as the test shows)."""
    import covey

    model = covey.PPO("MlpPolicy", "CartPole-v1", **FAST)
    for module, name in ((model.policy, "model.policy"), (model.policy.mlp_extractor, "mlp_extractor")):
        for register in (module.register_forward_hook, module.register_forward_pre_hook):
            with pytest.warns(UserWarning, match=rf"A forward hook on .*{name} runs only where your code calls"):
                register(lambda *args: None)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.policy.mlp_extractor.policy_net[0].register_forward_hook(lambda *args: seen.append(args[2].shape))
    model.learn(32)
    assert (1, 64) in seen  # each acting step's batch of one env's observation


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_forward_hooks_record_a_layers_output_before_its_relu(name):
    """Recording activations (a forward hook that keeps a Linear's output, as SB3 users do for analysis) keeps
    the layer's own output: the ReLU after it is not in place, so it does not overwrite the recorded tensor with
    its clamped values."""
    import covey

    if name == "PPO":
        model = covey.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(activation_fn=torch.nn.ReLU), **FAST)
        layer, obs = model.policy.mlp_extractor.policy_net[0], torch.randn(64, 4)
        run = model.policy.get_distribution
    else:
        model = covey.SAC("MlpPolicy", "Pendulum-v1", seed=0)
        layer, obs = model.actor.latent_pi[0], torch.randn(64, 3)
        run = model.actor
    recorded = []
    layer.register_forward_hook(lambda module, inputs, output: recorded.append(output))
    with torch.no_grad():
        run(obs)
        expected = torch.nn.functional.linear(obs, layer.weight, layer.bias)
    assert len(recorded) == 1 and (expected < 0).any()
    torch.testing.assert_close(recorded[0], expected)


@pytest.mark.parametrize("name", ["PPO-lstm", "POCA", "POCA-lstm"])
def test_a_float64_default_set_after_the_model_is_built_leaves_it_acting_and_training(name):
    """torch.set_default_dtype(torch.float64) after the model is built: SB3 (and sb3-contrib's RecurrentPPO) go on
    in float32, as covey's PPO and SAC did; a memory's first state and POCA's and the memories' runtime tensors
    took the new default, and acting or the update failed with torch's dtype mismatch."""
    import covey
    from covey.envs import EarlyExitEnv

    lstm = dict(policy_kwargs=dict(memory=dict(kind="lstm"))) if name.endswith("lstm") else {}
    if name.startswith("PPO"):
        model, obs = covey.PPO("MlpPolicy", "CartPole-v1", **FAST, **lstm), np.zeros(4, np.float32)
    else:
        model = covey.POCA("MlpPolicy", EarlyExitEnv, n_steps=32, batch_size=32, n_epochs=1, seed=0, **lstm)
        obs = {agent: np.zeros(model.observation_space.shape, np.float32) for agent in EarlyExitEnv().possible_agents}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model.learn(64)
        model.predict(obs, deterministic=True)
    finally:
        torch.set_default_dtype(default)
    weights = list(model.actor.parameters())
    assert all(p.dtype == torch.float32 and bool(torch.isfinite(p).all()) for p in weights)


@pytest.mark.parametrize("name", ["PPO", "PPO-lstm", "SAC-discrete", "POCA"])
def test_learn_inside_inference_mode_trains_as_inside_no_grad(name):
    """learn() inside the caller's torch.no_grad() trains; inside torch.inference_mode() the configurations that
    train through autograd (a memory, Discrete SAC, POCA) failed with torch's "element 0 of tensors does not
    require grad", while the others trained."""
    import covey
    from covey.envs import EarlyExitEnv

    if name.startswith("PPO"):  # the two-hot critic trains through autograd; one minibatch is the whole rollout
        memory = dict(memory=dict(kind="lstm")) if name == "PPO-lstm" else dict(value_head="twohot")
        model = covey.PPO("MlpPolicy", "CartPole-v1", **FAST, policy_kwargs=memory)
    elif name == "SAC-discrete":
        model = covey.SAC("MlpPolicy", "CartPole-v1", learning_starts=16, batch_size=16, seed=0)
    else:
        model = covey.POCA("MlpPolicy", EarlyExitEnv, n_steps=32, batch_size=32, n_epochs=1, seed=0)
    before = [p.detach().clone() for p in model.actor.parameters()]
    with torch.inference_mode():
        model.learn(64)
    assert torch.is_inference_mode_enabled() is False
    assert not all(torch.equal(b, p) for b, p in zip(before, model.actor.parameters(), strict=True))


class HugeRewards(gym.Env):
    """Rewards of 3e38, whose returns overflow float32: the critic's loss turns NaN in the first update."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.ones(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.ones(3, np.float32) * self.t, 3e38, False, self.t >= 10, {}


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_anomaly_detection_names_the_operation_that_gave_nan_before_the_weights_take_it(name):
    """torch.autograd.detect_anomaly() is how SB3 users find a NaN: SB3 raises at the operation, before the
    optimizer's step. covey's hand-written passes never ran autograd, so its checks were skipped, the step wrote
    NaN into the weights and covey's own divergence check said so after the fact."""
    import covey

    kwargs = dict(n_steps=32, batch_size=32, n_epochs=1) if name == "PPO" else dict(learning_starts=10, batch_size=16)
    model = getattr(covey, name)("MlpPolicy", HugeRewards(), seed=0, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning that anomaly detection slows training
        with torch.autograd.detect_anomaly(), pytest.raises(RuntimeError, match=r"Function '\w+' returned nan values"):
            model.learn(96 if name == "PPO" else 40)
    assert all(bool(torch.isfinite(p).all()) for p in model.policy.parameters())


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_sb3s_compiled_policy_line_keeps_the_policy_with_a_warning(name, tmp_path):
    """SB3's docs compile the policy (model.policy = th.compile(model.policy)). covey took the compiled module in
    silence, never called it, and saved its weights under "_orig_mod." names, which load refused."""
    import covey

    env_id, kwargs = ("CartPole-v1", FAST) if name == "PPO" else ("Pendulum-v1", dict(learning_starts=16, seed=0))
    model = getattr(covey, name)("MlpPolicy", env_id, **kwargs)
    policy = model.policy
    try:
        compiled = torch.compile(model.policy)
    except RuntimeError as err:  # a Python this torch's compiler does not support
        pytest.skip(str(err))
    with pytest.warns(UserWarning, match=r"torch.compile\(model.policy\) keeps the policy uncompiled"):
        model.policy = compiled
    assert model.policy is policy and vars(model)["policy"] is policy
    model.learn(32)
    model.save(tmp_path / "model")
    loaded = getattr(covey, name).load(tmp_path / "model")
    obs = np.zeros(loaded.observation_space.shape, np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.policy = policy  # any other module is set as it is
    del model.policy
    assert not hasattr(model, "policy") and "policy" not in vars(model)
    model.policy = policy


@pytest.mark.parametrize("name", ["PPO", "PPO-lstm", "SAC", "POCA"])
def test_activations_a_forward_hook_keeps_while_acting_are_ordinary_tensors_as_in_sb3(name):
    """SB3 acts under torch.no_grad; covey acted under torch.inference_mode, whose tensors a probe trained on kept
    activations ("Inference tensors cannot be saved for backward") or an in-place edit of them refused. With a
    forward hook registered, covey acts under no_grad too, in rollouts and in predict."""
    import covey
    from covey.envs import EarlyExitEnv

    if name.startswith("PPO"):
        kwargs = dict(policy_kwargs=dict(memory=dict(kind="lstm"))) if name == "PPO-lstm" else {}
        model, obs = covey.PPO("MlpPolicy", "CartPole-v1", **FAST, **kwargs), np.zeros(4, np.float32)
    elif name == "SAC":
        model, obs = covey.SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16), np.zeros(3, np.float32)
    else:
        model = covey.POCA("MlpPolicy", EarlyExitEnv, n_steps=32, batch_size=32, n_epochs=1)
        obs = np.zeros(model.observation_space.shape, np.float32)
    layer = next(m for m in model.actor.modules() if isinstance(m, torch.nn.Linear))
    kept = []

    def keep(module, inputs, output):
        if not torch.is_grad_enabled():  # acting (training's passes record gradients)
            kept.append((torch.is_inference_mode_enabled(), output))

    layer.register_forward_hook(keep)
    whole = []  # a hook on model.actor itself runs in acting too (PPO's and POCA's rollouts skipped it)
    model.actor.register_forward_hook(lambda *args: whole.append(torch.is_grad_enabled()))
    model.learn(32)
    if name != "PPO-lstm":  # a memory's steps run through its layers (their hooks run)
        assert len(whole) >= 2 and not any(whole)
    model.predict(obs, deterministic=True)
    assert len(kept) >= 2
    for inference, output in kept:
        assert not inference and not output.is_inference()
    probe = torch.nn.Linear(layer.out_features, 1)
    probe(torch.cat([output.reshape(-1, layer.out_features) for _, output in kept])).sum().backward()  # a probe
    assert probe.weight.grad is not None
    kept[-1][1].div_(2.0)  # and an in-place edit takes them


@pytest.mark.parametrize("name", ["PPO", "SAC"])
@pytest.mark.parametrize("kind", ["register_hook", "register_post_accumulate_grad_hook"])
def test_gradient_hooks_on_parameters_act_in_training_as_in_sb3(name, kind):
    """A gradient hook on a parameter (clipping or masking a gradient, wandb's watch counting them) acts in
    training, as in SB3: the hand-written passes write gradients without autograd, so they stand aside while one
    is registered. Here every actor parameter's gradient is zeroed (with plain SGD), so in both libraries none of
    them moves, and the hooks ran."""
    import stable_baselines3

    import covey

    def zero(grad_or_param):
        if kind == "register_hook":
            return torch.zeros_like(grad_or_param)
        grad_or_param.grad.zero_()

    for library in (stable_baselines3, covey):
        calls = [0]
        sgd = dict(optimizer_class=torch.optim.SGD)
        if name == "PPO":
            model = library.PPO(
                "MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=2, seed=0, policy_kwargs=sgd
            )
            params = [p for n, p in model.policy.named_parameters() if "value" not in n]  # the actor's side
        else:
            model = library.SAC(
                "MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0, policy_kwargs=sgd
            )
            params = list(model.actor.parameters())
        before = [p.detach().clone() for p in params]

        def hook(grad_or_param, calls=calls):
            calls[0] += 1
            return zero(grad_or_param)

        for p in params:
            getattr(p, kind)(hook)
        model.learn(128)
        assert calls[0] > 0, library.__name__
        assert all(torch.equal(b, p) for b, p in zip(before, params, strict=True)), library.__name__


def test_a_subclass_overriding_collect_rollouts_with_sb3s_signature():
    """SB3's collect_rollouts signatures, which a subclass's override passes on: PPO's (env, callback,
    rollout_buffer, n_rollout_steps) -> bool and SAC's (env, callback, train_freq, replay_buffer, action_noise,
    learning_starts, log_interval) -> RolloutReturn, as learn() calls them; another env or buffer is refused."""
    from stable_baselines3.common.type_aliases import RolloutReturn

    from covey import SAC

    class CountingPPO(PPO):
        def collect_rollouts(self, env, callback, rollout_buffer, n_rollout_steps):
            self.calls = [*getattr(self, "calls", []), (env is self.env, rollout_buffer is self.rollout_buffer)]
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    class CountingSAC(SAC):
        def collect_rollouts(
            self, env, callback, train_freq, replay_buffer, action_noise=None, learning_starts=0, log_interval=None
        ):
            rollout = super().collect_rollouts(
                env, callback, train_freq, replay_buffer, action_noise, learning_starts, log_interval
            )
            self.returned = [*getattr(self, "returned", []), rollout]
            return rollout

    ppo = CountingPPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(64)
    assert ppo.calls == [(True, True), (True, True)]
    sac = CountingSAC("MlpPolicy", "Pendulum-v1", train_freq=(5, "step"), learning_starts=10, seed=0).learn(20)
    assert sac.returned == [RolloutReturn(5, 0, True)] * 4 and sac.num_timesteps == 20
    _, callback = ppo._setup_learn(32, None, True, "test", False)
    with pytest.raises(ValueError, match=r"model's own env and rollout_buffer, n_steps=32 steps: pass model.env"):
        ppo.collect_rollouts(make_vec_env("CartPole-v1", 1), callback, ppo.rollout_buffer, 32)
    with pytest.raises(ValueError, match="n_steps=32 steps"):
        ppo.collect_rollouts(ppo.env, callback, ppo.rollout_buffer, 16)
    with pytest.raises(ValueError, match="model's own env and replay_buffer: pass model.env, model.replay_buffer"):
        sac.collect_rollouts(sac.env, callback, sac.train_freq, object())  # a buffer not the model's


@pytest.mark.parametrize("given", ["id", "env", "monitored env", "vec env"])
def test_verbose_output_says_how_the_env_was_wrapped_as_sb3s_does(capsys, given):
    """verbose=1 prints SB3's lines for the env it is given: made from its id, wrapped in a Monitor where it has
    none, and in a vector env; the same lines as SB3's PPO prints."""
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.monitor import Monitor

    make = {
        "id": lambda: "CartPole-v1",
        "env": lambda: gym.make("CartPole-v1"),
        "monitored env": lambda: Monitor(gym.make("CartPole-v1")),
        "vec env": lambda: make_vec_env("CartPole-v1", 2),
    }[given]
    printed = []
    for cls in (stable_baselines3.PPO, PPO):
        cls("MlpPolicy", make(), verbose=1, device="cpu")
        printed.append(capsys.readouterr().out.splitlines())
    assert printed[0] == printed[1]
    assert ("Wrapping the env in a DummyVecEnv." in printed[1]) == (given != "vec env")


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_hyperparameters_are_in_vars_of_the_model_as_in_sb3(name):
    """W&B's WandbCallback (and any tool reading ``vars(model)``) takes a model's settings from its ``__dict__``:
    covey's, once ``learn`` starts, holds each hyperparameter SB3's does, with the same value, and an assignment
    shows there too."""
    import dataclasses

    import stable_baselines3

    import covey

    kwargs = dict(n_steps=32, batch_size=32, gamma=0.95) if name == "PPO" else dict(learning_starts=8, tau=0.01)
    env = "CartPole-v1" if name == "PPO" else "Pendulum-v1"
    theirs = getattr(stable_baselines3, name)("MlpPolicy", env, seed=0, **kwargs).learn(32)
    ours = getattr(covey, name)("MlpPolicy", env, seed=0, **kwargs).learn(32)
    fields = {f.name for f in dataclasses.fields(ours.config)}
    plain = {k: v for k, v in vars(theirs).items() if k in fields and isinstance(v, (bool, int, float, str))}
    assert len(plain) >= 10, sorted(plain)
    assert {k: vars(ours).get(k) for k in plain} == plain
    ours.gamma = 0.5
    assert vars(ours)["gamma"] == 0.5 == ours.gamma


def test_sb3s_abstract_classes_take_coveys_agents_and_policies_as_virtual_subclasses():
    """Code that asks isinstance(model, OnPolicyAlgorithm) or isinstance(policy, ActorCriticPolicy) to choose how
    to drive a model (imitation's GAIL counts a round as n_steps * n_envs for an on-policy learner, its rollout
    helpers call predict on a BaseAlgorithm or BasePolicy) treats covey's as SB3's. SAC's policy is a BasePolicy,
    not an SACPolicy, whose actor distribution API covey's actor does not have. covey's own policy classes, passed
    as the policy, still build covey's networks (not a user's SB3 subclass run through its calls)."""
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
    from stable_baselines3.sac.policies import SACPolicy

    from covey import POCA, ppo, sac
    from covey.envs import EarlyExitEnv

    on = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    off = SAC("MlpPolicy", "Pendulum-v1")
    assert (
        isinstance(on, OnPolicyAlgorithm) and isinstance(on, BaseAlgorithm) and not isinstance(on, OffPolicyAlgorithm)
    )
    assert (
        isinstance(off, OffPolicyAlgorithm)
        and isinstance(off, BaseAlgorithm)
        and not isinstance(off, OnPolicyAlgorithm)
    )
    assert on.n_steps * on.get_env().num_envs == 16  # what GAIL reads once isinstance holds
    assert isinstance(on.policy, ActorCriticPolicy) and isinstance(on.policy, BasePolicy)
    assert isinstance(off.policy, BasePolicy) and not isinstance(off.policy, SACPolicy)
    assert not isinstance(POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8), BaseAlgorithm)  # no SB3 env
    assert PPO(ppo.MlpPolicy, "CartPole-v1", n_steps=16, batch_size=16)._sb3_policy_class is None
    assert SAC(sac.MlpPolicy, "Pendulum-v1")._sb3_policy_class is None


@pytest.mark.parametrize("algo", ["PPO", "SAC"])
def test_a_subclass_overriding_sb3s_hooks_with_sb3s_signatures_runs_them(algo):
    """Research code subclasses the algorithm and overrides SB3's hooks with SB3's signatures: covey's loops call
    dump_logs (SB3 2.x's public method), _setup_learn, _update_learning_rate(optimizers) and
    _update_current_progress_remaining(num_timesteps, total_timesteps) as SB3's do, so each override runs (a
    custom log key reaches the logs) and none fails on its arguments."""
    from stable_baselines3.common.logger import KVWriter, Logger

    base = PPO if algo == "PPO" else SAC
    calls: dict[str, list] = {"dump_logs": [], "setup": [], "lr": [], "progress": []}
    rows = []

    class Record(KVWriter):
        def write(self, key_values, key_excluded, step=0):
            rows.append(dict(key_values))

    class Research(base):
        def dump_logs(self, *args) -> None:
            self.logger.record("custom/extra", 1.0)
            calls["dump_logs"].append(args)
            super().dump_logs(*args)

        def _setup_learn(self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run",
                         progress_bar=False):  # fmt: skip
            calls["setup"].append(total_timesteps)
            return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

        def _update_learning_rate(self, optimizers) -> None:
            calls["lr"].append(optimizers)
            super()._update_learning_rate(optimizers)

        def _update_current_progress_remaining(self, num_timesteps, total_timesteps) -> None:
            calls["progress"].append((num_timesteps, total_timesteps))
            super()._update_current_progress_remaining(num_timesteps, total_timesteps)

    if algo == "PPO":
        model = Research("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
        model.set_logger(Logger(None, [Record()]))
        model.learn(64)
        assert calls["lr"] and all(opt is model.policy.optimizer for opt in calls["lr"])
        assert calls["progress"][-1] == (64, 64)
    else:
        model = Research("MlpPolicy", "Pendulum-v1", learning_starts=190, batch_size=16, seed=0)
        model.set_logger(Logger(None, [Record()]))
        model.learn(400, log_interval=1)  # two 200-step episodes
        optimizers = [model.actor.optimizer, model.critic.optimizer, model.ent_coef_optimizer]
        assert calls["lr"] and all(opts == optimizers for opts in calls["lr"])
        assert calls["progress"][-1] == (400, 400)
    assert calls["setup"] == [model._total_timesteps]
    assert len(calls["dump_logs"]) == len(rows) == 2
    assert all(row["custom/extra"] == 1.0 for row in rows)


def test_an_optimizer_with_a_param_group_a_subclass_added_saves_loads_and_checkpoints(tmp_path):
    """A subclass's _setup_model adds its auxiliary network to the policy's optimizer (add_param_group), as SB3
    research code does: get_parameters, save and CheckpointCallback failed on the second group. The file keeps both
    groups' states; the subclass loads them back, and a model without the group says why it cannot."""
    from torch import nn

    class WithAux(PPO):
        def _setup_model(self) -> None:
            super()._setup_model()
            self.aux = nn.Linear(4, 1)
            self.policy.optimizer.add_param_group({"params": list(self.aux.parameters()), "lr": 1e-3})

        def train(self) -> None:
            super().train()
            optimizer = self.policy.optimizer
            optimizer.zero_grad()
            self.aux(torch.as_tensor(self.rollout_buffer.observations.reshape(-1, 4))).pow(2).mean().backward()
            optimizer.step()

    model = WithAux("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
    model.learn(64, callback=CheckpointCallback(32, str(tmp_path / "checkpoints")))
    assert len(glob.glob(str(tmp_path / "checkpoints" / "*.zip"))) == 2
    state = model.policy.optimizer.state_dict()
    assert [len(group["params"]) for group in state["param_groups"]] == [12, 2]
    assert set(state["state"]) == set(range(14))  # the auxiliary network's moments too
    assert set(model.get_parameters()["policy.optimizer"]["state"]) == set(range(14))
    model.save(tmp_path / "model")
    loaded = WithAux.load(tmp_path / "model", env="CartPole-v1")
    back = loaded.policy.optimizer.state_dict()
    for i, entry in state["state"].items():
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(back["state"][i][key]), torch.as_tensor(value)), (i, key)
    assert [group["lr"] for group in back["param_groups"]] == [group["lr"] for group in state["param_groups"]]
    loaded.learn(32)
    with pytest.raises(ValueError, match=r"'policy.optimizer' has 2 parameter groups, this model's optimizer 1: it"):
        PPO.load(tmp_path / "model")
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"has 1 parameter groups, this model's optimizer 2: this is a model whose"):
        WithAux.load(tmp_path / "plain")


class AuxiliaryPPO(PPO):
    """SB3 research code's subclass: an argument of its own, an auxiliary network, its optimizer and a tensor, named
    to the file by SB3's _get_torch_save_params."""

    def __init__(self, *args, aux_coef: float = 0.1, schedule=None, **kwargs) -> None:
        self.aux_coef, self.schedule = aux_coef, schedule
        super().__init__(*args, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        self.aux = torch.nn.Linear(4, 2)
        self.aux_optimizer = torch.optim.Adam(self.aux.parameters(), lr=1e-3)
        self.scale = torch.ones(2)

    def _get_torch_save_params(self):
        names, tensors = super()._get_torch_save_params()
        return [*names, "aux", "aux_optimizer"], [*tensors, "scale"]


def test_a_subclass_keeps_its_own_networks_tensors_and_arguments_through_save_load_and_copies(tmp_path):
    """As SB3's file keeps a subclass's attributes: what _get_torch_save_params names (an auxiliary network, its
    optimizer's state, a tensor) and the subclass's own constructor arguments come back from load, where load gave
    a fresh network and the defaults; custom_objects and load's keywords set such an argument anew, as in SB3. An
    argument JSON cannot hold is named at save, and kept by copies."""
    import copy

    model = AuxiliaryPPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, aux_coef=0.7, schedule=abs)
    with torch.no_grad():
        model.aux.weight.fill_(3.0)
        model.scale.fill_(5.0)
    model.aux(torch.ones(3, 4)).sum().backward()
    model.aux_optimizer.step()
    with pytest.warns(UserWarning, match=r"constructor arguments \['schedule'\] are not in the file.*schedule=\.\.\."):
        model.save(tmp_path / "model")
    loaded = AuxiliaryPPO.load(tmp_path / "model")
    assert (loaded.aux_coef, loaded.schedule) == (0.7, None)
    assert torch.equal(loaded.aux.weight, model.aux.weight) and torch.equal(loaded.scale, model.scale)
    moments = loaded.aux_optimizer.state_dict()["state"]
    assert torch.equal(moments[0]["exp_avg"], model.aux_optimizer.state_dict()["state"][0]["exp_avg"])
    assert "aux" in loaded.get_parameters() and "aux_optimizer" in loaded.get_parameters()
    assert AuxiliaryPPO.load(tmp_path / "model", custom_objects={"aux_coef": 0.9}).aux_coef == 0.9
    assert AuxiliaryPPO.load(tmp_path / "model", aux_coef=0.5).aux_coef == 0.5
    clone = copy.deepcopy(model)
    assert (clone.aux_coef, clone.schedule) == (0.7, abs) and torch.equal(clone.aux.weight, model.aux.weight)
    with pytest.raises(ValueError, match=r"Unknown parameter groups \['aux', 'aux_optimizer', 'scale'\]"):
        PPO.load(tmp_path / "model")

    class Misnamed(AuxiliaryPPO):
        def _get_torch_save_params(self):
            return ["policy", "policy.optimizer", "auxiliary"], []

    with pytest.raises(AttributeError, match=r"_get_torch_save_params names 'auxiliary', which this model does not"):
        Misnamed("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "misnamed")


def test_the_rollout_buffers_arrays_after_learn_get_the_reshape_they_need():
    """SB3's update flattens its buffer to (n_steps * n_envs, ...), where a notebook then hands the observations to
    the policy; covey's stay (n_steps, n_envs, ...), and the policy's tensor methods took them as a batch of
    (n_steps,) with a reshape error from deep inside. They name the reshape; the reshaped arrays give SB3's calls."""
    model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=16, batch_size=32, seed=0)
    model.learn(32)
    buffer = model.rollout_buffer
    obs = torch.as_tensor(buffer.observations)
    assert obs.shape == (16, 2, 4)
    reshape = re.escape("got a tensor of shape (16, 2, 4), with 2 batch axes") + ".*" + re.escape("(-1, 4)")
    for call in (
        lambda: model.policy.predict_values(obs),
        lambda: model.policy.evaluate_actions(obs, torch.as_tensor(buffer.actions)),
        lambda: model.policy(obs),
        lambda: model.policy.get_distribution(obs),
    ):
        with pytest.raises(ValueError, match=re.escape("takes one batch of observations, of shape (B, 4)")):
            call()
    with torch.no_grad():
        values = model.policy.predict_values(obs.reshape(-1, 4))
        _, log_prob, _ = model.policy.evaluate_actions(obs.reshape(-1, 4), torch.as_tensor(buffer.actions).reshape(-1))
    assert values.shape == (32, 1) and log_prob.shape == (32,)
    with pytest.raises(ValueError, match=reshape):
        model.policy.predict_values(obs)
    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100)
    with pytest.raises(ValueError, match=re.escape("got a tensor of shape (5, 2, 3)")):
        sac.policy(torch.zeros(5, 2, 3))
    # a batch flattened as SB3's FlattenExtractor flattens it is taken, as SB3 takes it; a Dict's keys are checked
    flat = PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (2, 3), np.float32), spaces.Discrete(2)), n_steps=16)
    assert flat.policy.predict_values(torch.zeros(5, 6)).shape == (5, 1)
    space = spaces.Dict({"a": spaces.Box(-1, 1, (3,), np.float32), "b": spaces.Discrete(2)})
    keyed = PPO("MultiInputPolicy", SpaceEnv(space, spaces.Discrete(2)), n_steps=16)
    with pytest.raises(ValueError, match=re.escape("of shape (B, 3) for key 'a'; got a tensor of shape (4, 2, 3)")):
        keyed.policy.predict_values({"a": torch.zeros(4, 2, 3), "b": torch.zeros(4, 2)})
