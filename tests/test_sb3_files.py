"""Stable-Baselines3 model files load into covey's PPO and SAC without unpickling anything: the same actions,
values and settings as SB3's own load gives, pickles in the file never run, and what only a pickle holds is
named in a warning."""

from __future__ import annotations

import base64
import copy
import json
import pathlib
import pickle
import re
import warnings
import zipfile

import cloudpickle
import numpy as np
import pytest
import stable_baselines3 as sb3
import torch
from envs import SpaceEnv, image_space, needs_onnx_exporter, zoo_schedule
from gymnasium import spaces

from covey import POCA, PPO, SAC, sb3_files
from covey.sb3_files import parse_space
from covey.serialization import ModelFileError

SPACES = [
    spaces.Box(-1.0, 1.0, (3,), np.float32),
    spaces.Box(np.array([-1.0, -2.5, -np.inf], np.float32), np.array([1.0, 2.5, np.inf], np.float32)),
    spaces.Box(0, 255, (84, 84, 3), np.uint8),
    spaces.Box(-np.inf, np.inf, (2, 3), np.float64),
    spaces.Box(np.array([[0.1, 0.2], [0.3, 1e-8]], np.float32), np.array([[1e10, 2], [3, 4]], np.float32)),
    spaces.Box(-1.2345678, 3.3333333, (2,), np.float32),
    spaces.Discrete(3),
    spaces.Discrete(5, start=-2),
    spaces.MultiDiscrete([3, 2]),
    spaces.MultiDiscrete([[2, 3], [4, 5]]),
    spaces.MultiDiscrete([3, 4], start=[1, -1]),
    spaces.MultiBinary(4),
    spaces.MultiBinary([2, 3]),
    spaces.Dict(
        {"a": spaces.Box(-1, 1, (3,)), "b": spaces.Discrete(3), "c": spaces.Dict({"x": spaces.MultiBinary(2)})}
    ),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: repr(s)[:40])
def test_a_spaces_repr_parses_back_to_the_space(space):
    assert parse_space(repr(space)) == space


def test_a_summarized_bound_is_read_only_when_it_shows_one_value():
    """NumPy prints arrays of over 1,000 elements summarized: an image's uniform bounds read back, bounds that
    show several values are refused."""
    image = spaces.Box(np.zeros((40, 40, 3), np.uint8), np.full((40, 40, 3), 255, np.uint8), dtype=np.uint8)
    assert "..." in str(image.low)
    assert parse_space(f"Box({image.low}, {image.high}, (40, 40, 3), uint8)") == image
    low = np.arange(2000, dtype=np.float32)
    with pytest.raises(ValueError, match="summarized"):
        parse_space(repr(spaces.Box(low, low + 1)))


# ============================================================================================ helpers


@pytest.fixture
def no_unpickling(monkeypatch):
    """Make every way to unpickle an object fail, as a file's pickle would run code through it (tensors load
    through torch's weights-only reader, which is not one of these)."""

    def refuse(*args, **kwargs):
        raise AssertionError("unpickled")

    for module in (pickle, cloudpickle):
        monkeypatch.setattr(module, "loads", refuse)
        monkeypatch.setattr(module, "load", refuse)


def obs_batch(space: spaces.Space, n: int = 16) -> np.ndarray | dict:
    space.seed(0)
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: np.stack([s[key] for s in samples]) for key in space.spaces}
    return np.stack(samples)


def assert_same_policy(ours, theirs, n: int = 16) -> None:
    obs = obs_batch(theirs.observation_space, n)
    np.testing.assert_allclose(
        ours.predict(obs, deterministic=True)[0], theirs.predict(obs, deterministic=True)[0], rtol=1e-5, atol=1e-5
    )


def assert_same_optimizer_states(ours, theirs) -> None:
    """covey's model holds the optimizer states of SB3's: moved back to SB3's order (``get_sb3_parameters``) they
    are SB3's ``get_parameters()`` ones, every tensor equal."""
    back, original = ours.get_sb3_parameters(), theirs.get_parameters()
    assert back.keys() == original.keys()
    for name in set(original) - {"policy"}:
        mine, expected = back[name]["state"], original[name]["state"]
        assert mine.keys() == expected.keys() and expected, name
        for i, entry in expected.items():
            for key, value in entry.items():
                assert torch.equal(mine[i][key], value), (name, i, key)


# ============================================================================================ PPO


