"""The model file: one zip, JSON settings, tensors that load without running code, atomic writes."""

import io
import json
import os
import pickle
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import zoo_schedule
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnvWrapper

from covey import PPO, SAC, serialization
from covey.serialization import ModelFileError, space_from_json, space_to_json


@pytest.fixture
def saved(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(64)
    path = tmp_path / "model.zip"
    model.save(path)
    return model, path


def test_file_holds_json_settings_and_tensors(saved):
    _, path = saved
    with zipfile.ZipFile(path) as zf:
        assert set(zf.namelist()) == {"covey.json", "tensors.pt"}
        settings = json.loads(zf.read("covey.json"))
        tensors = torch.load(io.BytesIO(zf.read("tensors.pt")), weights_only=True)
    assert settings["format_version"] == serialization.FORMAT_VERSION
    assert settings["agent"] == "PPO" and settings["hyperparameters"]["n_steps"] == 32
    # SB3's get_parameters() names, and where training left the env (SB3 keeps _last_obs)
    assert set(tensors) == {"policy", "policy.optimizer", "env_place"}
    assert tensors["env_place"]["obs"].shape == (1, 4)


class _Exploit:
    """Unpickling this object would create a directory: the stand-in for arbitrary code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_file_crafted_to_run_code_is_refused(saved, tmp_path, protocol):
    _, path = saved
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(evil, "w") as dst:
        dst.writestr("covey.json", src.read("covey.json"))
        dst.writestr("tensors.pt", _torch_bytes({"actor": _Exploit(str(marker))}, protocol))
    with pytest.raises(ModelFileError, match="Refusing to load"):
        PPO.load(evil)
    assert not marker.exists()
    # The same bytes, unpickled without covey's guard, would have run the code: the test is real.
    with zipfile.ZipFile(evil) as zf:
        torch.load(io.BytesIO(zf.read("tensors.pt")), weights_only=False)
    assert marker.exists()


def _torch_bytes(obj, protocol: int) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    return buf.getvalue()


def test_a_crash_mid_save_keeps_the_previous_file(saved, monkeypatch):
    model, path = saved
    before = path.read_bytes()

    def crash(f, settings, tensor_bytes):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serialization, "_write_zip", crash)
    model.learn(32)  # change the weights so a completed save would differ
    with pytest.raises(OSError, match="No space left"):
        model.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.undo()
    PPO.load(path)  # still loads


def test_a_truncated_file_gives_a_clear_error(saved, tmp_path):
    _, path = saved
    data = path.read_bytes()
    cut = tmp_path / "cut.zip"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="corrupt or truncated"):
        PPO.load(cut)


def test_garbage_and_foreign_zips_give_clear_errors(tmp_path):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all" * 10)
    with pytest.raises(ModelFileError, match="not a readable covey model"):
        PPO.load(junk)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as zf:
        zf.writestr("weights.bin", b"")
    with pytest.raises(ModelFileError, match="not a covey model"):
        PPO.load(foreign)
    sb3_shaped = tmp_path / "sb3.zip"  # an SB3 file's entries, holding nothing
    with zipfile.ZipFile(sb3_shaped, "w") as zf:
        zf.writestr("data", "{}")
        zf.writestr("policy.pth", b"")
    with pytest.raises(ModelFileError, match="corrupt Stable-Baselines3 model file"):
        PPO.load(sb3_shaped)
    with pytest.raises(FileNotFoundError, match="No model file"):
        PPO.load(tmp_path / "missing.zip")


def test_corrupt_tensor_entry_and_newer_format(saved, tmp_path):
    _, path = saved
    with zipfile.ZipFile(path) as src:
        settings = json.loads(src.read("covey.json"))
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as dst:
        dst.writestr("covey.json", json.dumps(settings))
        dst.writestr("tensors.pt", b"\x00" * 100)
    with pytest.raises(ModelFileError, match="not a plain tensor file. It is corrupt"):
        PPO.load(bad)
    newer = tmp_path / "newer.zip"
    with zipfile.ZipFile(newer, "w") as dst:
        dst.writestr("covey.json", json.dumps({**settings, "format_version": 99}))
        dst.writestr("tensors.pt", b"")
    with pytest.raises(ModelFileError, match="format version 99"):
        PPO.load(newer)


def test_save_to_a_file_object_and_exclude(saved, tmp_path):
    model, _ = saved
    buf = io.BytesIO()
    model.save(buf, exclude=["policy.optimizer", "_last_obs"])
    buf.seek(0)
    settings, tensors = serialization.load_model_file(buf)
    assert set(tensors) == {"policy"}
    buf.seek(0)
    loaded = PPO.load(buf)
    obs = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])


def test_exclude_keeps_the_weights_and_include_names_the_replay_buffers_own_file(saved, tmp_path):
    """As SB3's save: the networks' weights are saved whatever exclude names (its pickled attributes, "env",
    are nothing to covey), so the file loads; include of what covey does not save is refused with the way."""
    model, _ = saved
    model.save(tmp_path / "m.zip", exclude=["policy", "env", "replay_buffer"])
    settings, tensors = serialization.load_model_file(tmp_path / "m.zip")
    assert set(tensors) == {"policy", "policy.optimizer", "env_place"}
    obs = np.zeros((3, 4), np.float32)
    loaded = PPO.load(tmp_path / "m.zip")
    np.testing.assert_array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    model.save(tmp_path / "same.zip", include=["policy"])  # saved anyway
    # attributes the file holds anyway, by SB3's names, as SB3's save takes them (refused before)
    model.save(tmp_path / "same.zip", include=["num_timesteps", "gamma", "_last_obs", "_stats_window_size"])
    assert PPO.load(tmp_path / "same.zip").num_timesteps == model.num_timesteps
    sac = SAC("MlpPolicy", "Pendulum-v1", learning_starts=10).learn(20)
    with pytest.raises(ValueError, match=r"include=\['replay_buffer'\].*model.save_replay_buffer\(path\)"):
        sac.save(tmp_path / "sac.zip", include=["replay_buffer"])
    assert not (tmp_path / "sac.zip").exists()
    with pytest.raises(ValueError, match=r"include=\['env'\].*never pickled objects: pass the env to load") as info:
        model.save(tmp_path / "env.zip", include=["env"])  # the advice is the env's alone
    assert "replay" not in str(info.value)


def test_excluded_hyperparameters_load_as_the_constructors_defaults_as_in_sb3(tmp_path):
    """save(exclude=["gamma", "learning_rate"]) leaves them out of the file, so load builds the model with the
    constructor's defaults, as SB3's load does; the others keep their saved values."""
    import stable_baselines3

    kept = {}
    for cls in (stable_baselines3.PPO, PPO):
        model = cls("MlpPolicy", "CartPole-v1", gamma=0.95, learning_rate=1e-3, n_epochs=3, device="cpu")
        model.save(tmp_path / f"{cls.__module__}.zip", exclude=["gamma", "learning_rate"])
        loaded = cls.load(tmp_path / f"{cls.__module__}.zip", device="cpu")
        kept[cls] = (loaded.gamma, loaded.learning_rate, loaded.n_epochs)
    assert kept[PPO] == kept[stable_baselines3.PPO] == (0.99, 3e-4, 3)


def test_wrong_agent_class_is_named(saved):
    _, path = saved

    class SAC(PPO):
        agent_name = "SAC"

    with pytest.raises(ModelFileError, match="holds a PPO model"):
        SAC.load(path)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Box(np.array([0, -np.inf]), np.array([1, np.inf]), dtype=np.float64),
        spaces.Box(0, 255, (8, 8, 3), np.uint8),
        spaces.Discrete(4, start=-1),
        spaces.MultiDiscrete([3, 4]),
        spaces.MultiBinary(5),
        spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(-1, 1, (2,))}),
    ],
)
def test_spaces_round_trip_through_json(space):
    assert space_from_json(json.loads(json.dumps(space_to_json(space)))) == space


def test_custom_activation_needs_custom_objects(tmp_path):
    class Swish(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x)

    kwargs = dict(activation_fn=Swish, net_arch=dict(pi=[8], vf=[16, 16]), ortho_init=False)
    model = PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=32, batch_size=32, policy_kwargs=kwargs)
    model.save(tmp_path / "m.zip")
    with pytest.raises(ModelFileError, match="custom_objects.*the file's other policy_kwargs are kept"):
        PPO.load(tmp_path / "m.zip")
    # The class alone, as the error says: the file's other policy_kwargs (the net_arch) stay.
    loaded = PPO.load(tmp_path / "m.zip", custom_objects={"policy_kwargs": dict(activation_fn=Swish)})
    assert loaded.policy_kwargs == kwargs
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    # A key given goes over the file's.
    assert PPO.load(tmp_path / "m.zip", custom_objects={"policy_kwargs": kwargs}).policy_kwargs == kwargs


def test_rl_zoos_linear_schedules_are_kept_whole(tmp_path):
    """RL-Zoo's ``lin_1e-3`` hyperparameters (its ``SimpleLinearSchedule``) came back from a file as constants;
    they are SB3's ``LinearSchedule`` to 0, so a loaded model goes on decaying as the saved one did. A class of
    that name computing something else is kept as other functions are, by its value."""
    import warnings

    from stable_baselines3.common.utils import LinearSchedule

    from covey import PPO

    linear = zoo_schedule(lambda p, v: p * v)
    model = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=64,
        batch_size=64,
        n_epochs=1,
        seed=0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
    ).learn(64)
    model.save(tmp_path / "zoo.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "schedules that are functions" warning: nothing was lost
        loaded = PPO.load(tmp_path / "zoo.zip", env="CartPole-v1")
    assert isinstance(loaded.learning_rate, LinearSchedule) and isinstance(loaded.clip_range, LinearSchedule)
    for progress in (1.0, 0.5, 0.1):
        assert loaded.lr_schedule(progress) == pytest.approx(1e-3 * progress, rel=1e-12)
        assert loaded.clip_range(progress) == pytest.approx(0.2 * progress, rel=1e-12)

    squared = zoo_schedule(lambda p, v: p * p * v)
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, learning_rate=squared(1e-3)).save(tmp_path / "sq.zip")
    assert not isinstance(PPO.load(tmp_path / "sq.zip").learning_rate, LinearSchedule)


def test_schedule_that_decayed_to_zero_still_loads(tmp_path):
    """A linear schedule ends at 0 (or just below: the last rollout overshoots the budget); the saved model
    loads, with the schedule's initial value standing in, and a schedule still in force keeps its value."""
    from covey import PPO

    model = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=64,
        batch_size=32,
        n_epochs=1,
        learning_rate=lambda p: 1e-3 * p,
        clip_range=lambda p: 0.2 * p,
        seed=0,
    )
    model.learn(100)  # 128 steps done for 100: progress ends below 0
    assert model._current_progress_remaining < 0
    model.save(tmp_path / "decayed.zip")
    loaded = PPO.load(tmp_path / "decayed.zip")
    assert loaded.learning_rate == pytest.approx(1e-3) and loaded.clip_range(1.0) == pytest.approx(0.2)
    model._current_progress_remaining = 0.5
    model.save(tmp_path / "half.zip")
    half = PPO.load(tmp_path / "half.zip")
    assert half.learning_rate == pytest.approx(5e-4) and half.clip_range(1.0) == pytest.approx(0.1)


