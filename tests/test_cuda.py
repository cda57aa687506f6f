"""The agents on a CUDA device (skipped where there is none): PPO and SAC train there, their hand-written
gradients agree with autograd there too, a model saved on the GPU predicts the same on the CPU, and the models
that run on the CPU only (POCA, recurrent PPO) take it for device='auto'; PPO with an MlpPolicy there recommends
the CPU, as SB3's does."""

import warnings

import numpy as np
import pytest
import torch
from envs import SpaceEnv, image_space
from gymnasium import spaces
from test_fast_paths import one_update, sac_pair

from covey import POCA, PPO, SAC
from covey.envs import EarlyExitEnv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def devices(model) -> set[str]:
    return {p.device.type for net in model._networks().values() for p in net.parameters()}


def test_manual_sac_steps_equal_autograd_steps_on_cuda(monkeypatch):
    ours, ref = sac_pair(monkeypatch, "Pendulum-v1", device="cuda")
    assert devices(ours) == {"cuda"} and ours.replay_buffer.sample(4).observations.device.type == "cuda"
    for model in (ours, ref):
        torch.manual_seed(7)
        np.random.seed(7)
        model.train(4, 64)
    for name in ("actor", "critic", "critic_target"):
        for p, q in zip(getattr(ours, name).parameters(), getattr(ref, name).parameters()):
            assert torch.allclose(p, q, atol=1e-5), name
    assert ours.log_ent_coef.item() == pytest.approx(ref.log_ent_coef.item(), abs=1e-6)


def test_manual_ppo_update_equals_autograd_update_on_cuda(monkeypatch):
    ours, _ = one_update(monkeypatch, True, "CartPole-v1", batch_size=32, device="cuda")
    ref, _ = one_update(monkeypatch, False, "CartPole-v1", batch_size=32, device="cuda")
    assert devices(ours) == {"cuda"}
    assert max((p - q).abs().max().item() for p, q in zip(ours._params, ref._params)) < 1e-5


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_trained_on_cuda_then_loaded_on_cpu_predicts_the_same(tmp_path, agent):
    if agent == "PPO":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, seed=0, device="cuda").learn(128)
        obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=64, batch_size=32, seed=0, device="cuda").learn(96)
        obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    assert devices(model) == {"cuda"} and model._n_updates > 0
    expected, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "model.zip")
    loaded = type(model).load(tmp_path / "model.zip", device="cpu")
    assert devices(loaded) == {"cpu"}
    actions, _ = loaded.predict(obs, deterministic=True)
    if agent == "SAC":
        np.testing.assert_allclose(actions, expected, atol=1e-5)
    else:
        np.testing.assert_array_equal(actions, expected)


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_critic_ema_trains_on_cuda(agent):
    kwargs = dict(policy_kwargs=dict(critic_ema_decay=0.9), seed=0, device="cuda")
    if agent == "PPO":
        model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, **kwargs).learn(128)
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=64, batch_size=32, **kwargs).learn(96)
    assert devices(model) == {"cuda"} and model._n_updates > 0


def test_poca_and_recurrent_ppo_pick_the_cpu_for_auto():
    poca = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(64)
    recurrent = PPO("MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0).learn(64)
    for model in (poca, recurrent):
        assert model.device.type == "cpu" and devices(model) == {"cpu"} and model._n_updates > 0
    with pytest.raises(ValueError, match="runs on the CPU only"):
        POCA("MlpPolicy", EarlyExitEnv, n_envs=2, seed=0, device="cuda")


def test_ppo_with_an_mlp_policy_on_cuda_recommends_the_cpu():
    with pytest.warns(UserWarning, match=r"PPO with an MlpPolicy on cuda.*Pass device='cpu'"):
        model = PPO("MlpPolicy", "CartPole-v1", device="cuda")
    assert model.device.type == "cuda"  # a recommendation: the model stays where it was asked for
    image_env = SpaceEnv(image_space((36, 36, 3)), spaces.Discrete(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPO("MlpPolicy", "CartPole-v1", device="cpu")
        PPO("CnnPolicy", image_env, device="cuda")
        SAC("MlpPolicy", "Pendulum-v1", device="cuda")
