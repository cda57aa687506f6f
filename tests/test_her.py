"""Hindsight experience replay: covey's HerReplayBuffer against SB3's, and SAC with SB3's HER arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import HerReplayBuffer as SB3HerReplayBuffer
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

from covey import SAC
from covey.buffers.her import HerReplayBuffer


def bit_flipping(n_envs: int = 2, n_bits: int = 4):
    return DummyVecEnv([lambda: BitFlippingEnv(n_bits=n_bits, continuous=True, max_steps=5)] * n_envs)


def fill(buffers: list, venv, steps: int, seed: int = 0) -> None:
    """The same random-action stream into SB3's buffer and covey's, through SB3's add."""
    venv.seed(seed)
    obs, rng = venv.reset(), np.random.default_rng(seed)
    for _ in range(steps):
        actions = rng.uniform(-1, 1, (venv.num_envs, *venv.action_space.shape)).astype(np.float32)
        new_obs, rewards, dones, infos = venv.step(actions)
        next_obs = {k: v.copy() for k, v in new_obs.items()}
        for i in np.flatnonzero(dones):  # the true final observation
            for k in next_obs:
                next_obs[k][i] = infos[i]["terminal_observation"][k]
        for buf in buffers:  # SB3's add, the same arguments
            buf.add(obs, next_obs, actions, rewards, dones, infos)
        obs = new_obs


def assert_same_samples(got, expected) -> None:
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        a, b = getattr(got, name), getattr(expected, name)
        for key in a if isinstance(a, dict) else [None]:
            x, y = (a[key], b[key]) if key is not None else (a, b)
            assert x.shape == y.shape and x.dtype == y.dtype, (name, key)  # int8 bits, as SB3 keeps them
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"{name} {key}")


@pytest.mark.cpu
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("steps", [9, 30], ids=["filling", "wrapped"])
def test_samples_are_sb3s(strategy, steps):
    """The same transitions in SB3's HerReplayBuffer and covey's, sampled under the same NumPy seed: the same
    real and relabeled transitions, goals and rewards (and, once the ring of 12 rows wraps, the same episodes
    left out for being partly overwritten)."""
    venv = bit_flipping()
    theirs = SB3HerReplayBuffer(
        24, venv.observation_space, venv.action_space, env=venv, n_envs=2, goal_selection_strategy=strategy
    )
    ours = HerReplayBuffer(
        24, venv.observation_space, venv.action_space, env=venv, n_envs=2, goal_selection_strategy=strategy
    )
    fill([theirs, ours], venv, steps)
    np.testing.assert_array_equal(ours.ep_length, theirs.ep_length)
    for seed in range(3):
        np.random.seed(seed)
        expected = theirs.sample(64)
        np.random.seed(seed)
        got = ours.sample(64)
        assert_same_samples(got, expected)
    assert ours.sample_batch(8).observations["observation"].dtype == torch.float32  # as SAC's networks take them
    relabeled = got.observations["desired_goal"][13:]  # 51 of 64 relabeled, after the 13 real ones
    assert not torch.equal(relabeled, ours.sample(64).observations["desired_goal"][13:])  # goals are drawn


def test_a_reset_buffer_samples_as_a_fresh_one():
    """SB3's replay_buffer.reset(): after it, covey's HER buffer holds and samples what a fresh buffer given the
    same steps does (its episode bookkeeping forgotten with the steps)."""
    venv = bit_flipping()
    used, fresh = (HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2) for _ in "ab")
    fill([used], venv, 30, seed=0)
    used.reset()
    fill([used, fresh], venv, 9, seed=1)
    np.testing.assert_array_equal(used.ep_length, fresh.ep_length)
    np.testing.assert_array_equal(used.ep_start, fresh.ep_start)
    for seed in range(2):
        np.random.seed(seed)
        expected = fresh.sample(32)
        np.random.seed(seed)
        assert_same_samples(used.sample(32), expected)