def _as_earlier_file(model, path) -> None:
    """Rewrite a saved model file with the parameter group names that earlier covey versions wrote: one group
    per network (actor, critic, ...) and per optimizer (optimizer, actor_optimizer, ...)."""
    settings, _ = serialization.load_model_file(path)
    settings.pop("format_version")
    tensors = {name: net.state_dict() for name, net in model._networks().items()}
    tensors |= {name: opt.state_dict() for name, opt in model._optimizers().items()}
    if getattr(model, "log_ent_coef", None) is not None:
        tensors["ent_coef"] = {"log_ent_coef": model.log_ent_coef.detach().clone()}
    serialization.save_model_file(path, settings, tensors)


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_files_with_earlier_parameter_group_names_still_load(agent, tmp_path):
    from covey import SAC

    if agent == "PPO":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(64)
        old_names = {"actor", "critic", "optimizer"}
        obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0).learn(32)
        old_names = {"actor", "critic", "critic_target", "actor_optimizer", "critic_optimizer", "ent_coef_optimizer"}
        obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    path = tmp_path / "old.zip"
    model.save(path)
    _as_earlier_file(model, path)
    assert old_names <= set(serialization.load_model_file(path)[1])

    loaded = type(model).load(path)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    for name, group in loaded.get_parameters().items():
        expected = model.get_parameters()[name]
        if name == "policy" or name == "ent_coef":
            assert expected.keys() == group.keys()
            for key in expected:
                torch.testing.assert_close(group[key], expected[key], rtol=0, atol=0)
        else:  # an optimizer: its state per parameter
            for index, state in expected["state"].items():
                torch.testing.assert_close(group["state"][index]["exp_avg"], state["exp_avg"], rtol=0, atol=0)