@pytest.mark.cpu
def test_ppo_loads_an_sb3_file_as_sb3_does(tmp_path, no_unpickling):
    kwargs = dict(
        n_steps=64,
        batch_size=32,
        n_epochs=2,
        gamma=0.95,
        gae_lambda=0.9,
        ent_coef=0.01,
        clip_range=0.3,
        learning_rate=1e-3,
        max_grad_norm=0.7,
        seed=3,
        policy_kwargs=dict(net_arch=dict(pi=[32], vf=[16]), activation_fn=torch.nn.ReLU),
    )
    theirs = sb3.PPO("MlpPolicy", "CartPole-v1", **kwargs).learn(128)
    theirs.save(tmp_path / "sb3_ppo")
    ours = PPO.load(tmp_path / "sb3_ppo")  # the suffix added, as SB3 does
    assert_same_policy(ours, theirs)
    obs = torch.as_tensor(obs_batch(theirs.observation_space))
    with torch.no_grad():
        torch.testing.assert_close(ours.policy.predict_values(obs), theirs.policy.predict_values(obs))
    for name in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "max_grad_norm", "seed"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.learning_rate == 1e-3 and ours.clip_range(1.0) == 0.3 and ours.clip_range_vf is None
    assert ours.num_timesteps == theirs.num_timesteps == 128
    assert ours.policy.activation_fn is torch.nn.ReLU and ours.policy.net_arch == dict(pi=[32], vf=[16])
    assert ours.observation_space == theirs.observation_space and ours.action_space == theirs.action_space
    assert_same_optimizer_states(ours, theirs)  # training goes on with SB3's Adam moments
    ours.set_env(theirs.get_env())
    ours.learn(64, reset_num_timesteps=False)
    assert ours.num_timesteps == 192


@pytest.mark.parametrize(
    "space", [spaces.Discrete(3, start=5), spaces.MultiDiscrete([3, 2], start=[1, -1])], ids=["discrete", "multi"]
)
def test_an_sb3_file_with_an_action_start_acts_inside_the_space(tmp_path, no_unpickling, space):
    """SB3 ignores an action space's start (its actions are the network's indices, outside the space); covey's
    load of the same file picks the same indices and offsets them by start, as the README says."""
    theirs = sb3.PPO("MlpPolicy", SpaceEnv(spaces.Box(-1, 1, (4,), np.float32), space), seed=0)
    theirs.save(tmp_path / "sb3_ppo")
    with pytest.warns(UserWarning, match=r"has a start, which SB3 ignores: this model acted from 0 in SB3"):
        ours = PPO.load(tmp_path / "sb3_ppo")
    obs = obs_batch(theirs.observation_space, 64)
    indices = theirs.predict(obs, deterministic=True)[0]
    actions = ours.predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(actions, indices + space.start)
    assert len(np.unique(actions)) > 1 and all(space.contains(a) for a in actions)


def test_an_sb3_file_of_integer_bounds_at_int64s_ends_loads_with_its_env(tmp_path, no_unpickling):
    """Box bounds of int64's least and greatest values are read as integers (through a float, the greatest one
    wrapped round to the least), so the file's space is the env's and load(env=...) takes the env."""
    ends = np.iinfo(np.int64)
    env = SpaceEnv(spaces.Box(ends.min, ends.max, (3,), np.int64), spaces.Discrete(2))
    sb3.PPO("MlpPolicy", env, seed=0).save(tmp_path / "sb3_ppo")
    ours = PPO.load(tmp_path / "sb3_ppo", env=env)
    assert ours.observation_space == env.observation_space
    assert (ours.observation_space.high == ends.max).all()


def test_an_sb3_files_verbosity_log_folder_and_episode_count_are_kept(tmp_path, no_unpickling):
    """As SB3's load keeps them: learn(reset_num_timesteps=False) goes on counting episodes, into the same logs."""
    kwargs = dict(learning_starts=1000, verbose=2, tensorboard_log=str(tmp_path / "tb"))
    theirs = sb3.SAC("MlpPolicy", "Pendulum-v1", **kwargs).learn(450)  # SB3 counts off-policy episodes
    assert theirs._episode_num == 2
    theirs.save(tmp_path / "sb3_sac")
    ours = SAC.load(tmp_path / "sb3_sac")
    assert (ours.verbose, ours.tensorboard_log, ours._episode_num) == (2, str(tmp_path / "tb"), 2)