def test_what_it_cannot_sample_is_said_clearly():
    venv = bit_flipping()
    buf = HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2)
    with pytest.raises(RuntimeError, match="none has ended yet: set learning_starts above"):
        buf.sample(4)
    from gymnasium import spaces

    with pytest.raises(ValueError, match=r"goal-conditioned env.*\['observation', 'achieved_goal', 'desired_goal'\]"):
        HerReplayBuffer(24, spaces.Dict({"observation": spaces.Box(-1, 1, (2,))}), venv.action_space)
    with pytest.raises(ValueError, match="goal_selection_strategy='later' is invalid"):
        HerReplayBuffer(24, venv.observation_space, venv.action_space, goal_selection_strategy="later")
    without_env = HerReplayBuffer(24, venv.observation_space, venv.action_space, n_envs=2)
    fill([without_env], venv, 12)
    with pytest.raises(RuntimeError, match="compute_reward.*set_env"):
        without_env.sample(8)


@pytest.mark.parametrize("steps", [13, 9], ids=["full", "partly-filled"])
def test_a_saved_buffer_samples_the_same_after_loading_and_running_episodes_can_be_ended(tmp_path, steps):
    venv = bit_flipping()
    buf = HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2)
    fill([buf], venv, steps)
    assert buf.full == (steps > 12)
    buf.save(tmp_path / "her.npz")
    with np.load(tmp_path / "her.npz", allow_pickle=False) as data:  # the rows written so far
        assert len(data["her/ep_length"]) == len(data["actions"]) == min(steps, 12)
    loaded = HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2)
    fill([loaded], bit_flipping(), 13)  # what loading replaces, bookkeeping included
    loaded.load(tmp_path / "her.npz")
    np.testing.assert_array_equal(loaded.ep_start, buf.ep_start)
    np.testing.assert_array_equal(loaded.ep_length, buf.ep_length)
    np.random.seed(0)
    expected = buf.sample(32)
    np.random.seed(0)
    assert_same_samples(loaded.sample(32), expected)
    running = loaded._current_ep_start != loaded.pos
    assert running.any()  # an episode was running at the newest step: its steps are not sampled yet
    newest = (loaded.pos - 1) % loaded.capacity
    assert (loaded.ep_length[newest, running] == 0).all()
    loaded.truncate_last_trajectory()
    assert (loaded.ep_length[newest] > 0).all() and (loaded._current_ep_start == loaded.pos).all()
    plain = tmp_path / "plain.npz"
    from covey.buffers.replay import ReplayBuffer

    ReplayBuffer(24, venv.observation_space, venv.action_space, n_envs=2).save(plain)
    with pytest.raises(ValueError, match="no episode bookkeeping for hindsight replay"):
        loaded.load(plain)


class InfoBitFlipping(BitFlippingEnv):
    """Bit flipping whose step infos hold arrays, NumPy scalars, tuples and nested dicts (``extra`` added)."""

    def __init__(self, extra=None):
        super().__init__(n_bits=4, continuous=True, max_steps=5)
        self.extra, self.t = extra, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.t += 1
        info.update(scale=np.float32(self.t), position=np.arange(3) * self.t, tag=("a", self.t), nested={"x": [1.5]})
        if self.extra is not None:
            info["extra"] = self.extra
        return obs, reward, terminated, truncated, info