def test_files_written_through_a_temporary_file_get_the_usual_permissions(tmp_path):
    """The temporary file a save renames into place is made readable by its owner alone; the file it becomes
    has the mode a plain open() would give it under the umask, for model files, replay buffers, text, images."""
    from covey import SAC
    from covey.cli.evaluation import _write_gif
    from covey.files import write_text_atomically

    old = os.umask(0o027)
    try:
        PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(tmp_path / "model.zip")
        SAC("MlpPolicy", "Pendulum-v1", buffer_size=100).save_replay_buffer(tmp_path / "replay.npz")
        write_text_atomically(tmp_path / "state.json", "{}")
        _write_gif([np.zeros((4, 4, 3), np.uint8)] * 2, tmp_path / "episode.gif", fps=10)
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(["model.zip", "replay.npz", "state.json", "episode.gif", "plain.txt"], 0o640)


def test_saving_over_a_file_keeps_its_permissions_and_a_link_stays_a_link(tmp_path):
    """A save replaces the file's contents: a file made private (0600) stays so, and a symbolic link keeps
    pointing at the file it names, which gets the new model (the link was replaced by a file, its target left
    with the old model)."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0)
    private = tmp_path / "private.zip"
    model.save(private)
    private.chmod(0o600)
    model.save(private)
    assert private.stat().st_mode & 0o777 == 0o600
    store = tmp_path / "store"
    store.mkdir()
    (store / "real.zip").write_bytes(b"old")
    link = tmp_path / "latest.zip"
    link.symlink_to(store / "real.zip")
    model.save(link)
    assert link.is_symlink() and os.readlink(link) == str(store / "real.zip")
    loaded = PPO.load(store / "real.zip")
    obs = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    assert sorted(p.name for p in store.iterdir()) == ["real.zip"]  # no temporary file left


def test_custom_objects_spaces_stand_for_the_files_as_in_sb3(tmp_path):
    """load(custom_objects={"observation_space": ...}) builds the model for that space (other bounds of the same
    shape), so an env of that space attaches; the weights are the file's."""
    from envs import SpaceEnv

    narrow, wide = spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (3,), np.float32)
    model = PPO("MlpPolicy", SpaceEnv(narrow, spaces.Discrete(2)), n_steps=16, batch_size=16, seed=0)
    model.save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match="Observation spaces do not match"):
        PPO.load(tmp_path / "m.zip", env=SpaceEnv(wide, spaces.Discrete(2)))
    loaded = PPO.load(
        tmp_path / "m.zip", env=SpaceEnv(wide, spaces.Discrete(2)), custom_objects={"observation_space": wide}
    )
    assert loaded.observation_space == wide
    obs = np.random.default_rng(0).uniform(-1, 1, (8, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    with pytest.raises(ValueError, match="do not fit this model"):
        PPO.load(tmp_path / "m.zip", custom_objects={"observation_space": spaces.Box(-1, 1, (5,), np.float32)})
    with pytest.raises(ValueError, match="custom_objects action_space='x' is invalid"):
        PPO.load(tmp_path / "m.zip", custom_objects={"action_space": "x"})


class CountingResets(VecEnvWrapper):
    def __init__(self, venv):
        super().__init__(venv)
        self.resets = 0

    def reset(self):
        self.resets += 1
        return self.venv.reset()

    def step_wait(self):
        return self.venv.step_wait()


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_load_with_force_reset_false_goes_on_from_the_saved_observations(tmp_path, name):
    """As SB3 keeps ``_last_obs`` in its file: ``load(path, env, force_reset=False)`` then
    ``learn(reset_num_timesteps=False)`` goes on in the env's episodes, without a reset."""
    env_id = "CartPole-v1" if name == "PPO" else "Pendulum-v1"
    venv = CountingResets(make_vec_env(env_id, n_envs=2, seed=0))
    kwargs = dict(n_steps=16, batch_size=16) if name == "PPO" else dict(learning_starts=10, batch_size=8)
    cls = {"PPO": PPO, "SAC": SAC}[name]
    model = cls("MlpPolicy", venv, seed=0, **kwargs).learn(32)
    model.save(tmp_path / "model")
    resets = venv.resets
    loaded = cls.load(tmp_path / "model", env=venv, force_reset=False)
    np.testing.assert_array_equal(loaded._last_obs, model._last_obs)
    loaded.learn(32, reset_num_timesteps=False)
    assert venv.resets == resets and loaded.num_timesteps == 64
    assert cls.load(tmp_path / "model", env=venv)._last_obs is None  # force_reset=True, the default
    loaded.set_parameters(tmp_path / "model")  # the observations are no parameter group


def test_load_with_force_reset_false_says_where_it_cannot_go_on(tmp_path):
    PPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16).learn(16).save(tmp_path / "lstm")
    with pytest.warns(UserWarning, match="holds no last observations to go on from"):
        PPO.load(tmp_path / "lstm", env=make_vec_env("CartPole-v1"), force_reset=False)


def test_saving_and_loading_where_no_file_can_be_name_the_path_asked_for(tmp_path):
    """A file where a folder of the path should be, a folder where the file should be, and a folder given to load
    are named as such (a FileExistsError from mkdir, a temporary file's name, or "corrupt" before)."""
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotADirectoryError, match=r"Cannot write .*a_file/sub/m\.zip: .*a_file is a file, not a folder"):
        model.save(tmp_path / "a_file" / "sub" / "m.zip")
    (tmp_path / "folder.zip").mkdir()
    with pytest.raises(IsADirectoryError, match=r"Cannot write .*folder\.zip: it is a folder"):
        model.save(tmp_path / "folder.zip")
    for path in (tmp_path / "folder.zip", tmp_path / "folder"):
        with pytest.raises(IsADirectoryError, match=r"folder\.zip is a folder, not a model file"):
            PPO.load(path)


