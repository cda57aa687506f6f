"""sb3-contrib's RecurrentPPO files and weights in covey's PPO with memory, and back: the same LSTM layers under
other names, so a trained RecurrentPPO model acts, values and trains on in covey as it did in sb3-contrib."""

from __future__ import annotations

import io
import json
import sys
import warnings
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from sb3_contrib import RecurrentPPO
from test_sb3_files import assert_same_optimizer_states, no_unpickling  # noqa: F401 (a fixture)

from covey import PPO, SAC
from covey.agents import file_agent, load
from covey.serialization import ModelFileError

SMALL = dict(n_steps=16, batch_size=16, n_epochs=1, seed=0)


class ImageEnv(gym.Env):
    """Channel-last images (and a vector beside them, for the Dict variant) with 3 actions."""

    def __init__(self, with_vector: bool = False) -> None:
        image = spaces.Box(0, 255, (36, 36, 3), np.uint8)
        vector = spaces.Box(-1.0, 1.0, (5,), np.float32)
        self.observation_space = spaces.Dict({"image": image, "vector": vector}) if with_vector else image
        self.action_space = spaces.Discrete(3)
        self._steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._steps = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self._steps += 1
        return self.observation_space.sample(), float(action == 1), False, self._steps >= 8, {}


def trained_rppo(policy: str, env, **policy_kwargs) -> RecurrentPPO:
    model = RecurrentPPO(policy, env, **SMALL, policy_kwargs=policy_kwargs or None)
    return model.learn(32)  # the weights and Adam's moments moved from their start


def batch(space: spaces.Space, n: int, rng: np.random.Generator):
    space.seed(int(rng.integers(1 << 30)))
    samples = [space.sample() for _ in range(n)]
    if isinstance(space, spaces.Dict):
        return {key: np.stack([s[key] for s in samples]) for key in space.spaces}
    return np.stack(samples)


def assert_same_recurrent_policy(ours, theirs, n_envs: int = 3, steps: int = 6) -> None:
    """Step both models over the same observations with episode starts (at the first step, and one env's in the
    middle): the same deterministic actions, the same actor memories, and the same values from the critics'
    memories."""
    rng = np.random.default_rng(0)
    space = theirs.observation_space
    hidden = theirs.policy.lstm_actor.hidden_size
    critic_state = tuple(torch.randn(1, n_envs, hidden) for _ in range(2))
    state_theirs = state_ours = tuple(torch.randn(1, n_envs, hidden).numpy() for _ in range(2))
    for t in range(steps):
        obs = batch(space, n_envs, rng)
        starts = np.zeros(n_envs, bool)
        starts[:] = t == 0
        starts[1] |= t == 3
        action_theirs, state_theirs = theirs.predict(obs, state_theirs, starts, deterministic=True)
        action_ours, state_ours = ours.predict(obs, state_ours, starts, deterministic=True)
        np.testing.assert_allclose(action_ours, action_theirs, rtol=1e-5, atol=1e-5)
        for mine, expected in zip(state_ours, state_theirs):
            np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            tensor, _ = theirs.policy.obs_to_tensor(obs)
            values = theirs.policy.predict_values(tensor, critic_state, torch.as_tensor(starts, dtype=torch.float32))
            raw, next_critic_state = ours.policy.critic.raw_step(
                ours.policy.obs_to_tensor(obs)[0], critic_state, torch.as_tensor(starts)
            )
            torch.testing.assert_close(ours.policy.critic.value_head.value(raw).reshape(-1), values.reshape(-1))
        critic_state = next_critic_state