@pytest.mark.parametrize("kind", ["cnn", "dict", "dict-image", "box-actions"])
def test_ppo_loads_sb3s_cnn_dict_and_box_action_files(tmp_path, kind, no_unpickling):
    if kind == "cnn":
        env, policy = SpaceEnv(image_space((36, 36, 3)), spaces.Discrete(3)), "CnnPolicy"
    elif kind.startswith("dict"):
        obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,)), "mode": spaces.Discrete(4)})
        if kind == "dict-image":  # SB3's CombinedExtractor: a NatureCNN on the image key
            obs_space = spaces.Dict({**obs_space.spaces, "frame": image_space((36, 36, 3))})
        env, policy = SpaceEnv(obs_space, spaces.Discrete(2)), "MultiInputPolicy"
    else:
        box = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
        env, policy = SpaceEnv(spaces.Box(-1, 1, (3,)), box), "MlpPolicy"
    theirs = sb3.PPO(policy, env, n_steps=32, batch_size=16, n_epochs=1, seed=0).learn(32)
    theirs.save(tmp_path / "m.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out
        ours = PPO.load(tmp_path / "m.zip")
    assert ours.policy_name == policy
    assert_same_policy(ours, theirs)
    assert_same_optimizer_states(ours, theirs)


# ============================================================================================ SAC


@pytest.mark.cpu
def test_sac_loads_an_sb3_file_as_sb3_does(tmp_path, no_unpickling):
    kwargs = dict(
        learning_starts=50,
        batch_size=32,
        buffer_size=5_000,
        tau=0.01,
        gamma=0.98,
        train_freq=2,
        gradient_steps=3,
        seed=1,
        policy_kwargs=dict(net_arch=[32, 32]),
    )
    theirs = sb3.SAC("MlpPolicy", "Pendulum-v1", **kwargs).learn(120)
    theirs.save(tmp_path / "sb3_sac.zip")
    ours = SAC.load(tmp_path / "sb3_sac.zip")
    assert_same_policy(ours, theirs)
    obs = torch.as_tensor(obs_batch(theirs.observation_space))
    actions = torch.rand(16, 1) * 2 - 1
    with torch.no_grad():
        for q_ours, q_theirs in zip(ours.critic(obs, actions), theirs.critic(obs, actions)):
            torch.testing.assert_close(q_ours, q_theirs)
        for q_ours, q_theirs in zip(ours.critic_target(obs, actions), theirs.critic_target(obs, actions)):
            torch.testing.assert_close(q_ours, q_theirs)
    torch.testing.assert_close(ours.log_ent_coef.detach(), theirs.log_ent_coef.detach())
    for name in ("learning_starts", "batch_size", "buffer_size", "tau", "gamma", "gradient_steps", "target_entropy"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert tuple(ours.train_freq) == tuple(theirs.train_freq)
    assert ours.num_timesteps == theirs.num_timesteps
    assert_same_optimizer_states(ours, theirs)  # actor's, critics' and temperature's
    ours.set_env(theirs.get_env())
    ours.learn(60, reset_num_timesteps=False)  # goes on training from the loaded networks
    assert ours.num_timesteps == theirs.num_timesteps + 60


def test_an_sb3_sac_files_replay_buffer_settings_are_kept(tmp_path, no_unpickling):
    """SB3's HerReplayBuffer and its JSON settings load as covey's hindsight replay, as SB3's load keeps them (the
    model loaded a plain buffer, and with the class passed again it dropped the file's strategy), also where SB3
    pickled them; a plain buffer's handle_timeout_termination is kept."""
    from stable_baselines3.common.envs import BitFlippingEnv
    from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

    from covey.buffers.her import HerReplayBuffer

    def env():
        return BitFlippingEnv(n_bits=4, continuous=True, max_steps=4)

    her = dict(replay_buffer_class=sb3.HerReplayBuffer, learning_starts=10, batch_size=16, seed=0)
    sb3.SAC(
        "MultiInputPolicy", env(), replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="final"), **her
    ).learn(20).save(tmp_path / "her")
    for custom_objects in (None, {"replay_buffer_class": sb3.HerReplayBuffer}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = SAC.load(tmp_path / "her", env=env(), custom_objects=custom_objects)
        buf = loaded.replay_buffer
        assert isinstance(buf, HerReplayBuffer) and buf.env is loaded.get_env()
        assert (buf.goal_selection_strategy, buf.n_sampled_goal) == (GoalSelectionStrategy.FINAL, 2)
    # an enum in the settings makes SB3 pickle them all, and write them beside the pickle as text: read from there
    strategy = dict(goal_selection_strategy=GoalSelectionStrategy.EPISODE, n_sampled_goal=8)
    sb3.SAC("MultiInputPolicy", env(), replay_buffer_kwargs=strategy, **her).learn(20).save(tmp_path / "pickled")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf = SAC.load(tmp_path / "pickled", env=env()).replay_buffer
    assert (buf.goal_selection_strategy, buf.n_sampled_goal) == (GoalSelectionStrategy.EPISODE, 8)
    plain = dict(replay_buffer_kwargs=dict(handle_timeout_termination=False), learning_starts=10, batch_size=16)
    sb3.SAC("MlpPolicy", "Pendulum-v1", **plain).learn(20).save(tmp_path / "plain")
    assert SAC.load(tmp_path / "plain")._handle_timeouts is False


def test_an_sb3_sac_files_fixed_temperature_is_the_one_in_force(tmp_path):
    """SB3 saves a fixed temperature as its ent_coef_tensor, which a callback may have changed from the ent_coef
    the model was built with: that tensor is the temperature covey's model trains with, and saves again."""
    theirs = sb3.SAC("MlpPolicy", "Pendulum-v1", ent_coef=0.5, policy_kwargs=dict(net_arch=[8]))
    theirs.ent_coef_tensor = torch.tensor(0.125)
    theirs.save(tmp_path / "annealed.zip")
    ours = SAC.load(tmp_path / "annealed.zip")
    assert ours.log_ent_coef is None and ours._ent_coef().item() == 0.125
    ours.save(tmp_path / "again.zip")
    assert SAC.load(tmp_path / "again.zip").ent_coef_tensor.item() == 0.125
    assert ours.to_sb3_model().ent_coef_tensor.item() == 0.125


def test_an_sb3_sac_files_action_noise_is_read(tmp_path, no_unpickling):
    """SB3's load gives back the action_noise it pickled; covey reads SB3's noises from the attributes written
    beside the pickle. The one thing SB3 writes of a VectorizedActionNoise's base noise is its repr, which leaves
    out Ornstein-Uhlenbeck's theta and dt: that noise is named as not read."""
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise, VectorizedActionNoise

    def settings(noise) -> dict:
        if isinstance(noise, VectorizedActionNoise):
            return {"n_envs": noise.n_envs, "base": settings(noise.base_noise)}
        names = ("_mu", "_sigma", "_dtype", "_theta", "_dt", "initial_noise")
        return {"class": type(noise), **{k: np.asarray(getattr(noise, k)).tolist() for k in names if hasattr(noise, k)}}

    normal = NormalActionNoise(np.zeros(1), np.full(1, 0.1))
    ou = OrnsteinUhlenbeckActionNoise(np.zeros(1), np.full(1, 0.2), theta=0.3, dt=0.05, initial_noise=np.ones(1))
    small = dict(learning_starts=0, batch_size=4, policy_kwargs=dict(net_arch=[8]))
    for name, noise, n_envs in [("normal", normal, 1), ("ou", ou, 1), ("vec", normal, 2), ("vec_ou", ou, 2)]:
        env = sb3.common.env_util.make_vec_env("Pendulum-v1", n_envs=n_envs)
        theirs = sb3.SAC("MlpPolicy", env, action_noise=copy.deepcopy(noise), **small).learn(4)
        theirs.save(tmp_path / name)
        if name == "vec_ou":
            with pytest.warns(UserWarning, match=r"pickled action_noise .* custom_objects"):
                assert SAC.load(tmp_path / name).action_noise is None
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ours = SAC.load(tmp_path / name)
        assert settings(ours.action_noise) == settings(theirs.action_noise)
    # SB3 writes a noise's plain values as JSON (a list or a float given as the mean), not as NumPy's text
    for mean, sigma in (([0.0], [0.1]), (0.0, 0.2)):
        sb3.SAC("MlpPolicy", "Pendulum-v1", action_noise=NormalActionNoise(mean, sigma), **small).save(tmp_path / "j")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = SAC.load(tmp_path / "j").action_noise
        assert (loaded._mu.tolist(), loaded._sigma.tolist()) == (mean, sigma)


OLD_FILES = pathlib.Path(__file__).parent / "data" / "old_sb3"  # written by tests/data/old_sb3/make_files.py


def _old_file(name: str) -> tuple[pathlib.Path, dict]:
    """An older SB3's model file and its record: observations (a Dict's keys as obs_<key>) and SB3's actions."""
    record = dict(np.load(OLD_FILES / f"{name}.npz"))
    obs = {k.removeprefix("obs_"): v for k, v in record.items() if k.startswith("obs_")} or record["obs"]
    return OLD_FILES / f"{name}.zip", {"obs": obs, "actions": record["actions"]}


def test_files_of_older_sb3s_load_with_their_settings_and_act_as_there(no_unpickling):
    """Files SB3 2.2.1 (gymnasium 0.29) and 1.8.0 (gym 0.21) wrote: a Dict space written as an OrderedDict, a
    clip_range and a learning-rate schedule SB3 pickled as its own functions (constant_fn, get_linear_fn), a
    target_entropy pickled as a NumPy number. Each loads without a warning, with the settings SB3 trained with,
    and acts as SB3 did."""
    from stable_baselines3.common.utils import LinearSchedule

    expected = {
        "sb3_2.2.1_ppo_cartpole": (PPO, {"clip_range": 0.15, "learning_rate": LinearSchedule(1e-3, 1e-4, 0.5)}),
        "sb3_2.2.1_ppo_dict": (PPO, {"clip_range": 0.25, "learning_rate": 3e-4}),
        "sb3_1.8.0_sac_pendulum": (SAC, {"target_entropy": -1.0, "learning_rate": 3e-4}),
    }
    for name, (agent, settings) in expected.items():
        path, record = _old_file(name)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = agent.load(path)
        for key, value in settings.items():
            got = getattr(model, key)
            if isinstance(value, LinearSchedule):
                assert [got(p) for p in (1.0, 0.75, 0.5, 0.25)] == [value(p) for p in (1.0, 0.75, 0.5, 0.25)]
            else:
                assert (got(1.0) if callable(got) else got) == pytest.approx(value), (name, key)
        actions, _ = model.predict(record["obs"], deterministic=True)
        np.testing.assert_allclose(actions, record["actions"], rtol=0, atol=1e-6)


def test_an_old_cartpole_file_trains_on_todays_cartpole(tmp_path):
    """Gymnasium before 1.0 bounded CartPole's velocities at float32's largest number; now they are inf. Both
    leave them unbounded: the file's model takes today's env (SB3's load refuses it), and covey eval runs it."""
    path, record = _old_file("sb3_2.2.1_ppo_cartpole")
    assert np.isfinite(sb3_files.read_sb3_model(path, "PPO", PPO.config_class)[0]["observation_space"]["high"]).all()
    model = PPO.load(path, env="CartPole-v1")
    np.testing.assert_array_equal(model.predict(record["obs"], deterministic=True)[0], record["actions"])
    assert model.learn(64).num_timesteps == 64
    from covey.cli import main

    assert main(["eval", str(path), "--env", "CartPole-v1", "--episodes", "1"]) == 0


def test_an_unreadable_space_can_be_given_at_load(tmp_path):
    """Where a file's space cannot be read (an SB3 file's repr covey does not parse, a damaged covey file), the
    error names custom_objects, and the space given there loads the model."""
    space = spaces.Box(-1, 1, (3,), np.float32)
    sb3.PPO("MlpPolicy", SpaceEnv(space, spaces.Discrete(2)), policy_kwargs=dict(net_arch=[4])).save(tmp_path / "a")
    data = json.loads(zipfile.ZipFile(tmp_path / "a.zip").read("data"))
    data["observation_space"][":type:"] = "<class 'my_spaces.Weird'>"
    _rewrite_zip(tmp_path / "a.zip", "data", json.dumps(data).encode())
    PPO("MlpPolicy", SpaceEnv(space, spaces.Discrete(2)), policy_kwargs=dict(net_arch=[4])).save(tmp_path / "b")
    settings = json.loads(zipfile.ZipFile(tmp_path / "b.zip").read("covey.json"))
    settings["observation_space"] = {"type": "Weird"}
    _rewrite_zip(tmp_path / "b.zip", "covey.json", json.dumps(settings).encode())
    for name in ("a", "b"):
        with pytest.raises(ModelFileError, match=r"custom_objects=\{'observation_space': env.observation_space\}"):
            PPO.load(tmp_path / name)
        model = PPO.load(tmp_path / name, custom_objects={"observation_space": space})
        assert model.observation_space == space and model.predict(space.sample())[0] in (0, 1)
        model.set_parameters(str(tmp_path / name))  # the weights alone need no space


# ============================================================================================ safety and errors


class _Marker:
    """Unpickled, it writes a file: the stand-in for code a crafted file would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path: str) -> None:
    with open(path, "w") as f:
        f.write("ran")


def _rewrite_zip(path, entry: str, content: bytes) -> None:
    with zipfile.ZipFile(path) as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    entries[entry] = content
    with zipfile.ZipFile(path, "w") as zf:
        for name, value in entries.items():
            zf.writestr(name, value)


def test_a_pickle_planted_in_the_data_never_runs(tmp_path):
    theirs = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
    path = tmp_path / "planted.zip"
    theirs.save(path)
    marker = tmp_path / "ran.txt"
    with zipfile.ZipFile(path) as zf:
        data = json.loads(zf.read("data"))
    data["observation_space"][":serialized:"] = base64.b64encode(pickle.dumps(_Marker(str(marker)))).decode()
    _rewrite_zip(path, "data", json.dumps(data).encode())
    ours = PPO.load(path)
    assert not marker.exists()  # covey read the attributes beside the pickle, not the pickle
    assert ours.observation_space == theirs.observation_space
    with pytest.raises(ValueError, match="not a Gymnasium space"):
        sb3.PPO.load(path)  # SB3 unpickles: the planted call runs, then SB3 finds None where the space was
    assert marker.exists()


def test_a_crafted_tensor_file_is_refused(tmp_path):
    sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).save(tmp_path / "m.zip")
    marker = tmp_path / "ran.txt"
    _rewrite_zip(tmp_path / "m.zip", "policy.pth", pickle.dumps({"w": _Marker(str(marker))}))
    with pytest.raises(ModelFileError, match="not a plain tensor file"):
        PPO.load(tmp_path / "m.zip")
    assert not marker.exists()


def test_a_schedule_written_as_a_function_is_named_and_can_be_passed_again(tmp_path):
    def schedule(progress: float) -> float:
        return 1e-3 * progress

    sb3.PPO("MlpPolicy", "CartPole-v1", learning_rate=schedule, clip_range=0.25, n_steps=32, batch_size=32).save(
        tmp_path / "m.zip"
    )
    with pytest.warns(UserWarning, match="pickled learning_rate.*custom_objects"):
        ours = PPO.load(tmp_path / "m.zip")
    assert ours.learning_rate == 3e-4 and ours.clip_range(1.0) == 0.25  # covey's default; the constant read
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # passed again: nothing left unread, no warning
        # on the CPU: on a GPU, PPO with an MlpPolicy warns that the CPU is faster
        again = PPO.load(tmp_path / "m.zip", custom_objects={"learning_rate": schedule}, device="cpu")
        # or as load's keyword argument (RL Zoo's --trained-agent): SB3 takes it, covey too, without a warning
        kwarg = PPO.load(tmp_path / "m.zip", learning_rate=schedule, device="cpu")
    assert again.learning_rate is schedule and kwarg.learning_rate is schedule


def test_sb3s_schedule_objects_are_read(tmp_path):
    """SB3's LinearSchedule and ConstantSchedule, given as the learning rate (kept as given) or the clip range
    (wrapped in a FloatSchedule), are read from the attributes written beside their pickles."""
    from stable_baselines3.common.utils import ConstantSchedule, LinearSchedule

    learning_rate, clip_range = LinearSchedule(1e-3, 1e-4, 0.8), LinearSchedule(0.3, 0.1, 0.5)
    kwargs = dict(n_steps=32, batch_size=32)
    sb3.PPO("MlpPolicy", "CartPole-v1", learning_rate=learning_rate, clip_range=clip_range, **kwargs).save(
        tmp_path / "m.zip"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = PPO.load(tmp_path / "m.zip", device="cpu")  # on a GPU, PPO with an MlpPolicy would warn
    for progress in (1.0, 0.8, 0.5, 0.0):
        assert ours.clip_range(progress) == pytest.approx(clip_range(progress))
        assert ours.learning_rate(progress) == pytest.approx(learning_rate(progress))
    sb3.PPO("MlpPolicy", "CartPole-v1", learning_rate=ConstantSchedule(5e-4), **kwargs).save(tmp_path / "c.zip")
    assert PPO.load(tmp_path / "c.zip").learning_rate == 5e-4


def test_rl_zoos_linear_schedules_in_sb3_files_are_read(tmp_path):
    """RL-Zoo's ``lin_`` hyperparameters (its ``SimpleLinearSchedule``, in most SB3 files it trained) took covey's
    defaults with a warning; their attributes beside the pickle make them SB3's ``LinearSchedule`` to 0."""
    linear = zoo_schedule(lambda p, v: p * v)
    kwargs = dict(n_steps=32, batch_size=32)
    sb3.PPO("MlpPolicy", "CartPole-v1", learning_rate=linear(1e-3), clip_range=linear(0.25), **kwargs).save(
        tmp_path / "m.zip"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = PPO.load(tmp_path / "m.zip", device="cpu")
    for progress in (1.0, 0.5, 0.0):
        assert ours.learning_rate(progress) == pytest.approx(1e-3 * progress, rel=1e-12, abs=1e-15)
        assert ours.clip_range(progress) == pytest.approx(0.25 * progress, rel=1e-12, abs=1e-15)


def test_files_of_other_algorithms_name_where_they_load(tmp_path):
    sb3.SAC("MlpPolicy", "Pendulum-v1", buffer_size=100).save(tmp_path / "sac.zip")
    with pytest.raises(ModelFileError, match="Stable-Baselines3 SAC model; load it with covey.SAC.load"):
        PPO.load(tmp_path / "sac.zip")
    sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "ppo.zip")
    with pytest.raises(ModelFileError, match="Stable-Baselines3 PPO model; load it with covey.PPO.load"):
        POCA.load(tmp_path / "ppo.zip")
    sb3.A2C("MlpPolicy", "CartPole-v1").save(tmp_path / "a2c.zip")
    with pytest.raises(ModelFileError, match="A2C model; load it with stable_baselines3.A2C.load. covey loads SB3's"):
        PPO.load(tmp_path / "a2c.zip")
    sb3.DQN("MlpPolicy", "CartPole-v1", buffer_size=100).save(tmp_path / "dqn.zip")
    with pytest.raises(ModelFileError, match="DQN model"):
        SAC.load(tmp_path / "dqn.zip")
    # sb3-contrib's files name their own loader (SB3's PPO.load opened a MaskablePPO file without a word): a PPO
    # file whose policy class is of sb3-contrib's stands in for one here (RecurrentPPO's load as covey's PPO:
    # test_recurrent_ppo_files.py).
    with zipfile.ZipFile(tmp_path / "ppo.zip") as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    data = json.loads(entries["data"])
    for module, algorithm in [("common.maskable.policies", "MaskablePPO"), ("common.new_thing.policies", None)]:
        data["policy_class"]["__module__"] = f"sb3_contrib.{module}"
        with zipfile.ZipFile(tmp_path / "contrib.zip", "w") as zf:
            for name, content in {**entries, "data": json.dumps(data).encode()}.items():
                zf.writestr(name, content)
        loader = f"sb3_contrib.{algorithm}.load" if algorithm else "sb3_contrib"
        with pytest.raises(ModelFileError, match=rf"holds an sb3-contrib.* model; load it with {re.escape(loader)}\."):
            PPO.load(tmp_path / "contrib.zip")
    # sb3-contrib's TRPO builds SB3's own policy classes; its conjugate-gradient settings name it (A2C.load would
    # open it as an A2C model without a word)
    data["policy_class"]["__module__"] = "stable_baselines3.common.policies"
    data.update(cg_max_steps=15, cg_damping=0.1, n_critic_updates=10)
    for data_key in ("n_epochs", "clip_range"):  # TRPO's file has neither
        data.pop(data_key, None)
    with zipfile.ZipFile(tmp_path / "trpo.zip", "w") as zf:
        for name, content in {**entries, "data": json.dumps(data).encode()}.items():
            zf.writestr(name, content)
    with pytest.raises(ModelFileError, match=r"holds an sb3-contrib TRPO model; load it with sb3_contrib\.TRPO\.load"):
        PPO.load(tmp_path / "trpo.zip")


def test_train_freq_is_read_from_its_pickles_opcodes_alone(tmp_path):
    """SAC's TrainFreq has no attributes for SB3 to write beside its pickle: covey lists the pickle's opcodes
    (nothing is built or called) and reads it only when it is a TrainFreq and nothing else."""
    from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit

    from covey.sb3_files import _train_freq

    def encoded(value) -> str:
        return base64.b64encode(cloudpickle.dumps(value)).decode()

    assert _train_freq(encoded(TrainFreq(4, TrainFrequencyUnit.EPISODE))) == [4, "episode"]
    assert _train_freq(encoded(TrainFreq(1, TrainFrequencyUnit.STEP))) == [1, "step"]
    marker = tmp_path / "ran.txt"
    assert _train_freq(encoded((TrainFreq(1, TrainFrequencyUnit.STEP), _Marker(str(marker))))) is None
    assert _train_freq("not base64 of a pickle") is None
    assert not marker.exists()


@pytest.mark.cpu
def test_set_parameters_reads_an_sb3_file(tmp_path):
    """SB3's ``model.set_parameters("file.zip")`` on a model built with the file's settings: the file's weights."""
    kwargs = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[16]))
    theirs = sb3.PPO("MlpPolicy", "CartPole-v1", seed=0, **kwargs).learn(64)
    theirs.save(tmp_path / "m.zip")
    ours = PPO("MlpPolicy", "CartPole-v1", seed=1, **kwargs)
    obs = torch.as_tensor(obs_batch(theirs.observation_space))
    with torch.no_grad():
        assert not torch.allclose(ours.policy.predict_values(obs), theirs.policy.predict_values(obs))  # other seed
        ours.set_parameters(tmp_path / "m.zip")
        torch.testing.assert_close(ours.policy.predict_values(obs), theirs.policy.predict_values(obs))
    assert_same_policy(ours, theirs)