def test_numpy_scalar_hyperparameters_save_load_and_copy_as_sb3s_do(tmp_path):
    """A sweep's values (``np.random.choice``, ``np.float32``, ``np.bool_``), in the constructor, set on the model
    or in ``policy_kwargs``: the model saves (a checkpoint callback too), loads them back as numbers and copies,
    where the file's JSON refused them after training had run."""
    import copy

    from stable_baselines3.common.callbacks import CheckpointCallback

    model = PPO(
        "MlpPolicy",
        "Pendulum-v1",
        n_steps=np.int64(64),
        batch_size=32,
        n_epochs=np.int64(2),
        normalize_advantage=np.bool_(True),
        policy_kwargs=dict(log_std_init=np.float32(-1.0), net_arch=[np.int64(16), np.int64(16)]),
        seed=0,
    )
    model.gamma = np.float32(0.9)
    model.learn(128, callback=CheckpointCallback(64, str(tmp_path / "checkpoints")))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["rl_model_128_steps.zip", "rl_model_64_steps.zip"]
    model.save(tmp_path / "model")
    loaded = PPO.load(tmp_path / "model")
    assert (loaded.n_steps, loaded.n_epochs, loaded.normalize_advantage) == (64, 2, True)
    assert loaded.gamma == pytest.approx(0.9)
    assert loaded.policy_kwargs == {"log_std_init": -1.0, "net_arch": [16, 16]}
    assert loaded.policy.actor.trunk[0].out_features == 16
    assert loaded.policy.log_std.item() == pytest.approx(-1.0, abs=0.01)  # from log_std_init, barely trained
    obs = np.zeros((1, 3), np.float32)
    copied = copy.deepcopy(model)
    assert np.array_equal(copied.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])

    sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=np.int64(500), tau=np.float32(0.01), learning_starts=np.int64(8))
    sac.train_freq = (np.int64(2), "step")
    sac.learn(16)
    sac.save(tmp_path / "sac")
    loaded = SAC.load(tmp_path / "sac")
    assert (loaded.buffer_size, loaded.learning_starts, loaded.train_freq.frequency) == (500, 8, 2)
    assert loaded.tau == pytest.approx(0.01)


