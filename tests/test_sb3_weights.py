"""An SB3 user brings a trained model over: ``covey_model.set_parameters(sb3_model.get_parameters())`` copies
SB3's PPO and SAC ``MlpPolicy`` weights and optimizer states, after which covey's model acts, values and scores
actions exactly as SB3's; what cannot be copied (CNN extractors, other sizes, another optimizer's state) is said
clearly. The way back, ``sb3_model.set_parameters(model.get_sb3_parameters())``, gives SB3's model covey's numbers
and optimizer states."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import stable_baselines3
import torch
from envs import SpaceEnv, image_space
from gymnasium import spaces
from stable_baselines3 import HerReplayBuffer
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.utils import LinearSchedule

import covey


def trained_pair(name: str, env_id: str, **kwargs):
    """An SB3 model trained a little (so that its weights are not an initialization) and a fresh covey model
    with the same settings and another seed."""
    sb3_model = getattr(stable_baselines3, name)("MlpPolicy", env_id, seed=0, **kwargs).learn(256)
    model = getattr(covey, name)("MlpPolicy", env_id, seed=1, **kwargs)
    return sb3_model, model


def observations(space: spaces.Box, n: int = 32) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (n, *space.shape)).astype(np.float32)


@pytest.mark.cpu
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_takes_sb3s_weights_and_acts_values_and_scores_as_sb3(env_id):
    sb3_model, model = trained_pair("PPO", env_id, n_steps=64, batch_size=64, n_epochs=2)
    obs = observations(model.observation_space)
    assert not np.allclose(model.predict(obs, deterministic=True)[0], sb3_model.predict(obs, deterministic=True)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_parameters(sb3_model.get_parameters())
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], sb3_model.predict(obs, deterministic=True)[0], rtol=1e-5, atol=1e-6
    )
    obs_t = torch.as_tensor(obs)
    with torch.no_grad():
        actions = sb3_model.policy(obs_t)[0]
        sb3_values, sb3_log_prob, sb3_entropy = sb3_model.policy.evaluate_actions(obs_t, actions)
        values, log_prob, entropy = model.policy.evaluate_actions(obs_t, actions)
    torch.testing.assert_close(values, sb3_values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_prob, sb3_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, sb3_entropy, rtol=1e-5, atol=1e-5)


@pytest.mark.cpu
def test_sac_takes_sb3s_weights_and_acts_and_values_as_sb3():
    sb3_model, model = trained_pair("SAC", "Pendulum-v1", learning_starts=64, batch_size=32)
    obs = observations(model.observation_space)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_parameters(sb3_model.get_parameters())
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], sb3_model.predict(obs, deterministic=True)[0], rtol=1e-5, atol=1e-6
    )
    obs_t = torch.as_tensor(obs)
    actions = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (32, 1)).astype(np.float32))
    with torch.no_grad():
        for ours, theirs in ((model.critic, sb3_model.critic), (model.critic_target, sb3_model.critic_target)):
            for q, sb3_q in zip(ours(obs_t, actions), theirs(obs_t, actions), strict=True):
                torch.testing.assert_close(q, sb3_q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("half", ["actor.mu", "actor.log_std"])
def test_sac_takes_one_of_sb3s_mean_and_log_std_layers_alone_as_sb3(half):
    """covey's actor keeps SB3's mean and log-std layers as one head layer: SB3 parameters with one of them
    (exact_match=False, as an evolution-strategy loop over the actor passes) load that half and keep the other,
    where a KeyError came from the renaming."""
    sb3_model, model = trained_pair("SAC", "Pendulum-v1", learning_starts=64, batch_size=32)
    model.set_parameters(sb3_model.get_parameters())
    rng = np.random.default_rng(3)
    part = {
        f"{half}.{kind}": torch.as_tensor(rng.normal(0, 0.3, (1, 256) if kind == "weight" else (1,))).float()
        for kind in ("weight", "bias")
    }
    for m in (model, sb3_model):
        m.set_parameters({"policy": part}, exact_match=False)
    obs = observations(model.observation_space)
    for deterministic in (True, False):  # stochastic: the log-std half shows in the spread of the actions
        torch.manual_seed(0)
        ours = model.predict(obs, deterministic=deterministic)[0]
        torch.manual_seed(0)
        theirs = sb3_model.predict(obs, deterministic=deterministic)[0]
        if deterministic:
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.actor.mu.weight, sb3_model.actor.mu.weight)
    torch.testing.assert_close(model.actor.log_std.bias, sb3_model.actor.log_std.bias)
    torch.testing.assert_close(getattr(model.actor, half.split(".")[1]).weight, part[f"{half}.weight"])


@pytest.mark.cpu
def test_sac_actor_and_critic_internals_answer_as_sb3s():
    """SB3 SAC's actor.get_action_dist_params, actor.latent_pi, critic.q_networks and critic.set_training_mode,
    which scripts probing a trained SAC use (AttributeErrors before), give SB3's numbers on SB3's weights."""
    sb3_model, model = trained_pair("SAC", "Pendulum-v1", learning_starts=64, batch_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_parameters(sb3_model.get_parameters())
    obs = torch.as_tensor(observations(model.observation_space))
    with torch.no_grad():
        ours, theirs = model.actor.get_action_dist_params(obs), sb3_model.actor.get_action_dist_params(obs)
        for a, b in zip(ours[:2], theirs[:2], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert ours[2] == theirs[2] == {}
        torch.testing.assert_close(model.actor.latent_pi(obs), sb3_model.actor.latent_pi(obs), rtol=1e-5, atol=1e-5)
        x = torch.cat([obs, torch.tanh(ours[0])], dim=1)
        for q, sb3_q in zip(model.critic.q_networks, sb3_model.critic.q_networks, strict=True):
            torch.testing.assert_close(q(x), sb3_q(x), rtol=1e-5, atol=1e-5)
    assert len(list(model.critic.q_networks[0].parameters())) == len(list(sb3_model.critic.q_networks[0].parameters()))
    model.critic.set_training_mode(False)
    assert not model.critic.training and not model.critic.qs[0].training
    with pytest.raises(TypeError, match="get_distribution"):
        covey.PPO("MlpPolicy", "Pendulum-v1").actor.get_action_dist_params(obs)

    # gSDE: SB3's exploration parameter and the latent as keyword argument
    sde, sb3_sde = (lib.SAC("MlpPolicy", "Pendulum-v1", use_sde=True) for lib in (covey, stable_baselines3))
    with torch.no_grad():
        ours, theirs = sde.actor.get_action_dist_params(obs), sb3_sde.actor.get_action_dist_params(obs)
        assert [t.shape for t in ours[:2]] == [t.shape for t in theirs[:2]]
        assert ours[1] is sde.actor.log_std
        torch.testing.assert_close(ours[2]["latent_sde"], sde.actor.latent_pi(obs))
        assert set(ours[2]) == set(theirs[2]) == {"latent_sde"}


@pytest.mark.parametrize(
    "action_space",
    [spaces.Discrete(4), spaces.Box(-1, 1, (2, 3), np.float32), spaces.MultiDiscrete([2, 3]), spaces.MultiBinary(4)],
    ids=["Discrete", "Box", "MultiDiscrete", "MultiBinary"],
)
def test_the_distribution_has_sb3s_action_dim_or_action_dims(action_space):
    """``policy.get_distribution(obs).action_dim`` (``action_dims`` for MultiCategorical and Bernoulli), as SB3's
    distribution objects name them (AttributeErrors before); the name SB3 lacks is absent here too."""
    obs_space = spaces.Box(-1, 1, (3,), np.float32)
    found = []
    for lib in (stable_baselines3, covey):
        policy = lib.PPO("MlpPolicy", SpaceEnv(obs_space, action_space), n_steps=8, batch_size=8).policy
        dist = policy.get_distribution(policy.obs_to_tensor(np.zeros((2, 3), np.float32))[0])
        found.append([getattr(dist, name, None) for name in ("action_dim", "action_dims")])
    assert found[1] == found[0]


@pytest.mark.parametrize("sde_kwargs", [{}, {"use_expln": True, "log_std_init": 0.5}])
def test_sac_actor_get_std_is_sb3s(sde_kwargs):
    """SAC's actor.get_std() with gSDE (SB3's train() logs it): the exploration weights' standard deviations, as
    SB3 computes them from the same log-std (with use_expln too)."""
    kwargs = dict(use_sde=True, policy_kwargs=sde_kwargs)
    sb3_model = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", **kwargs)
    model = covey.SAC("MlpPolicy", "Pendulum-v1", **kwargs)
    with torch.no_grad():
        model.actor.log_std.copy_(torch.randn_like(model.actor.log_std))
        sb3_model.actor.log_std.copy_(model.actor.log_std)
        torch.testing.assert_close(model.actor.get_std(), sb3_model.actor.get_std())
    with pytest.raises(ValueError, match="only available with state-dependent exploration"):
        covey.SAC("MlpPolicy", "Pendulum-v1").actor.get_std()


def test_the_policy_alone_copies_without_a_warning():
    sb3_model, model = trained_pair("PPO", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1)
    obs = observations(model.observation_space)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_parameters({"policy": sb3_model.policy.state_dict()})
    ours, theirs = (m.predict(obs, deterministic=True)[0] for m in (model, sb3_model))
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.cpu
@pytest.mark.parametrize("share", [True, False])
def test_mlp_extractor_and_extract_features_are_sb3s(share):
    """``policy.mlp_extractor`` and ``policy.extract_features`` answer as SB3's once the weights are SB3's: the
    same parameter names and shapes, latent sizes, latent features, and a pair of features when unshared."""
    kwargs = dict(n_steps=64, batch_size=64, n_epochs=1, policy_kwargs=dict(net_arch=[32, 16]))
    if not share:
        kwargs["policy_kwargs"]["share_features_extractor"] = False
    sb3_model, model = trained_pair("PPO", "CartPole-v1", **kwargs)
    model.set_parameters({"policy": sb3_model.policy.state_dict()})
    ours, theirs = model.policy.mlp_extractor, sb3_model.policy.mlp_extractor
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert (ours.latent_dim_pi, ours.latent_dim_vf) == (theirs.latent_dim_pi, theirs.latent_dim_vf) == (16, 16)
    obs = torch.as_tensor(observations(model.observation_space))
    with torch.no_grad():
        features, sb3_features = model.policy.extract_features(obs), sb3_model.policy.extract_features(obs)
        assert isinstance(features, tuple) == isinstance(sb3_features, tuple) == (not share)
        features, sb3_features = (features, sb3_features) if not share else ((features,) * 2, (sb3_features,) * 2)
        for x, y in zip(features, sb3_features, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        latents = ours.forward_actor(features[0]), ours.forward_critic(features[1])
        sb3_latents = theirs.forward_actor(sb3_features[0]), theirs.forward_critic(sb3_features[1])
        for x, y in zip(latents, sb3_latents, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        for x, y in zip(ours(features[0]), theirs(sb3_features[0]), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    # A view of the policy's own modules: nothing is added to the policy's parameters or state_dict.
    assert ours.policy_net is model.actor.trunk and ours.value_net is model.critic.trunk
    assert not any("mlp_extractor" in k for k in model.policy.state_dict())


@pytest.mark.parametrize("share", [True, False])
def test_cnn_policy_weights_copy_into_covey_nature_cnn(share):
    """SB3's NatureCNN is covey's (``cnn`` named ``convs``): a CnnPolicy copies, shared encoder or not."""
    env = SpaceEnv(image_space((36, 36, 3)), spaces.Discrete(3))
    kwargs = dict(n_steps=16, batch_size=16, policy_kwargs=dict(share_features_extractor=share))
    sb3_model = stable_baselines3.PPO("CnnPolicy", env, seed=0, **kwargs)
    model = covey.PPO("CnnPolicy", env, seed=1, **kwargs)
    model.set_parameters({"policy": sb3_model.policy.state_dict()})
    frames = np.random.default_rng(0).integers(0, 256, (8, 36, 36, 3), dtype=np.uint8)
    with torch.no_grad():
        sb3_obs, ours = sb3_model.policy.obs_to_tensor(frames)[0], model.policy.obs_to_tensor(frames)[0]
        torch.testing.assert_close(model.policy.predict_values(ours), sb3_model.policy.predict_values(sb3_obs))
        logits = model.policy.get_distribution(ours).distribution.logits
        torch.testing.assert_close(logits, sb3_model.policy.get_distribution(sb3_obs).distribution.logits)


@pytest.mark.cpu
@pytest.mark.parametrize("share", [False, True])
def test_sac_cnn_policy_weights_copy(share):
    """SB3's SAC CnnPolicy (with share_features_extractor too: one CNN for actor and critics), weights copied:
    the same actions, Q values and target Q values."""
    env = SpaceEnv(image_space((36, 36, 1)), spaces.Box(-1, 1, (2,), np.float32))
    kwargs = dict(buffer_size=100, policy_kwargs=dict(share_features_extractor=share))
    sb3_model = stable_baselines3.SAC("CnnPolicy", env, seed=0, **kwargs)
    model = covey.SAC("CnnPolicy", env, seed=1, **kwargs)
    assert (model.critic.encoder is model.actor.encoder) == share
    model.set_parameters({"policy": sb3_model.policy.state_dict()})
    frames = np.random.default_rng(0).integers(0, 256, (8, 36, 36, 1), dtype=np.uint8)
    actions = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (8, 2)).astype(np.float32))
    np.testing.assert_allclose(
        model.predict(frames, deterministic=True)[0], sb3_model.predict(frames, deterministic=True)[0], atol=1e-5
    )
    with torch.no_grad():
        sb3_obs, ours = sb3_model.policy.obs_to_tensor(frames)[0], model.policy.obs_to_tensor(frames)[0]
        for critic, sb3_critic in ((model.critic, sb3_model.critic), (model.critic_target, sb3_model.critic_target)):
            for q, sb3_q in zip(critic(ours, actions), sb3_critic(sb3_obs, actions), strict=True):
                torch.testing.assert_close(q, sb3_q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, action_space, kwargs",
    [
        ("PPO", spaces.Discrete(3), {}),
        ("PPO", spaces.Box(-1, 1, (2,), np.float32), dict(use_sde=True, policy_kwargs=dict(net_arch=[]))),
        ("SAC", spaces.Box(-1, 1, (2,), np.float32), {}),
    ],
    ids=["PPO", "PPO gSDE without hidden layers", "SAC"],
)
def test_mlp_policy_weights_on_channel_last_images_copy(name, action_space, kwargs):
    """SB3 moves channel-last images' channels first before its MlpPolicy flattens them, covey flattens them as
    they come: the first layers take SB3's columns reordered, so the copy acts and values as SB3's does."""
    env = SpaceEnv(image_space((6, 5, 3)), action_space)
    sb3_model = getattr(stable_baselines3, name)("MlpPolicy", env, seed=0, **kwargs)
    model = getattr(covey, name)("MlpPolicy", env, seed=1, **kwargs)
    assert model.observation_space.shape == (6, 5, 3)  # covey keeps the layout
    model.set_parameters({"policy": sb3_model.policy.state_dict()}, exact_match=False)
    frames = np.random.default_rng(0).integers(0, 256, (16, 6, 5, 3), dtype=np.uint8)
    np.testing.assert_allclose(
        model.predict(frames, deterministic=True)[0], sb3_model.predict(frames, deterministic=True)[0], atol=1e-5
    )
    with torch.no_grad():
        sb3_obs, ours = sb3_model.policy.obs_to_tensor(frames)[0], model.policy.obs_to_tensor(frames)[0]
        if name == "PPO":
            torch.testing.assert_close(model.policy.predict_values(ours), sb3_model.policy.predict_values(sb3_obs))
            actions = torch.as_tensor(np.stack([action_space.sample() for _ in range(16)]))
            torch.testing.assert_close(
                model.policy.evaluate_actions(ours, actions)[1], sb3_model.policy.evaluate_actions(sb3_obs, actions)[1]
            )
        else:
            actions = torch.as_tensor(np.random.default_rng(1).uniform(-1, 1, (16, 2)).astype(np.float32))
            for q, sb3_q in zip(model.critic(ours, actions), sb3_model.critic(sb3_obs, actions), strict=True):
                torch.testing.assert_close(q, sb3_q, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lib", [stable_baselines3, covey])
def test_parameters_that_do_not_fit_raise_what_sb3s_raise(lib):
    """A state dict of other widths in set_parameters and a vector too short for load_from_vector raise a
    RuntimeError in SB3 (torch's), and one in covey too, so a script's ``except RuntimeError`` catches covey's
    clearer error (a ValueError as well)."""
    other = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[32]))
    model = lib.PPO("MlpPolicy", "CartPole-v1")
    with pytest.raises(RuntimeError, match="size mismatch"):
        model.set_parameters({"policy": other.policy.state_dict()}, exact_match=False)
    vector = model.policy.parameters_to_vector()
    with pytest.raises(RuntimeError):
        model.policy.load_from_vector(vector[:-1])
    if lib is covey:
        with pytest.raises(ValueError, match=r"Parameters for 'policy' do not fit this model"):
            model.set_parameters({"policy": other.policy.state_dict()}, exact_match=False)
        with pytest.raises(ValueError, match=r"this policy has \d+ parameters"):
            model.policy.load_from_vector(vector[:-1])


def test_what_cannot_be_copied_is_refused_clearly():
    sb3_model = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[32]))
    model = covey.PPO("MlpPolicy", "CartPole-v1")
    with pytest.raises(ValueError, match=r"Parameters for 'policy' do not fit this model"):
        model.set_parameters({"policy": sb3_model.policy.state_dict()})

    # a features extractor of the user's (SB3's features_extractor_class) has no counterpart in covey
    class Custom(BaseFeaturesExtractor):
        def __init__(self, observation_space):
            super().__init__(observation_space, features_dim=8)
            self.net = torch.nn.Linear(4, 8)

        def forward(self, obs):
            return self.net(obs)

    custom = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(features_extractor_class=Custom))
    with pytest.raises(
        ValueError, match=r"features_extractor.net.weight' .* no counterpart .* MlpPolicy, CnnPolicy and MultiInput"
    ):
        model.set_parameters({"policy": custom.policy.state_dict()})


@pytest.mark.parametrize("name", ["PPO", "SAC"])
@pytest.mark.parametrize("share", [True, False])
def test_multi_input_policy_weights_with_images_copy_into_covey_dict_encoder(name, share):
    """SB3's CombinedExtractor is covey's DictEncoder: a NatureCNN per image key (channel-last here, which SB3
    transposes and covey's NatureCNN permutes) and flattening for the others, in the space's key order. An SB3
    MultiInputPolicy's weights copy: the same actions, and PPO's values or SAC's Q values."""
    space = spaces.Dict(
        {"image": image_space((36, 36, 3)), "vector": spaces.Box(-1, 1, (3,), np.float32), "d": spaces.Discrete(4)}
    )
    box = spaces.Box(-1, 1, (2,), np.float32)
    env = SpaceEnv(space, box)
    kwargs = dict(policy_kwargs=dict(share_features_extractor=share))
    kwargs.update(dict(n_steps=16, batch_size=16) if name == "PPO" else dict(buffer_size=100))
    sb3_model = getattr(stable_baselines3, name)("MultiInputPolicy", env, seed=0, **kwargs)
    model = getattr(covey, name)("MultiInputPolicy", env, seed=1, **kwargs)
    model.set_parameters({"policy": sb3_model.policy.state_dict()})
    rng = np.random.default_rng(0)
    obs = {
        "image": rng.integers(0, 256, (8, 36, 36, 3), dtype=np.uint8),
        "vector": rng.uniform(-1, 1, (8, 3)).astype(np.float32),
        "d": rng.integers(0, 4, 8),
    }
    actions = torch.as_tensor(rng.uniform(-1, 1, (8, 2)).astype(np.float32))
    np.testing.assert_allclose(
        model.predict(obs, deterministic=True)[0], sb3_model.predict(obs, deterministic=True)[0], atol=1e-5
    )
    with torch.no_grad():
        sb3_obs, ours = sb3_model.policy.obs_to_tensor(obs)[0], model.policy.obs_to_tensor(obs)[0]
        if name == "PPO":
            torch.testing.assert_close(model.policy.predict_values(ours), sb3_model.policy.predict_values(sb3_obs))
            return
        for critic, sb3_critic in ((model.critic, sb3_model.critic), (model.critic_target, sb3_model.critic_target)):
            for q, sb3_q in zip(critic(ours, actions), sb3_critic(sb3_obs, actions), strict=True):
                torch.testing.assert_close(q, sb3_q, rtol=1e-5, atol=1e-5)


def test_multi_input_policy_weights_see_the_dict_keys_in_sb3s_order():
    """Dict observations are flattened key by key in SB3's order (and Discrete parts one-hot), so the first
    layer's copied weights read the same features."""
    space = spaces.Dict(
        {"b": spaces.Box(-1, 1, (3,), np.float32), "a": spaces.Box(-1, 1, (2,), np.float32), "c": spaces.Discrete(4)}
    )
    env = SpaceEnv(space, spaces.Discrete(3))
    sb3_model = stable_baselines3.PPO("MultiInputPolicy", env, n_steps=16, batch_size=16, seed=0)
    model = covey.PPO("MultiInputPolicy", env, n_steps=16, batch_size=16, seed=1)
    model.set_parameters({"policy": sb3_model.policy.state_dict()})
    rng = np.random.default_rng(0)
    obs = {"a": rng.uniform(-1, 1, (50, 2)), "b": rng.uniform(-1, 1, (50, 3)), "c": rng.integers(0, 4, 50)}
    obs = {k: v.astype(np.float32) if k != "c" else v for k, v in obs.items()}
    with torch.no_grad():
        sb3_obs, ours = sb3_model.policy.obs_to_tensor(obs)[0], model.policy.obs_to_tensor(obs)[0]
        torch.testing.assert_close(model.policy.predict_values(ours), sb3_model.policy.predict_values(sb3_obs))
        logits = model.policy.get_distribution(ours).distribution.logits
        torch.testing.assert_close(logits, sb3_model.policy.get_distribution(sb3_obs).distribution.logits)


# ---------------------------------------------------------------------------- the way back: covey's weights into SB3
def _perturbed(model):
    """``model`` with every weight moved off its initialization (so that no copy can match by chance)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


def _sb3_optimizers(model) -> dict[str, torch.optim.Optimizer]:
    """The optimizers SB3's model of this kind saves, by SB3's names, in an SB3 model or a covey one."""
    if isinstance(model, (stable_baselines3.PPO, covey.PPO)):
        return {"policy.optimizer": model.policy.optimizer}
    optimizers = {"actor.optimizer": model.actor.optimizer, "critic.optimizer": model.critic.optimizer}
    if model.ent_coef_optimizer is not None:
        optimizers["ent_coef_optimizer"] = model.ent_coef_optimizer
    return optimizers


def _moments_of_the_weights(optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """One Adam step of each optimizer with every parameter's own value for its gradient, the values then put
    back: each parameter's moments are 0.1 and 0.001 times its value (squared), step 1."""
    for optimizer in optimizers.values():
        params = [p for group in optimizer.param_groups for p in group["params"]]
        values = [p.detach().clone() for p in params]
        for p, value in zip(params, values, strict=True):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.copy_(value)
        optimizer.step()
        with torch.no_grad():
            for p, value in zip(params, values, strict=True):
                p.copy_(value)


def _outputs(name: str, model, obs, actions) -> list[torch.Tensor]:
    """What a trained model is used for, on SB3's calls: the deterministic actions, and PPO's values, log-probs and
    entropies of ``actions``, or SAC's Q values of ``actions`` (critics and target critics)."""
    with torch.no_grad():
        out = [torch.as_tensor(model.predict(obs, deterministic=True)[0]).float()]
        obs_t = model.policy.obs_to_tensor(obs)[0]
        if name == "PPO":
            return out + [t.reshape(-1) for t in model.policy.evaluate_actions(obs_t, actions)]
        return out + [q for critic in (model.critic, model.critic_target) for q in critic(obs_t, actions)]


IMAGE_AND_VECTOR = spaces.Dict({"image": image_space((36, 36, 3)), "vector": spaces.Box(-1, 1, (3,), np.float32)})
WAY_BACK = [
    ("PPO", "MlpPolicy", spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), {}),
    ("PPO", "MlpPolicy", spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (2,), np.float32), dict(use_sde=True)),
    (
        "PPO",
        "MlpPolicy",
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Box(-1, 1, (1,), np.float32),
        dict(policy_kwargs=dict(net_arch=dict(pi=[32], vf=[16, 16]), activation_fn=torch.nn.ReLU)),
    ),
    ("PPO", "CnnPolicy", image_space((36, 36, 3)), spaces.Discrete(3), {}),
    (
        "PPO",
        "CnnPolicy",
        image_space((36, 36, 3)),
        spaces.Discrete(3),
        dict(policy_kwargs=dict(share_features_extractor=False)),
    ),
    ("PPO", "MlpPolicy", image_space((6, 5, 3)), spaces.Discrete(3), {}),
    (
        "PPO",
        "MultiInputPolicy",
        spaces.Dict(
            {
                "b": spaces.Box(-1, 1, (3,), np.float32),
                "a": spaces.Box(-1, 1, (2,), np.float32),
                "c": spaces.Discrete(4),
            }
        ),
        spaces.MultiDiscrete([2, 3]),
        {},
    ),
    ("SAC", "MlpPolicy", spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (2,), np.float32), {}),
    ("SAC", "MlpPolicy", spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32), dict(use_sde=True)),
    (
        "SAC",
        "MlpPolicy",
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Box(-1, 1, (1,), np.float32),
        dict(policy_kwargs=dict(n_critics=3)),
    ),
    (
        "SAC",
        "MlpPolicy",
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Box(-1, 1, (1,), np.float32),
        dict(policy_kwargs=dict(use_sde=False, net_arch=[32])),  # SB3's SAC writes use_sde into the user's dict
    ),
    ("SAC", "CnnPolicy", image_space((36, 36, 1)), spaces.Box(-1, 1, (2,), np.float32), {}),
    (
        "SAC",
        "CnnPolicy",
        image_space((36, 36, 1)),
        spaces.Box(-1, 1, (2,), np.float32),
        dict(policy_kwargs=dict(share_features_extractor=False)),
    ),
    ("SAC", "MlpPolicy", image_space((6, 5, 3)), spaces.Box(-1, 1, (2,), np.float32), {}),
    ("PPO", "MultiInputPolicy", IMAGE_AND_VECTOR, spaces.Discrete(3), {}),
    ("SAC", "MultiInputPolicy", IMAGE_AND_VECTOR, spaces.Box(-1, 1, (2,), np.float32), {}),
]


