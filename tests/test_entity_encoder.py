"""The entity encoder for observations that are lists of entities (KAZ's vector state)."""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from covey.networks.attention import EntityEncoder


@pytest.fixture
def encoder():
    torch.manual_seed(0)
    return EntityEncoder(spaces.Box(-1, 1, (6, 3), np.float32), width=16, n_heads=2).eval()


def test_order_of_entities_does_not_matter(encoder):
    x = torch.randn(4, 6, 3)
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    torch.testing.assert_close(encoder(x), encoder(x[:, perm]), atol=1e-6, rtol=1e-5)


def test_zero_rows_are_padding(encoder):
    x = torch.randn(4, 6, 3)
    x[:, 4:] = 0.0  # two padding entities
    trimmed = EntityEncoder(spaces.Box(-1, 1, (4, 3), np.float32), width=16, n_heads=2).eval()
    trimmed.load_state_dict(encoder.state_dict())
    torch.testing.assert_close(encoder(x), trimmed(x[:, :4]), atol=1e-6, rtol=1e-5)
    assert torch.isfinite(encoder(torch.zeros(2, 6, 3))).all()  # no entity at all: finite


def test_entities_change_the_output(encoder):
    x = torch.randn(2, 6, 3)
    y = x.clone()
    y[:, 0] += 1.0
    assert not torch.allclose(encoder(x), encoder(y))


def test_wrong_space_is_refused():
    with pytest.raises(ValueError, match="2-D Box"):
        EntityEncoder(spaces.Box(-1, 1, (6,), np.float32))


def test_wrong_space_error_says_what_to_do():
    with pytest.raises(ValueError, match="remove entity_encoder=True"):
        EntityEncoder(spaces.Dict({"entities": spaces.Box(-1, 1, (4, 3), np.float32)}))


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_entity_encoder_and_a_features_extractor_class_are_not_taken_together(agent):
    """Both choose the observation encoder: the extractor was dropped silently for the entity encoder."""
    import gymnasium as gym
    from envs import NormExtractor

    import covey

    env = gym.make("Pendulum-v1")
    env = gym.wrappers.TransformObservation(
        env, lambda o: o.reshape(3, 1), spaces.Box(-8, 8, (3, 1), np.float32)
    )  # 3 entities of 1 feature
    kwargs = dict(entity_encoder=True, features_extractor_class=NormExtractor)
    with pytest.raises(ValueError, match="entity_encoder=True and features_extractor_class=NormExtractor"):
        getattr(covey, agent)("MlpPolicy", env, policy_kwargs=kwargs)
    getattr(covey, agent)("MlpPolicy", env, policy_kwargs=dict(entity_encoder=True))  # each alone is taken


@pytest.mark.parametrize("agent", ["PPO", "SAC"])
def test_observation_normalization_that_moves_padding_off_zero_is_warned_of_at_learn(agent):
    """VecNormalize(norm_obs=True) turns the all-zero padding rows into other numbers, which the encoder then
    attends to as entities: learn says so, and says nothing where only rewards are normalized."""
    import warnings

    from envs import SpaceEnv
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import covey

    def model(norm_obs: bool):
        space = spaces.Box(-1, 1, (4, 3), np.float32)
        env = VecNormalize(
            DummyVecEnv([lambda: SpaceEnv(space, spaces.Box(-1, 1, (1,), np.float32))]), norm_obs=norm_obs
        )
        kwargs = dict(n_steps=16, batch_size=16) if agent == "PPO" else dict(learning_starts=100)
        return getattr(covey, agent)("MlpPolicy", env, policy_kwargs=dict(entity_encoder=True), **kwargs)

    with pytest.warns(UserWarning, match=r"all-zero rows .* VecNormalize with norm_obs=True.*norm_obs=False"):
        model(norm_obs=True).learn(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(norm_obs=False).learn(16)