@pytest.mark.parametrize("entry", ["tensors.pt", "policy.pth"])
def test_an_entry_crafted_to_inflate_is_refused_before_it_is_read(saved, tmp_path, entry):
    """A model file of a few hundred kB whose tensor entry inflates to 64 MiB of zeros (gigabytes in a real
    attack) is refused from its first bytes, which are not a torch archive's: it used to be read whole into
    memory before torch refused it. Its settings' format is checked before its tensors."""
    import tracemalloc

    import stable_baselines3

    _, path = saved
    source = path if entry == "tensors.pt" else tmp_path / "sb3.zip"
    if entry == "policy.pth":
        stable_baselines3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32).save(source)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            if name != entry:
                dst.writestr(name, src.read(name))
        with dst.open(entry, "w") as f:
            for _ in range(64):
                f.write(bytes(1 << 20))
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError, match=f"its {entry} is not a plain tensor file"):
            PPO.load(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    with zipfile.ZipFile(path) as src:
        settings = json.loads(src.read("covey.json"))
    for version, message in ((99, "format version 99; this covey reads versions up to"), ("1", "hold no format")):
        with zipfile.ZipFile(bomb, "w") as dst:
            dst.writestr("covey.json", json.dumps({**settings, "format_version": version}))
            dst.writestr("tensors.pt", b"")
        with pytest.raises(ModelFileError, match=message):
            PPO.load(bomb)


def test_a_pytorch_archive_is_named_as_one_with_the_files_that_do_load(tmp_path):
    """SB3's ``policy.save`` (a torch archive) and an SB3 model file cut in half (whose entries read as the torch
    archive inside it) were answered with "load it with PPO.load", the call that had just failed."""
    import stable_baselines3

    model = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32)
    model.policy.save(tmp_path / "policy")
    model.save(tmp_path / "model.zip")
    raw = (tmp_path / "model.zip").read_bytes()
    (tmp_path / "half.zip").write_bytes(raw[: len(raw) // 2])
    torch.save({"w": torch.zeros(2)}, tmp_path / "weights.pt")
    for name in ("policy", "half.zip", "weights.pt"):
        with pytest.raises(ModelFileError, match=r"is a PyTorch archive .*not a model file.*load the SB3 model"):
            PPO.load(tmp_path / name)


def test_a_folder_that_takes_no_new_file_is_named_with_the_way_out(saved, monkeypatch):
    """A save writes a new file beside the target and renames it over it; in a folder where no file can be made
    (read-only, immutable) the error says why and what to do, and the previous file stays."""
    import tempfile

    model, path = saved
    before = path.read_bytes()

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError, match=r"creating a file in .*give this folder write access, or save to"):
        model.save(path)
    assert path.read_bytes() == before


def test_a_file_opened_in_text_mode_is_named_with_binary_mode(saved, tmp_path):
    """zipfile's and NumPy's own errors ("write() argument must be str, not bytes") named no file mode."""
    model, path = saved
    with open(tmp_path / "text.zip", "w") as f, pytest.raises(TypeError, match=r"text mode .*open\(path, 'wb'\)"):
        model.save(f)
    with open(path) as f, pytest.raises(TypeError, match=r"Cannot load from a file opened in text mode"):
        PPO.load(f)
    sac = SAC("MlpPolicy", "Pendulum-v1", learning_starts=4, buffer_size=100)
    sac.learn(8)
    with open(tmp_path / "buffer.pkl", "w") as f, pytest.raises(TypeError, match=r"save a replay buffer to a file"):
        sac.save_replay_buffer(f)
    sac.save_replay_buffer(tmp_path / "buffer.pkl")
    with open(tmp_path / "buffer.pkl") as f, pytest.raises(TypeError, match=r"load a replay buffer from a file"):
        sac.load_replay_buffer(f)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: {k: v for k, v in s.items() if k != "hyperparameters"}, r"lack 'hyperparameters'"),
        (lambda s: {k: v for k, v in s.items() if k != "agent"}, r"lack 'agent'"),
        (lambda s: {**s, "hyperparameters": []}, r"hold hyperparameters=\[\], where save writes dict"),
        (lambda s: {**s, "n_envs": "x"}, r"hold n_envs='x', where save writes int"),
        (lambda s: {**s, "observation_space": "Box"}, r"hold observation_space='Box', where save writes dict"),
        (lambda s: {**s, "action_space": {"type": "Box"}}, r"hold an action_space that is not a space \(KeyError"),
        (lambda s: [1, 2], r"hold no format version \(an int\)"),
    ],
    ids=["no hyperparameters", "no agent", "listed hyperparameters", "n_envs", "space", "half a space", "a list"],
)
def test_hand_edited_settings_are_named_at_load(saved, tmp_path, edit, message):
    """A ``covey.json`` missing a setting or holding one of another type failed with KeyError, AttributeError or
    TypeError from inside load, told to "load it with covey.None.load", or (hyperparameters as a list) loaded
    with every hyperparameter at its default, silently."""
    _, path = saved
    with zipfile.ZipFile(path) as src:
        settings = json.loads(src.read("covey.json"))
        tensors = src.read("tensors.pt")
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(edited, "w") as dst:
        dst.writestr("covey.json", json.dumps(edit(settings)))
        dst.writestr("tensors.pt", tensors)
    with pytest.raises(ModelFileError, match=message):
        PPO.load(edited)