@pytest.mark.cpu
@pytest.mark.parametrize(
    "name, policy, observation_space, action_space, kwargs",
    WAY_BACK,
    ids=[
        "PPO",
        "PPO gSDE",
        "PPO net_arch dict ReLU",
        "PPO CnnPolicy",
        "PPO CnnPolicy separate extractors",
        "PPO MlpPolicy on images",
        "PPO MultiInputPolicy",
        "SAC",
        "SAC gSDE",
        "SAC three critics",
        "SAC policy_kwargs use_sde",
        "SAC CnnPolicy",
        "SAC CnnPolicy separate extractors",
        "SAC MlpPolicy on images",
        "PPO MultiInputPolicy with an image",
        "SAC MultiInputPolicy with an image",
    ],
)
def test_covey_weights_go_into_an_sb3_model_that_then_acts_values_and_scores_as_covey(
    name, policy, observation_space, action_space, kwargs
):
    """``sb3_model.set_parameters(model.get_sb3_parameters())``: SB3's model of the same settings then gives covey's
    actions, values, log-probs and Q values, and its optimizers hold covey's Adam moments, each parameter's in SB3's
    order; copying back gives covey's weights and optimizer states exactly."""
    env = SpaceEnv(observation_space, action_space)
    kwargs = dict(kwargs, **(dict(n_steps=16, batch_size=16) if name == "PPO" else dict(buffer_size=100)))
    model = _perturbed(getattr(covey, name)(policy, env, seed=0, **kwargs))
    sb3_model = getattr(stable_baselines3, name)(policy, env, seed=1, **kwargs)
    observation_space.seed(0)
    raw = [observation_space.sample() for _ in range(16)]
    obs = {k: np.stack([o[k] for o in raw]) for k in raw[0]} if isinstance(raw[0], dict) else np.stack(raw)
    action_space.seed(1)
    actions = torch.as_tensor(np.stack([action_space.sample() for _ in range(16)])).float()

    _moments_of_the_weights(_sb3_optimizers(model))
    ours = _outputs(name, model, obs, actions)
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(ours, _outputs(name, sb3_model, obs, actions)))
    sb3_model.set_parameters(model.get_sb3_parameters())  # every group SB3's model has: exact_match holds
    for a, b in zip(ours, _outputs(name, sb3_model, obs, actions), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # Each of SB3's optimizers holds, for every parameter in its own order, the moments of that parameter
    theirs = _sb3_optimizers(sb3_model)
    assert theirs.keys() == _sb3_optimizers(model).keys()
    for optimizer_name, optimizer in theirs.items():
        params, state = optimizer.param_groups[0]["params"], optimizer.state_dict()["state"]
        assert sorted(state) == list(range(len(params))), optimizer_name
        for i, p in enumerate(params):
            # SB3's temperature is apart from its parameters: its moments are covey's log_ent_coef's
            weight = model.log_ent_coef if optimizer_name == "ent_coef_optimizer" else p
            torch.testing.assert_close(state[i]["exp_avg"], 0.1 * weight.detach().reshape(p.shape))
            torch.testing.assert_close(state[i]["exp_avg_sq"], 0.001 * weight.detach().reshape(p.shape) ** 2)
            assert state[i]["step"] == 1

    back = _perturbed(getattr(covey, name)(policy, env, seed=2, **kwargs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # weights and optimizer states are copied
        back.set_parameters(sb3_model.get_parameters())
    expected = model.policy.state_dict()
    assert back.policy.state_dict().keys() == expected.keys()
    for key, value in back.policy.state_dict().items():
        assert torch.equal(value, expected[key]), key
    for optimizer_name, optimizer in _sb3_optimizers(back).items():
        mine, original = optimizer.state_dict()["state"], _sb3_optimizers(model)[optimizer_name].state_dict()["state"]
        assert mine.keys() == original.keys(), optimizer_name
        for i, entry in original.items():
            for key, value in entry.items():
                assert torch.equal(mine[i][key], value), (optimizer_name, i, key)


def test_an_sb3_policy_class_model_gives_its_own_weights_back():
    """A covey model of the user's SB3 policy class has SB3's names and parameter order already: its weights and
    its optimizer's state go over as they are."""
    from stable_baselines3.common.policies import ActorCriticPolicy

    class Mine(ActorCriticPolicy):
        pass

    model = _perturbed(covey.PPO(Mine, "CartPole-v1", n_steps=16, batch_size=16, seed=0))
    sb3_model = stable_baselines3.PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, seed=1)
    params = model.get_sb3_parameters()
    assert params.keys() == {"policy", "policy.optimizer"}
    sb3_model.set_parameters(params)
    for key, value in sb3_model.policy.state_dict().items():
        assert torch.equal(value, model.policy.state_dict()[key]), key


def test_networks_sb3_does_not_have_are_refused_with_the_reason():
    from envs import EarlyExitEnv

    cases = [
        (covey.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(value_head="twohot")), r"\['value_head'\]"),
        (covey.SAC("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(value_head="twohot")), r"\['value_head'\]"),
        # an LSTM memory is sb3-contrib's RecurrentPPO's (test_recurrent_ppo_files.py), a GRU nobody's
        (covey.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(memory=dict(kind="gru"))), "memory is a GRU"),
        (covey.POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8), "SB3 has no POCA"),
        (covey.SAC("MlpPolicy", "CartPole-v1"), r"SB3's SAC has Box actions only; this model's are Discrete\(2\)"),
    ]
    for model, message in cases:
        with pytest.raises(ValueError, match=message):
            model.get_sb3_parameters()


# ============================================================================================ a whole SB3 model

TO_SB3 = {
    "PPO": (
        "CartPole-v1",
        dict(
            n_steps=64,
            batch_size=32,
            n_epochs=3,
            gamma=0.97,
            gae_lambda=0.9,
            clip_range=0.3,
            ent_coef=0.01,
            vf_coef=0.4,
            max_grad_norm=0.7,
            target_kl=0.5,
            learning_rate=LinearSchedule(1e-3, 1e-4, 1.0),
            policy_kwargs=dict(net_arch=[32, 32]),
        ),
        256,
    ),
    "SAC": (
        "Pendulum-v1",
        dict(
            learning_starts=32,
            batch_size=16,
            buffer_size=1_000,
            tau=0.02,
            gamma=0.95,
            train_freq=(2, "step"),
            gradient_steps=2,
            target_update_interval=2,
            policy_kwargs=dict(net_arch=[32, 32], n_critics=3),
        ),
        220,  # an episode of Pendulum's 200 steps ended
    ),
}
SAME_SETTINGS = {
    "PPO": ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm"),
    "SAC": ("learning_starts", "batch_size", "buffer_size", "tau", "gamma", "gradient_steps", "target_update_interval"),
}


@pytest.mark.parametrize("name", list(TO_SB3))
def test_to_sb3_model_is_sb3s_model_of_the_same_settings_and_training_state(name, tmp_path):
    """``model.to_sb3_model()``: an SB3 model of covey's settings, weights, optimizer states, temperature and
    counters, which acts as covey's, saves SB3's own file, loads in SB3 and trains on there."""
    env_id, kwargs, steps = TO_SB3[name]
    model = getattr(covey, name)("MlpPolicy", env_id, seed=0, **kwargs).learn(steps)
    sb3_model = model.to_sb3_model()
    assert type(sb3_model) is getattr(stable_baselines3, name)
    for key in SAME_SETTINGS[name]:
        assert getattr(sb3_model, key) == getattr(model, key), key
    assert sb3_model.policy_kwargs["net_arch"] == [32, 32] and sb3_model.seed == 0
    assert (sb3_model.num_timesteps, sb3_model._n_updates) == (model.num_timesteps, model._n_updates) != (steps, 0)
    assert sb3_model._current_progress_remaining == model._current_progress_remaining < 1
    assert list(sb3_model.ep_info_buffer) == list(model.ep_info_buffer) != []
    expected = model.get_sb3_parameters()
    for group, state in sb3_model.get_parameters().items():
        if group != "policy":  # the weights: below, by what they compute
            assert state["state"].keys() == expected[group]["state"].keys() != set(), group
            assert state["param_groups"][0]["lr"] == pytest.approx(model.lr_schedule(model._current_progress_remaining))
    obs = observations(model.observation_space, 16)
    if name == "PPO":
        assert sb3_model.clip_range(0.5) == 0.3 and sb3_model.lr_schedule(0.5) == model.lr_schedule(0.5)
        assert sb3_model.target_kl == 0.5
        with torch.no_grad():
            obs_t = torch.as_tensor(obs)
            torch.testing.assert_close(sb3_model.policy.predict_values(obs_t), model.policy.predict_values(obs_t))
    else:
        assert (
            sb3_model.train_freq.frequency == 2
            and sb3_model.train_freq.unit.value == "step"
            and sb3_model.target_entropy == model.target_entropy
        )
        torch.testing.assert_close(sb3_model.log_ent_coef.detach(), model.log_ent_coef.detach())
    act = model.predict(obs, deterministic=True)[0]
    np.testing.assert_allclose(sb3_model.predict(obs, deterministic=True)[0], act, rtol=1e-5, atol=1e-6)

    sb3_model.save(tmp_path / "sb3")
    loaded = getattr(stable_baselines3, name).load(tmp_path / "sb3.zip", env=gym.make(env_id))
    np.testing.assert_allclose(loaded.predict(obs, deterministic=True)[0], act, rtol=1e-5, atol=1e-6)
    loaded.learn(steps, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + steps and loaded._n_updates > model._n_updates


@pytest.mark.parametrize("policy", ["CnnPolicy", "MultiInputPolicy"])
def test_to_sb3_model_of_channel_last_images_with_and_without_an_env(policy):
    """SB3's model sees the images channels first (a Dict's image keys too), as SB3 moves them; both act as covey's
    on the env's frames."""
    space = image_space((36, 36, 3)) if policy == "CnnPolicy" else IMAGE_AND_VECTOR
    env = SpaceEnv(space, spaces.Discrete(3))
    model = covey.PPO(policy, env, n_steps=16, batch_size=16, seed=0)
    raw = [env.observation_space.sample() for _ in range(8)]
    obs = {k: np.stack([o[k] for o in raw]) for k in raw[0]} if isinstance(raw[0], dict) else np.stack(raw)
    act = model.predict(obs, deterministic=True)[0]
    for sb3_model in (model.to_sb3_model(), model.to_sb3_model(env)):
        image_space_seen = sb3_model.observation_space
        if policy == "MultiInputPolicy":
            assert sb3_model.observation_space["vector"] == IMAGE_AND_VECTOR["vector"]
            image_space_seen = sb3_model.observation_space["image"]
        assert image_space_seen.shape == (3, 36, 36)
        np.testing.assert_array_equal(sb3_model.predict(obs, deterministic=True)[0], act)


def test_to_sb3_model_of_a_space_with_a_start_warns_that_sb3_acts_from_0(tmp_path, capsys):
    """SB3 ignores a Discrete's start: its model of covey's weights acts covey's actions minus the start, which
    to_sb3_model says; covey export --sb3 verifies SB3's file against exactly that."""
    from covey.cli.commands import _export_sb3

    env = SpaceEnv(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(3, start=5))
    model = _perturbed(covey.PPO("MlpPolicy", env, n_steps=16, batch_size=16, seed=0))
    with pytest.warns(UserWarning, match=r"Discrete\(3, start=5\) has a start, which SB3 ignores.* minus 5\)"):
        sb3_model = model.to_sb3_model()
    obs = np.stack([env.observation_space.sample() for _ in range(32)])
    ours = model.predict(obs, deterministic=True)[0]
    assert len(set(ours.tolist())) > 1
    np.testing.assert_array_equal(sb3_model.predict(obs, deterministic=True)[0], ours - 5)
    with pytest.warns(UserWarning, match="which SB3 ignores"):
        assert _export_sb3(model, tmp_path / "m.zip", tmp_path / "m_sb3.zip") == 0
    assert "verified: True (stable_baselines3.PPO.load of it against model.predict minus the start" in (
        capsys.readouterr().out
    )


def test_to_sb3_model_says_what_it_needs():
    from stable_baselines3.common.policies import ActorCriticPolicy

    class Mine(ActorCriticPolicy):
        pass

    her = covey.SAC(
        "MultiInputPolicy",
        BitFlippingEnv(n_bits=4, continuous=True),
        replay_buffer_class=HerReplayBuffer,
        learning_starts=8,
        buffer_size=100,
    )
    with pytest.raises(ValueError, match="pass env to to_sb3_model"):
        her.to_sb3_model()
    assert her.to_sb3_model(BitFlippingEnv(n_bits=4, continuous=True)).replay_buffer_class.__name__ == "HerReplayBuffer"
    with pytest.raises(ValueError, match="a class of your own"):
        covey.PPO(Mine, "CartPole-v1", n_steps=16, batch_size=16).to_sb3_model()
    with pytest.raises(ValueError, match="memory is a GRU; sb3-contrib.s RecurrentPPO has LSTMs only"):
        covey.PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(memory=dict(kind="gru"))).to_sb3_model()


def test_the_policys_load_state_dict_reads_sb3s_names_and_warns_where_it_loads_nothing():
    """SB3's docs change weights with model.policy.load_state_dict(part, strict=False), the part picked by SB3's
    names. covey's policy reads SB3's names as SB3's does; a part with no name of covey's policy (as SB3's docs'
    filter of covey's names gives: an empty dict) warns instead of changing nothing in silence."""
    part = {"action_net.weight": torch.zeros(2, 64), "action_net.bias": torch.tensor([0.0, 5.0])}
    obs = observations(gym.make("CartPole-v1").observation_space)
    for lib in (stable_baselines3, covey):
        model = lib.PPO("MlpPolicy", "CartPole-v1", seed=0)
        model.policy.load_state_dict(part, strict=False)
        assert (model.predict(obs, deterministic=True)[0] == 1).all(), lib.__name__
    model = covey.PPO("MlpPolicy", "CartPole-v1", seed=0)
    for nothing in ({}, {"no_such.weight": torch.zeros(1)}):
        with pytest.warns(UserWarning, match=r"load_state_dict\(strict=False\) changed no weight of this policy"):
            model.policy.load_state_dict(nothing, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.policy.load_state_dict(model.policy.state_dict())
        model.policy.load_state_dict({"actor.head.proj.bias": torch.zeros(2)}, strict=False)
    sac = covey.SAC("MlpPolicy", "Pendulum-v1")
    with pytest.raises(ValueError, match=r"SB3's actor.mu.weight without actor.log_std.weight"):
        sac.policy.load_state_dict({"actor.mu.weight": torch.zeros(1, 256)}, strict=False)


def test_the_extractors_layers_are_reached_by_sb3s_names_and_their_hooks_see_sb3s_inputs():
    """SB3's ``features_extractor.cnn`` (NatureCNN) and ``.extractors`` (CombinedExtractor) were AttributeErrors:
    feature-map and Grad-CAM code reads and hooks them. They are covey's ``convs`` and ``encoders``: the same layers
    in the same order, whose hooks run in training and see what SB3's see (channel-first floats in [0, 1])."""
    env = SpaceEnv(image_space((36, 36, 3)), spaces.Discrete(3))
    sb3_model = stable_baselines3.PPO("CnnPolicy", env, n_steps=16, batch_size=16, seed=0)
    model = covey.PPO("CnnPolicy", env, n_steps=16, batch_size=16, seed=0)
    ours, theirs = model.policy.features_extractor.cnn, sb3_model.policy.features_extractor.cnn
    assert ours is model.policy.features_extractor.convs
    assert [type(m) for m in ours] == [type(m) for m in theirs]
    assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]
    seen = {"covey": [], "sb3": []}
    for name, cnn in (("covey", ours), ("sb3", theirs)):
        cnn[0].register_forward_pre_hook(lambda _, args, name=name: seen[name].append(args[0].detach().clone()))
        cnn[4].register_forward_hook(lambda _, args, out, name=name: seen[name].append(out.shape[1:]))
    for m in (model, sb3_model):
        m.learn(16)
    first = {name: inputs[0] for name, inputs in seen.items()}
    assert first["covey"].shape[1:] == first["sb3"].shape[1:] == (3, 36, 36)
    assert (
        first["covey"].dtype == torch.float32 and 0.0 <= float(first["covey"].min()) <= float(first["covey"].max()) <= 1
    )
    assert seen["covey"][1] == seen["sb3"][1] == (64, 1, 1)  # the last convolution's maps, (channels, h, w)
    assert len(seen["covey"]) > 2  # the hooks ran in training too, not only in acting

    dict_env = SpaceEnv(IMAGE_AND_VECTOR, spaces.Discrete(3))
    fe = covey.PPO("MultiInputPolicy", dict_env, n_steps=16, batch_size=16).policy.features_extractor
    sb3_fe = stable_baselines3.PPO("MultiInputPolicy", dict_env, n_steps=16, batch_size=16).policy.features_extractor
    assert fe.extractors is fe.encoders and list(fe.extractors) == list(sb3_fe.extractors)
    assert [type(m) for m in fe.extractors["image"].cnn] == [type(m) for m in sb3_fe.extractors["image"].cnn]


def test_to_sb3_model_refuses_channel_last_float_images_which_sb3s_cnn_cannot_read():
    """covey's CnnPolicy reads channel-last float images (normalize_images=False); SB3 moves only uint8 images
    channels first, so SB3's template failed with a convolution size error from torch."""
    env = SpaceEnv(spaces.Box(0, 1, (36, 36, 3), np.float32), spaces.Discrete(3))
    model = covey.PPO("CnnPolicy", env, n_steps=16, batch_size=16, policy_kwargs=dict(normalize_images=False))
    for convert in (model.to_sb3_model, model.get_sb3_parameters):
        with pytest.raises(ValueError, match=r"channel-last images that are not uint8 pixels .*Train on channel-first"):
            convert()
    first = SpaceEnv(spaces.Box(0, 1, (3, 36, 36), np.float32), spaces.Discrete(3))
    model = covey.PPO("CnnPolicy", first, n_steps=16, batch_size=16, policy_kwargs=dict(normalize_images=False))
    assert model.to_sb3_model().observation_space.shape == (3, 36, 36)  # channels first: SB3's counterpart


@pytest.mark.parametrize(
    "name, observation_space, message",
    [
        (
            "PPO",
            spaces.Discrete(3, start=1),
            r"The observation space is Discrete\(3, start=1\), whose values start at 1",
        ),
        ("SAC", spaces.Discrete(4, start=-2), r"whose values start at -2: SB3's preprocessing one-hots them from 0"),
        ("PPO", spaces.MultiDiscrete([2, 3], start=[1, 0]), r"MultiDiscrete\(\[2 3\], start=\[1 0\]\), whose"),
        ("PPO", spaces.Dict({"k": spaces.Discrete(2, start=3)}), r"Observation key 'k' is Discrete\(2, start=3\)"),
        (
            "PPO",
            spaces.MultiDiscrete([[2, 3], [2, 2]]),
            r"of shape \(2, 2\): SB3's preprocessing takes a MultiDiscrete of",
        ),
        (
            "SAC",
            spaces.Box(-1, 1, (), np.float32),
            r"is Box\(-1.0, 1.0, \(\), float32\): SB3's networks take a Box of one",
        ),
        ("PPO", spaces.Dict({"v": spaces.Box(-1, 1, (3,), np.float32)}), r"SB3's MlpPolicy takes no Dict observations"),
        ("PPO", spaces.Box(-1, 1, (3,), np.float32), r"SB3's MultiInputPolicy takes Dict observations only"),
        ("PPO", spaces.Box(0, 255, (6, 3, 7), np.uint8), r"an image whose smallest axis is the middle one: SB3 takes"),
    ],
    ids=[
        "discrete-start",
        "negative-start",
        "multidiscrete-start",
        "dict-key-start",
        "2d-nvec",
        "box-0d",
        "dict-mlp",
        "box-multiinput",
        "image-middle-axis",
    ],
)
def test_to_sb3_model_refuses_observations_sb3s_policy_reads_otherwise(name, observation_space, message, tmp_path):
    """covey's encoders read these observations; SB3's model of the weights one-hotted a start from 0 (acting
    otherwise, in silence, or failing in its predict), failed on a () Box in its predict, or on a Dict under
    MlpPolicy. Refused at the conversion, and so by covey export --sb3 before it writes a file."""
    from covey.cli.commands import _export_sb3
    from covey.cli.config import CLIError

    policy = "MultiInputPolicy" if "MultiInputPolicy takes" in message or "key" in message else "MlpPolicy"
    action_space = spaces.Discrete(3) if name == "PPO" else spaces.Box(-1, 1, (2,), np.float32)
    kwargs = dict(n_steps=16, batch_size=16) if name == "PPO" else dict(buffer_size=100)
    model = getattr(covey, name)(policy, SpaceEnv(observation_space, action_space), seed=0, **kwargs)
    for convert in (model.to_sb3_model, model.get_sb3_parameters):
        with pytest.raises(ValueError, match=message + r".*, for a model SB3 has a counterpart of\."):
            convert()
    with pytest.raises(CLIError, match=message):
        _export_sb3(model, tmp_path / "m.zip", tmp_path / "m_sb3.zip")
    assert not (tmp_path / "m_sb3.zip").exists()


def test_to_sb3_model_of_observations_sb3_reads_as_covey_acts_as_covey():
    """The refusals above leave alone what SB3 reads as covey does: Discrete and MultiDiscrete observations from 0,
    Dict observations under MultiInputPolicy."""
    for policy, observation_space in (
        ("MlpPolicy", spaces.Discrete(5)),
        ("MlpPolicy", spaces.MultiDiscrete([2, 3])),
        ("MultiInputPolicy", spaces.Dict({"k": spaces.Discrete(3), "v": spaces.Box(-1, 1, (2,), np.float32)})),
    ):
        env = SpaceEnv(observation_space, spaces.Discrete(3))
        model = _perturbed(covey.PPO(policy, env, n_steps=16, batch_size=16, seed=0))
        sb3_model = model.to_sb3_model()
        obs = [env.observation_space.sample() for _ in range(32)]
        for ob in obs:
            assert sb3_model.predict(ob, deterministic=True)[0] == model.predict(ob, deterministic=True)[0], policy


def test_sac_of_discrete_actions_with_a_start_is_refused_without_advice_on_sb3s_model_of_it():
    """SB3 has no SAC of Discrete actions: the refusal came after a warning on how to use SB3's model of these
    weights (its actions from 0), which does not exist."""
    env = SpaceEnv(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(3, start=5))
    model = covey.SAC("MlpPolicy", env, buffer_size=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning before the refusal
        for convert in (model.to_sb3_model, model.get_sb3_parameters):
            with pytest.raises(ValueError, match=r"SB3's SAC has Box actions only; this model's are Discrete\(3"):
                convert()
    ppo = covey.PPO("MlpPolicy", env, n_steps=16, batch_size=16)  # which SB3 has: the warning stays
    with pytest.warns(UserWarning, match=r"has a start, which SB3 ignores"):
        ppo.get_sb3_parameters()


def test_saving_an_actor_alone_names_the_files_covey_writes():
    """SB3's SAC actor (a BasePolicy) has save; covey's actor, also POCA's model.policy, failed with a bare
    AttributeError."""
    from envs import EarlyExitEnv

    for actor in (
        covey.SAC("MlpPolicy", "Pendulum-v1", buffer_size=100).actor,
        covey.POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8).policy,
    ):
        with pytest.raises(NotImplementedError, match=r"covey writes no file of an actor alone .*model.save\(path\)"):
            actor.save("actor.zip")