def test_copied_infos_are_saved_with_the_buffer_as_plain_data(tmp_path):
    """With ``copy_info_dict`` the infos that ``compute_reward`` reads come back after loading, types and values
    (SB3 pickles them); infos that plain data cannot hold are left out of the file, with a warning at both ends."""
    venv = DummyVecEnv([InfoBitFlipping] * 2)
    buf = HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2, copy_info_dict=True)
    fill([buf], venv, 9)
    buf.save(tmp_path / "her.npz")
    loaded = HerReplayBuffer(24, venv.observation_space, venv.action_space, env=venv, n_envs=2, copy_info_dict=True)
    fill([loaded], DummyVecEnv([InfoBitFlipping] * 2), 12)  # what loading replaces
    loaded.load(tmp_path / "her.npz")
    for row in range(loaded.capacity):
        for e in range(2):
            mine, theirs = loaded.infos[row, e], buf.infos[row, e]
            assert mine.keys() == theirs.keys()
            for key, value in theirs.items():
                assert type(mine[key]) is (dict if isinstance(value, dict) else type(value)), key  # OrderedDict too
                if isinstance(value, np.ndarray):
                    assert mine[key].dtype == value.dtype
                np.testing.assert_equal(mine[key], value)
    assert loaded.infos[8, 0]["scale"] > 0 and loaded.infos[9, 0] == {}  # rows after the file's are empty
    np.random.seed(0)
    expected = buf.sample(16)
    np.random.seed(0)
    assert_same_samples(loaded.sample(16), expected)

    # A value plain data cannot hold is left out of its own step's info only (every info was dropped before).
    odd = DummyVecEnv([lambda: InfoBitFlipping(extra=object())] * 2)
    buf = HerReplayBuffer(24, odd.observation_space, odd.action_space, env=odd, n_envs=2, copy_info_dict=True)
    fill([buf], odd, 6)
    buf.infos[2, 1] = {**buf.infos[2, 1], 7: "a key that is no string"}
    with pytest.warns(UserWarning, match=r"'extra' \(a value of type object\), 7 \(a key of type int\)\. Those"):
        buf.save(tmp_path / "odd.npz")
    loaded.load(tmp_path / "odd.npz")
    for row in range(6):
        for e in range(2):
            plain = {key: value for key, value in buf.infos[row, e].items() if key not in ("extra", 7)}
            assert loaded.infos[row, e].keys() == plain.keys() and "scale" in plain
            for key, value in plain.items():
                np.testing.assert_equal(loaded.infos[row, e][key], value)


# ---------------------------------------------------------------------------------------------------- SAC + HER
def her_sac(env=None, **kwargs) -> SAC:
    env = env if env is not None else BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)
    kwargs = {"learning_starts": 20, "batch_size": 32, "seed": 0, **kwargs}
    return SAC("MultiInputPolicy", env, replay_buffer_class=SB3HerReplayBuffer, **kwargs)


def test_sac_takes_sb3s_her_arguments_and_keeps_them_in_its_file(tmp_path):
    kwargs = dict(n_sampled_goal=2, goal_selection_strategy="final", copy_info_dict=True)
    model = her_sac(replay_buffer_kwargs=kwargs).learn(60)
    buf = model.replay_buffer
    assert isinstance(buf, HerReplayBuffer) and buf.env is model.get_env()
    assert (buf.n_sampled_goal, buf.goal_selection_strategy, buf.copy_info_dict) == (
        2,
        GoalSelectionStrategy.FINAL,
        True,
    )
    assert model._n_updates > 0 and buf.ep_length.any()
    model.save(tmp_path / "her")
    loaded = SAC.load(tmp_path / "her")
    assert isinstance(loaded.replay_buffer, HerReplayBuffer) and loaded.replay_buffer.env is None
    assert loaded.replay_buffer.goal_selection_strategy is GoalSelectionStrategy.FINAL
    assert loaded.replay_buffer.n_sampled_goal == 2
    loaded.set_env(BitFlippingEnv(n_bits=4, continuous=True, max_steps=4))
    assert loaded.replay_buffer.env is loaded.get_env()
    model.save_replay_buffer(tmp_path / "buffer")
    running = (buf._current_ep_start != buf.pos).any()
    assert running  # 60 steps of 4-step episodes (or shorter) leave one running at the save
    with pytest.warns(UserWarning, match="ends in running episodes.*truncate_last_traj=False"):  # as SB3 warns
        loaded.load_replay_buffer(tmp_path / "buffer")
    assert (loaded.replay_buffer._current_ep_start == loaded.replay_buffer.pos).all()  # running episodes ended
    loaded.learn(20)