def test_the_last_learns_total_timesteps_is_kept_as_sb3_keeps_it(tmp_path):
    """``_total_timesteps`` (the last ``learn``'s budget, which callbacks read for progress) came back as 0."""
    import stable_baselines3

    for lib in (stable_baselines3, __import__("covey")):
        model = lib.PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64).learn(100)
        model.save(tmp_path / lib.__name__)
        assert model._total_timesteps == 100
        assert PPO.load(tmp_path / lib.__name__)._total_timesteps == 100, lib.__name__


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_a_model_on_worker_processes_is_refused_a_copy_and_keeps_training(copier):
    """A copy of a model whose env is SB3's SubprocVecEnv failed on the pipes ("AuthenticationString"), and on the
    way closed the original's ends of them: its next step failed with 'Bad file descriptor'. Now it is refused
    before anything is copied, with the way to a copy, as covey's SubprocGroupVecEnv is."""
    import copy

    from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize

    env = VecNormalize(
        make_vec_env("CartPole-v1", n_envs=2, vec_env_cls=SubprocVecEnv, vec_env_kwargs={"start_method": "fork"})
    )
    try:
        model = PPO("MlpPolicy", env, n_steps=16, batch_size=32, seed=0).learn(32)
        with pytest.raises(TypeError, match=r"env is a SubprocVecEnv, whose env copies live in worker processes"):
            copy.deepcopy(model) if copier == "deepcopy" else pickle.dumps(model)
        assert model.learn(32, reset_num_timesteps=False).num_timesteps == 64
    finally:
        env.close()


def test_a_model_files_tensors_are_stored_as_sb3_stores_them_and_its_settings_compressed(tmp_path):
    """Deflating float weights took most of a SAC model's save (and of its copy, which goes through one) for a
    quarter off the size; SB3 stores its files' tensors as they are. The file still loads, its tensors' CRC
    checked."""
    model = SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, seed=0)
    model.save(tmp_path / "m.zip")
    with zipfile.ZipFile(tmp_path / "m.zip") as zf:
        kinds = {info.filename: info.compress_type for info in zf.infolist()}
    expected = {serialization.SETTINGS_ENTRY: zipfile.ZIP_DEFLATED, serialization.TENSORS_ENTRY: zipfile.ZIP_STORED}
    assert kinds == expected
    obs = model.observation_space.sample()
    loaded = SAC.load(tmp_path / "m.zip")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