@pytest.mark.cpu
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_loads_a_recurrent_ppo_file_as_sb3_contrib_does(tmp_path, no_unpickling, env_id):  # noqa: F811
    theirs = trained_rppo("MlpLstmPolicy", env_id, lstm_hidden_size=16, net_arch=[16])
    theirs.save(tmp_path / "rppo.zip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out, optimizer states included
        ours = PPO.load(tmp_path / "rppo.zip")
    assert ours.policy_name == "MlpLstmPolicy" and ours.policy.actor.memory.hidden_size == 16
    assert ours.policy.actor.memory.kind == "lstm" and ours.policy.critic.memory is not None
    for name in ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "seed"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.num_timesteps == theirs.num_timesteps == 32
    assert_same_recurrent_policy(ours, theirs)
    assert_same_optimizer_states(ours, theirs)  # training goes on with sb3-contrib's Adam moments
    ours.set_env(theirs.get_env())
    ours.learn(16, reset_num_timesteps=False)
    assert ours.num_timesteps == 48


@pytest.mark.cpu
def test_a_recurrent_ppo_files_memory_size_is_read_off_its_weights(tmp_path):
    """sb3-contrib's default LSTM has 256 units and its file's policy_kwargs say nothing of it (covey's default
    is 128): the size comes from the weights."""
    theirs = trained_rppo("MlpLstmPolicy", "CartPole-v1", net_arch=[8])
    theirs.save(tmp_path / "rppo.zip")
    data = json.loads(zipfile.ZipFile(tmp_path / "rppo.zip").read("data"))
    assert "lstm_hidden_size" not in data["policy_kwargs"]
    ours = PPO.load(tmp_path / "rppo.zip")
    assert ours.policy.actor.memory.hidden_size == ours.policy.critic.memory.hidden_size == 256
    assert_same_recurrent_policy(ours, theirs, steps=3)


@pytest.mark.cpu
@pytest.mark.parametrize("policy", ["CnnLstmPolicy", "MultiInputLstmPolicy"])
def test_ppo_loads_recurrent_ppo_files_of_images(tmp_path, policy):
    env = ImageEnv(with_vector=policy == "MultiInputLstmPolicy")
    extractor = dict(cnn_output_dim=16) if policy == "MultiInputLstmPolicy" else dict(features_dim=16)
    theirs = trained_rppo(policy, env, lstm_hidden_size=8, net_arch=[8], features_extractor_kwargs=extractor)
    theirs.save(tmp_path / "rppo.zip")
    ours = PPO.load(tmp_path / "rppo.zip", env=env)
    assert ours.policy_name == policy
    assert_same_recurrent_policy(ours, theirs, n_envs=2, steps=4)
    assert_same_optimizer_states(ours, theirs)


@pytest.mark.parametrize(
    "policy_kwargs, named",
    [
        (dict(n_lstm_layers=2), "n_lstm_layers > 1: covey's memory has one layer"),
        (dict(shared_lstm=True, enable_critic_lstm=False), "shared_lstm=True"),
        (dict(enable_critic_lstm=False), "enable_critic_lstm=False"),
        (dict(lstm_kwargs=dict(dropout=0.0)), "lstm_kwargs={'dropout': 0.0}"),
    ],
)
def test_recurrent_ppo_files_of_settings_covey_lacks_are_refused_by_name(tmp_path, policy_kwargs, named):
    RecurrentPPO("MlpLstmPolicy", "CartPole-v1", **SMALL, policy_kwargs=dict(lstm_hidden_size=8, **policy_kwargs)).save(
        tmp_path / "rppo.zip"
    )
    with pytest.raises(ModelFileError, match="holds an sb3-contrib RecurrentPPO model with ") as raised:
        PPO.load(tmp_path / "rppo.zip")
    assert named in str(raised.value) and "Load it with sb3_contrib.RecurrentPPO.load." in str(raised.value)


def test_a_recurrent_ppo_file_is_covey_ppos(tmp_path):
    """The file's agent is PPO: SAC.load names PPO.load, and covey's load (and so the CLI) picks PPO."""
    RecurrentPPO("MlpLstmPolicy", "CartPole-v1", **SMALL, policy_kwargs=dict(lstm_hidden_size=8)).save(
        tmp_path / "rppo.zip"
    )
    with pytest.raises(ModelFileError, match=r"holds an sb3-contrib RecurrentPPO model; load it with covey\.PPO\.load"):
        SAC.load(tmp_path / "rppo.zip")
    assert file_agent(tmp_path / "rppo.zip") == "PPO"
    model = load(tmp_path / "rppo.zip")
    assert isinstance(model, PPO) and model.policy_name == "MlpLstmPolicy"


@pytest.mark.cpu
def test_without_sb3_contrib_a_recurrent_ppo_file_loads_its_weights_and_says_what_it_left(tmp_path, monkeypatch):
    """Reading the file needs nothing of sb3-contrib; moving the optimizer's state to covey's order needs its
    policy's parameter order, so without it the optimizer starts afresh, with a warning that says how to keep it."""
    theirs = trained_rppo("MlpLstmPolicy", "CartPole-v1", lstm_hidden_size=8, net_arch=[8])
    theirs.save(tmp_path / "rppo.zip")
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)  # import sb3_contrib raises ImportError
    with pytest.warns(UserWarning, match="optimizer states are not copied.*pip install sb3-contrib"):
        ours = PPO.load(tmp_path / "rppo.zip")
    assert_same_recurrent_policy(ours, theirs)
    with pytest.raises(ValueError, match="sb3-contrib's RecurrentPPO.*pip install sb3-contrib"):
        ours.get_sb3_parameters()