@needs_onnx_exporter()
def test_sb3_files_load_by_their_agent_in_the_cli_and_the_exporter(tmp_path):
    """``covey.agents.load`` picks the agent of an SB3 file as of a covey one, so ``covey eval`` and ``covey export``
    take SB3's PPO and SAC files too; another algorithm's file is refused, naming it."""
    import subprocess
    import sys

    from covey.agents import file_agent, load
    from covey.export import export_onnx

    sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).save(tmp_path / "ppo.zip")
    sb3.SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, seed=0).save(tmp_path / "sac.zip")
    assert file_agent(tmp_path / "ppo.zip") == "PPO" and isinstance(load(tmp_path / "ppo.zip"), PPO)
    assert file_agent(tmp_path / "sac.zip") == "SAC" and isinstance(load(tmp_path / "sac.zip"), SAC)
    sb3.A2C("MlpPolicy", "CartPole-v1").save(tmp_path / "a2c.zip")
    with pytest.raises(ModelFileError, match="Stable-Baselines3 A2C model"):
        load(tmp_path / "a2c.zip")
    result = subprocess.run(
        [sys.executable, "-m", "covey", "eval", str(tmp_path / "ppo.zip"), "--env", "CartPole-v1", "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "mean return" in result.stdout, result.stderr[-2000:]
    pytest.importorskip("onnxruntime")
    assert export_onnx(tmp_path / "sac.zip", tmp_path / "sac.onnx")["verified"]


def test_a_file_from_the_gym_era_loads(tmp_path):
    """SB3 1.x files (as many shared models are) name gym's space classes, write Discrete's n as a number without
    a start and Box bounds without their short repr, and pickle the clip range as a function: they load, and the
    clip range left unread is named."""
    theirs = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(32)
    path = tmp_path / "old.zip"
    theirs.save(path)
    with zipfile.ZipFile(path) as zf:
        data = json.loads(zf.read("data"))
    obs, act = data["observation_space"], data["action_space"]
    obs[":type:"] = "<class 'gym.spaces.box.Box'>"
    for key in ("low_repr", "high_repr"):
        obs.pop(key)
    data["action_space"] = {":type:": "<class 'gym.spaces.discrete.Discrete'>", ":serialized:": act[":serialized:"]}
    data["action_space"].update(n=2, shape=[], dtype="int64", _np_random=None)
    data["clip_range"] = {":type:": "<class 'function'>", ":serialized:": data["clip_range"][":serialized:"]}
    _rewrite_zip(path, "data", json.dumps(data).encode())
    with pytest.warns(UserWarning, match="pickled clip_range"):
        ours = PPO.load(path)
    assert ours.action_space == spaces.Discrete(2) and ours.observation_space == theirs.observation_space
    assert_same_policy(ours, theirs)


def test_a_space_the_file_does_not_tell_in_full_names_the_way_around(tmp_path):
    """Bounds of over 1,000 elements that differ are printed summarized beside the pickle: the load says so and
    names custom_objects, which takes the env's space."""
    low = np.linspace(-2.0, -1.0, 1200, dtype=np.float32)
    env = SpaceEnv(spaces.Box(low, -low), spaces.Discrete(2))
    sb3.PPO("MlpPolicy", env, n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8])).save(tmp_path / "m.zip")
    with pytest.raises(ModelFileError, match=r"observation space .*summarized.*custom_objects="):
        PPO.load(tmp_path / "m.zip")
    model = PPO.load(tmp_path / "m.zip", env=env, custom_objects={"observation_space": env.observation_space})
    assert model.observation_space == env.observation_space