def test_her_computes_rewards_on_gymnasium_vector_envs_of_either_mode():
    """An AsyncVectorEnv calls a method on every copy at once, so relabeled rewards come from copy 0's answer
    there (asking for copy 0 alone failed at the first gradient step)."""
    import gymnasium as gym

    make = [lambda: BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)] * 2
    for venv in (gym.vector.SyncVectorEnv(make), gym.vector.AsyncVectorEnv(make)):
        model = her_sac(venv).learn(60)
        assert model._n_updates > 0
        batch = model.replay_buffer.sample(64)
        achieved = batch.next_observations["achieved_goal"].numpy()
        expected = BitFlippingEnv(n_bits=4, continuous=True).compute_reward(
            achieved, batch.observations["desired_goal"].numpy(), None
        )
        np.testing.assert_array_equal(batch.rewards.numpy().ravel(), expected)
        model.env.close()


def test_a_new_learn_ends_the_running_episode_where_its_reset_cuts_it():
    """learn() resets the env: the episode running at the newest stored step ends there, so relabeled goals never
    come from the next episode (SB3 2.9.2 joins the two into one episode)."""
    model = her_sac(BitFlippingEnv(n_bits=4, continuous=True, max_steps=5), learning_starts=100)
    model.learn(3)
    model.learn(6)
    buf = model.replay_buffer
    start, length = buf.ep_start[:9, 0], buf.ep_length[:9, 0]
    assert (length[:3] > 0).all() and (start[:3] + length[:3] <= 3).all()  # ended within the first learn's steps
    assert (start[3:] >= 3).all()  # the second learn's episodes start after them


def test_covey_s_own_buffer_classes_stand_for_sb3s():
    """``replay_buffer_class=covey.buffers.her.HerReplayBuffer`` is hindsight replay, as SB3's class is, and
    covey's plain ReplayBuffer is SB3's (both were refused as custom buffers, whose advice turned HER off)."""
    from covey.buffers.replay import ReplayBuffer

    model = SAC(
        "MultiInputPolicy",
        BitFlippingEnv(n_bits=4, continuous=True, max_steps=4),
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(goal_selection_strategy=GoalSelectionStrategy.EPISODE),
        learning_starts=10,
        batch_size=16,
    ).learn(30)
    assert isinstance(model.replay_buffer, HerReplayBuffer) and model._n_updates > 0
    assert model.replay_buffer.goal_selection_strategy is GoalSelectionStrategy.EPISODE
    plain = SAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplayBuffer, learning_starts=10, batch_size=16)
    assert type(plain.replay_buffer) is ReplayBuffer


def test_sac_her_settings_that_cannot_work_are_refused():
    from gymnasium.envs.classic_control import PendulumEnv

    with pytest.raises(ValueError, match="goal-conditioned env"):
        SAC("MlpPolicy", PendulumEnv(), replay_buffer_class=SB3HerReplayBuffer)
    with pytest.raises(NotImplementedError, match="optimize_memory_usage=False"):
        her_sac(optimize_memory_usage=True)
    with pytest.raises(ValueError, match="goal_selection_strategy='nearby' is invalid"):
        her_sac(replay_buffer_kwargs=dict(goal_selection_strategy="nearby"))
    with pytest.raises(NotImplementedError, match=r"\['n_goals'\] are not supported"):
        her_sac(replay_buffer_kwargs=dict(n_goals=4))


@pytest.mark.cpu
@pytest.mark.slow
def test_sac_with_her_solves_continuous_bit_flipping_with_8_bits():
    """SB3's HER example on its BitFlippingEnv (8 bits, continuous actions, 8 steps an episode): after 5k steps
    the deterministic policy reaches the goal at once (mean return 0; a policy that never reaches it scores -8;
    seeds 0 and 1 both scored 0.0 on an AMD EPYC)."""
    torch.set_num_threads(1)
    model = her_sac(
        BitFlippingEnv(n_bits=8, continuous=True, max_steps=8),
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        learning_starts=16,
        learning_rate=1e-3,
        gamma=0.95,
        batch_size=256,
        policy_kwargs=dict(net_arch=[64, 64]),
    )
    model.learn(5_000)
    mean, _ = evaluate_policy(model, BitFlippingEnv(n_bits=8, continuous=True, max_steps=8), n_eval_episodes=50)
    assert mean >= -1.0