@pytest.mark.cpu
def test_set_parameters_takes_a_recurrent_ppo_models_parameters():
    theirs = trained_rppo("MlpLstmPolicy", "CartPole-v1", lstm_hidden_size=8, net_arch=[8])
    ours = PPO("MlpLstmPolicy", "CartPole-v1", **SMALL, policy_kwargs=dict(lstm_hidden_size=8, net_arch=[8]))
    ours.set_parameters(theirs.get_parameters())
    assert_same_recurrent_policy(ours, theirs)
    assert_same_optimizer_states(ours, theirs)


@pytest.mark.cpu
def test_a_ppo_with_memory_goes_to_sb3_contribs_recurrent_ppo_and_back(tmp_path):
    """``to_sb3_model`` of a PPO with LSTM memory is sb3-contrib's RecurrentPPO (a memory given as covey's
    ``policy_kwargs`` memory too), which acts as covey's and writes a file covey loads back; a GRU has no
    counterpart there."""
    env = gym.make("CartPole-v1")
    ours = PPO("MlpPolicy", env, **SMALL, policy_kwargs=dict(memory=dict(hidden_size=8, sequence_length=4)))
    ours.learn(32)
    theirs = ours.to_sb3_model()
    assert isinstance(theirs, RecurrentPPO) and theirs.policy.lstm_actor.hidden_size == 8
    assert theirs.num_timesteps == 32 and theirs.n_steps == 16
    assert_same_recurrent_policy(ours, theirs)
    file = io.BytesIO()
    theirs.save(file)
    file.seek(0)
    back = PPO.load(file)
    assert back.policy_name == "MlpLstmPolicy"
    assert_same_recurrent_policy(back, theirs)
    assert_same_optimizer_states(back, theirs)
    gru = PPO("MlpLstmPolicy", env, **SMALL, policy_kwargs=dict(memory=dict(kind="gru", hidden_size=8)))
    with pytest.raises(ValueError, match="memory is a GRU; sb3-contrib's RecurrentPPO has LSTMs only"):
        gru.to_sb3_model()


def test_covey_export_sb3_of_a_ppo_with_memory_is_checked_as_recurrent_ppo_over_steps(tmp_path, capsys):
    """``covey export --sb3`` writes sb3-contrib's RecurrentPPO file of a PPO with memory, names that class, and
    checks the file with its load over several steps with the memories carried: a first step from a fresh memory
    never reads the LSTMs' hidden-to-hidden weights, so a file with wrong ones passed a one-step check."""
    from covey.cli.commands import _export_sb3

    model = PPO("MlpLstmPolicy", "CartPole-v1", **SMALL, policy_kwargs=dict(lstm_hidden_size=8, net_arch=[8]))
    model.learn(32)
    assert _export_sb3(model, tmp_path / "m.zip", tmp_path / "m_sb3.zip") == 0
    out = capsys.readouterr().out
    assert "(sb3-contrib RecurrentPPO)" in out
    assert "verified: True (sb3_contrib.RecurrentPPO.load of it against model.predict on 4 steps" in out
    assert isinstance(RecurrentPPO.load(tmp_path / "m_sb3.zip"), RecurrentPPO)
    to_sb3_model = model.to_sb3_model

    def wrong_memory_weights(*args, **kwargs):
        sb3_model = to_sb3_model(*args, **kwargs)
        with torch.no_grad():
            sb3_model.policy.lstm_actor.weight_hh_l0.mul_(-1.0)
        return sb3_model

    model.to_sb3_model = wrong_memory_weights
    assert _export_sb3(model, tmp_path / "m.zip", tmp_path / "bad_sb3.zip") != 0
    assert "verified: False" in capsys.readouterr().out