def test_a_corrupt_tensor_entry_is_named_as_corrupt_in_covey_and_sb3_files_alike(tmp_path):
    sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).save(tmp_path / "m.zip")
    _rewrite_zip(tmp_path / "m.zip", "policy.pth", b"not a tensor file")
    with pytest.raises(ModelFileError, match=r"its policy\.pth is not a plain tensor file\. It is corrupt, or"):
        PPO.load(tmp_path / "m.zip")
    _rewrite_zip(tmp_path / "m.zip", "policy.pth", b"")
    with pytest.raises(
        ModelFileError, match=r"corrupt Stable-Baselines3 model file: its policy\.pth cannot be read \(empty\)"
    ):
        PPO.load(tmp_path / "m.zip")
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "ours.zip")
    _rewrite_zip(tmp_path / "ours.zip", "tensors.pt", b"")
    with pytest.raises(ModelFileError, match=r"corrupt covey model file: its tensors\.pt cannot be read \(empty\)"):
        PPO.load(tmp_path / "ours.zip")


def test_sb3s_own_extractor_and_optimizer_classes_load_by_name_from_either_libraries_file(tmp_path):
    """``features_extractor_class=FlattenExtractor`` (SB3's default, named) and ``RMSpropTFLike`` were refused
    at load without custom_objects, from covey's file and SB3's alike: they are SB3's, named in the file."""
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.torch_layers import FlattenExtractor

    kwargs = dict(features_extractor_class=FlattenExtractor, optimizer_class=RMSpropTFLike)
    theirs = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, policy_kwargs=kwargs, seed=0)
    theirs.save(tmp_path / "theirs.zip")
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, policy_kwargs=kwargs).save(tmp_path / "ours.zip")
    obs = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    for name in ("theirs.zip", "ours.zip"):
        loaded = PPO.load(tmp_path / name)
        assert loaded.policy_kwargs["features_extractor_class"] is FlattenExtractor
        assert type(loaded.policy.optimizer) is RMSpropTFLike
    actions = PPO.load(tmp_path / "theirs.zip").predict(obs, deterministic=True)[0]
    np.testing.assert_array_equal(actions, theirs.predict(obs, deterministic=True)[0])
