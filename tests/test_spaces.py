"""PPO on every supported observation and action space: it learns (parameters change) and predicts valid actions.

Not the full cross product: every observation space with Discrete actions, every action space with
Box(4,) observations. Each case trains 256 steps (2 envs x 16 steps x 8 rollouts) on ``SpaceEnv``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from envs import SpaceEnv, image_space
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

from covey import PPO, SAC

N_ENVS = 2
BATCH = 5  # size of the batched predict() check

VEC_OBS = spaces.Box(-1, 1, (4,), np.float32)
DISCRETE_ACTIONS = spaces.Discrete(3)

# (id, policy, observation space), each trained with Discrete(3) actions.
OBS_CASES = [
    ("box4", "MlpPolicy", VEC_OBS),
    ("box2x3-unbounded", "MlpPolicy", spaces.Box(-np.inf, np.inf, (2, 3), np.float32)),
    ("discrete5", "MlpPolicy", spaces.Discrete(5)),
    ("discrete3-start2", "MlpPolicy", spaces.Discrete(3, start=2)),
    ("multidiscrete", "MlpPolicy", spaces.MultiDiscrete([3, 4])),
    ("multibinary", "MlpPolicy", spaces.MultiBinary(4)),
    ("image-hwc-cnn", "CnnPolicy", image_space((36, 36, 3))),
    ("image-chw-cnn", "CnnPolicy", image_space((3, 36, 36))),
    ("image-hwc-mlp", "MlpPolicy", image_space((36, 36, 3))),
    (
        "dict",
        "MultiInputPolicy",
        spaces.Dict(
            {
                "vec": spaces.Box(-1, 1, (4,), np.float32),
                "img": image_space((36, 36, 1)),
                "d": spaces.Discrete(3),
            }
        ),
    ),
]

# (id, action space), each trained with Box(4,) observations.
ACTION_CASES = [
    ("discrete3", spaces.Discrete(3)),
    ("discrete3-start-1", spaces.Discrete(3, start=-1)),
    ("multidiscrete", spaces.MultiDiscrete([2, 3])),
    ("multibinary", spaces.MultiBinary(3)),
    ("box-symmetric", spaces.Box(-1, 1, (2,), np.float32)),
    ("box-asymmetric", spaces.Box(low=np.array([0, -2], np.float32), high=np.array([1, 2], np.float32))),
    # Infinite bounds, on one side of one dimension or on every side: the clip leaves those sides free.
    ("box-half-bounded", spaces.Box(low=np.array([0, 0], np.float32), high=np.array([1, np.inf], np.float32))),
    ("box-unbounded", spaces.Box(-np.inf, np.inf, (2,), np.float32)),
    # Actions with more than one dimension: the flat head output must be reshaped to the space's shape.
    ("multidiscrete-2d", spaces.MultiDiscrete([[2, 3], [2, 2]])),
    ("multibinary-2d", spaces.MultiBinary([2, 2])),
]

MATRIX = (
    [pytest.param(policy, obs, DISCRETE_ACTIONS, id=f"obs-{name}") for name, policy, obs in OBS_CASES]
    + [pytest.param("MlpPolicy", VEC_OBS, act, id=f"act-{name}") for name, act in ACTION_CASES]
    + [pytest.param("MlpPolicy", VEC_OBS, spaces.Box(-1, 1, (2, 2), np.float32), id="act-box-2x2")]
)


def make_vec_env(obs_space: spaces.Space, action_space: spaces.Space) -> DummyVecEnv:
    """Two SpaceEnv copies; the second ends its episodes by truncation so both done paths run."""
    return DummyVecEnv(
        [lambda i=i: SpaceEnv(obs_space, action_space, episode_length=10, truncate=i == 1) for i in range(N_ENVS)]
    )


def stack(samples: list) -> np.ndarray | dict[str, np.ndarray]:
    """A batch of observations: one array, or one array per key for Dict spaces."""
    if isinstance(samples[0], dict):
        return {key: np.stack([s[key] for s in samples]) for key in samples[0]}
    return np.stack(samples)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of a module's state dict (state_dict() returns views of the live tensors)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_valid_action(action: np.ndarray, space: spaces.Space) -> None:
    """``action`` is one action of ``space`` as covey's predict returns it (numpy, the space's shape)."""
    assert isinstance(action, np.ndarray), type(action)
    assert action.shape == space.shape, (action.shape, space.shape)
    if isinstance(space, spaces.Box):
        # covey clips Gaussian samples to the bounds before returning them.
        assert np.all(action >= space.low) and np.all(action <= space.high), action
        assert space.contains(action.astype(space.dtype)), action
    elif isinstance(space, spaces.Discrete):
        assert action.ndim == 0 and np.issubdtype(action.dtype, np.integer), (action, action.dtype)
        assert space.start <= int(action) < space.start + space.n, action
        assert space.contains(action), action
    elif isinstance(space, spaces.MultiDiscrete):
        assert np.issubdtype(action.dtype, np.integer), action.dtype
        assert space.contains(action.astype(space.dtype)), action
    elif isinstance(space, spaces.MultiBinary):
        # covey's Bernoulli head returns 0.0/1.0 floats (as SB3 does): check the values, then the space.
        assert np.all((action == 0) | (action == 1)), action
        assert space.contains(action.astype(space.dtype)), action
    else:
        raise AssertionError(f"unexpected action space {space}")


@pytest.mark.parametrize(("policy", "obs_space", "action_space"), MATRIX)
def test_learn_and_predict(policy: str, obs_space: spaces.Space, action_space: spaces.Space) -> None:
    env = make_vec_env(obs_space, action_space)
    model = PPO(policy, env, n_steps=16, batch_size=32, n_epochs=2, seed=0)
    networks = {"actor": model.actor, "critic": model.critic}
    before = {name: snapshot(net) for name, net in networks.items()}

    model.learn(256)

    assert model.num_timesteps == 256
    for name, net in networks.items():
        after = net.state_dict()
        assert before[name].keys() == after.keys()
        changed = [k for k in after if not torch.equal(before[name][k], after[k])]
        assert changed, f"learn() left every {name} parameter unchanged"

    single_space = SpaceEnv(obs_space, action_space).observation_space
    single_space.seed(1)

    # One observation -> one action of the space's shape; the deterministic action is repeatable.
    obs = single_space.sample()
    action, state = model.predict(obs)
    assert state is None
    assert_valid_action(action, action_space)
    first, _ = model.predict(obs, deterministic=True)
    second, _ = model.predict(obs, deterministic=True)
    assert_valid_action(first, action_space)
    np.testing.assert_array_equal(first, second)

    # A batch of observations (a dict of batches for Dict spaces) -> one action per observation.
    batch = stack([single_space.sample() for _ in range(BATCH)])
    for deterministic in (False, True):
        actions, _ = model.predict(batch, deterministic=deterministic)
        assert isinstance(actions, np.ndarray)
        assert actions.shape == (BATCH, *action_space.shape)
        for a in actions:  # a 1-d batch of Discrete actions iterates as numpy scalars: make them 0-d arrays
            assert_valid_action(np.asarray(a), action_space)


@pytest.mark.parametrize(
    ("policy", "obs_space", "action_space"),
    [
        pytest.param("MlpPolicy", VEC_OBS, spaces.MultiDiscrete([2, 3]), id="box-multidiscrete"),
        pytest.param("MlpPolicy", spaces.Discrete(5), spaces.Box(-1, 1, (2,), np.float32), id="discrete-box"),
        pytest.param("MultiInputPolicy", OBS_CASES[-1][2], spaces.Discrete(3, start=-1), id="dict-discrete"),
    ],
)
def test_predict_on_vec_env_reset(policy: str, obs_space: spaces.Space, action_space: spaces.Space) -> None:
    """predict() takes the VecEnv's own batched observation and returns n_envs actions."""
    model = PPO(policy, make_vec_env(obs_space, action_space), n_steps=16, batch_size=32, seed=0)
    obs = model.get_env().reset()
    for deterministic in (False, True):
        actions, _ = model.predict(obs, deterministic=deterministic)
        assert actions.shape == (N_ENVS, *action_space.shape)
        for a in actions:  # a 1-d batch of Discrete actions iterates as numpy scalars: make them 0-d arrays
            assert_valid_action(np.asarray(a), action_space)


def test_space_env_is_reproducible() -> None:
    """Same seed, same actions -> same observations and rewards; the two copies of a space do not share RNG."""
    obs_space, action_space = OBS_CASES[-1][2], spaces.MultiDiscrete([2, 3])

    def rollout(seed: int) -> list:
        env = SpaceEnv(obs_space, action_space, episode_length=3, truncate=True)
        out = [env.reset(seed=seed)[0]]
        for t in range(3):
            obs, reward, terminated, truncated, _ = env.step(np.array([t % 2, 1]))
            out.append((obs, reward, terminated, truncated))
        return out

    a, b, c = rollout(7), rollout(7), rollout(8)
    for x, y in zip(a[1:], b[1:]):
        np.testing.assert_array_equal(x[0]["img"], y[0]["img"])
        assert x[1:] == y[1:]
    np.testing.assert_array_equal(a[0]["vec"], b[0]["vec"])
    assert not np.array_equal(a[0]["img"], c[0]["img"])
    # Rewards follow the first component (1 is MultiDiscrete([2, 3])'s highest first value); the last step truncates.
    assert [r for _, r, _, _ in a[1:]] == [0.0, 1.0, 0.0]
    assert [(te, tr) for _, _, te, tr in a[1:]] == [(False, False), (False, False), (False, True)]


def test_grayscale_images_without_a_channel_axis_get_a_fix_that_works() -> None:
    """A (H, W) uint8 Box under CnnPolicy: the error names the wrapper that adds the channel axis, for Gymnasium
    and for PettingZoo envs, and that advice, applied as written, trains."""
    import re

    import gymnasium as gym
    import supersuit
    from pettingzoo.butterfly import pistonball_v6

    from covey import POCA

    env = SpaceEnv(spaces.Box(0, 255, (40, 40), np.uint8), DISCRETE_ACTIONS, episode_length=8)
    with pytest.raises(ValueError, match=re.escape("gymnasium.wrappers.ReshapeObservation(env, (40, 40, 1))")):
        PPO("CnnPolicy", env)
    model = PPO("CnnPolicy", gym.wrappers.ReshapeObservation(env, (40, 40, 1)), n_steps=16, batch_size=16, seed=0)
    assert model.learn(16).num_timesteps == 16

    def pistons():
        return supersuit.resize_v1(supersuit.color_reduction_v0(pistonball_v6.parallel_env(n_pistons=3), "B"), 40, 40)

    with pytest.raises(ValueError, match=re.escape("supersuit.reshape_v0(env, (40, 40, 1))")):
        POCA("CnnPolicy", pistons)
    team = POCA("CnnPolicy", lambda: supersuit.reshape_v0(pistons(), (40, 40, 1)), n_steps=8, batch_size=8, seed=0)
    assert team.learn(8).num_timesteps == 8


@pytest.mark.parametrize(
    "space",
    [spaces.Box(0.0, 255.0, (3, 40, 40), np.float32), spaces.Box(0, 1, (40, 40, 3), np.uint8)],
    ids=["float-pixels", "uint8-in-0-1"],
)
def test_cnn_policy_scaling_pixels_needs_uint8_images(space: spaces.Box) -> None:
    """CnnPolicy with normalize_images=True (the default) scales by 1/255, so, as SB3's, it refuses a Box that is
    not a uint8 image in [0, 255] (it trained on the raw values before, silently); both fixes it names train."""
    with pytest.raises(ValueError, match=r"CnnPolicy scales pixels.*normalize_images=False"):
        PPO("CnnPolicy", make_vec_env(space, DISCRETE_ACTIONS))
    with pytest.raises(ValueError, match=re.escape(f"Box(0, 255, {space.shape}, np.uint8)")):
        SAC("CnnPolicy", make_vec_env(space, spaces.Box(-1, 1, (2,), np.float32)))

    def trains(obs_space: spaces.Box, **policy_kwargs) -> bool:
        model = PPO(
            "CnnPolicy",
            make_vec_env(obs_space, DISCRETE_ACTIONS),
            n_steps=8,
            batch_size=16,
            seed=0,
            policy_kwargs=policy_kwargs,
        )
        return model.learn(16).num_timesteps == 16  # 8 steps in each of the 2 copies

    assert trains(space, normalize_images=False)
    assert trains(space, features_extractor_kwargs=dict(normalized_image=True))  # SB3's other way to say it
    assert trains(spaces.Box(0, 255, space.shape, np.uint8))


def test_cnn_policy_on_small_float_images_names_both_problems_at_once() -> None:
    """A 7x7 float grid (PettingZoo's pursuit) under CnnPolicy: the pixel error's advice, normalize_images=False,
    led to a second error, NatureCNN's minimum size. One error now names both and the ways out."""
    space = spaces.Box(0.0, 8.0, (7, 7, 3), np.float32)
    with pytest.raises(ValueError, match=r"at least 36x36 pixels .*, 7x7\. Use 'MlpPolicy'.*resize_v1"):
        PPO("CnnPolicy", make_vec_env(space, DISCRETE_ACTIONS))
    with pytest.raises(ValueError, match=r"too small for the NatureCNN encoder"):  # the same size, told alone
        PPO("CnnPolicy", make_vec_env(space, DISCRETE_ACTIONS), policy_kwargs=dict(normalize_images=False))


def test_encoders_have_sb3s_features_dim() -> None:
    """SB3's BaseFeaturesExtractor.features_dim and ActorCriticPolicy.features_dim: the number of features."""
    images = make_vec_env(spaces.Box(0, 255, (40, 40, 3), np.uint8), DISCRETE_ACTIONS)
    policy = PPO("CnnPolicy", images, policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=96))).policy
    assert policy.features_dim == policy.features_extractor.features_dim == 96
    assert policy.extract_features(policy.obs_to_tensor(images.reset())[0]).shape == (N_ENVS, 96)
    # a Dict space: the keys' features side by side, 64 from the image key's CNN
    dict_env = make_vec_env(OBS_CASES[-1][2], DISCRETE_ACTIONS)
    multi = PPO("MultiInputPolicy", dict_env, policy_kwargs=dict(features_extractor_kwargs=dict(cnn_output_dim=64)))
    features = multi.policy.extract_features(multi.policy.obs_to_tensor(dict_env.reset())[0])
    assert multi.policy.features_dim == multi.policy.features_extractor.features_dim == features.shape[1] > 64
    assert multi.policy.features_extractor.encoders["img"].features_dim == 64


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-np.inf, np.inf, (2,), np.float32),
        spaces.Box(low=np.array([0, 0], np.float32), high=np.array([1, np.inf], np.float32)),
    ],
    ids=["unbounded", "half-bounded"],
)
def test_squashed_actions_need_finite_bounds(space: spaces.Space) -> None:
    """PPO's squash_output scales tanh outputs to the bounds: infinite ones (NaN actions before) are refused, with
    advice that declares finite bounds; the advice, applied as written, trains."""
    import gymnasium as gym

    kwargs = dict(use_sde=True, policy_kwargs=dict(squash_output=True), n_steps=16, batch_size=16, seed=0)
    with pytest.raises(ValueError, match=r"squash_output=True needs finite Box action bounds.*TransformAction"):
        PPO("MlpPolicy", make_vec_env(VEC_OBS, space), **kwargs)

    fixed = DummyVecEnv(
        [lambda: gym.wrappers.TransformAction(SpaceEnv(VEC_OBS, space), lambda a: a, spaces.Box(-1.0, 1.0, (2,)))]
    )
    model = PPO("MlpPolicy", fixed, **kwargs).learn(32)
    action, _ = model.predict(VEC_OBS.sample())
    assert np.all(np.isfinite(action)) and np.all(np.abs(action) <= 1.0)


@pytest.mark.parametrize(
    ("agent", "policy", "obs_space", "action_space"),
    [
        (PPO, "MlpPolicy", VEC_OBS, DISCRETE_ACTIONS),
        (PPO, "MlpPolicy", VEC_OBS, spaces.Box(-1, 1, (2, 2), np.float32)),  # acting in NumPy
        (PPO, "MlpPolicy", spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3)),
        (PPO, "MultiInputPolicy", OBS_CASES[-1][2], DISCRETE_ACTIONS),
        (PPO, "MlpLstmPolicy", VEC_OBS, DISCRETE_ACTIONS),
        (SAC, "MlpPolicy", VEC_OBS, spaces.Box(-1, 1, (2,), np.float32)),
        (SAC, "MlpPolicy", spaces.Discrete(5), DISCRETE_ACTIONS),
    ],
    ids=["discrete", "box2x2", "multidiscrete-obs", "dict", "lstm", "sac", "sac-discrete"],
)
def test_predict_on_an_empty_batch_returns_no_actions(agent, policy, obs_space, action_space) -> None:
    """As SB3's predict on a batch of 0 observations: an empty batch of actions, of the dtype of a full one (the
    flattening of each observation raised a reshape error before)."""
    model = agent(policy, SpaceEnv(obs_space, action_space), seed=0)
    space = model.observation_space
    if isinstance(space, spaces.Dict):
        empty = {key: np.zeros((0, *sub.shape), sub.dtype) for key, sub in space.spaces.items()}
    else:
        empty = np.zeros((0, *space.shape), space.dtype)
    full, _ = model.predict(stack([space.sample() for _ in range(3)]))
    actions, state = model.predict(empty)
    assert actions.shape == (0, *action_space.shape) and actions.dtype == full.dtype
    if policy == "MlpLstmPolicy":
        assert all(s.shape[1] == 0 for s in state)


def test_a_3d_box_that_is_no_image_takes_its_own_axis_order_only() -> None:
    """Only images (uint8, 0-255) given in the other channel order are transposed, as SB3's predict transposes
    them; a float Box (2, 5, 6) given (6, 2, 5) was reordered silently, and is refused as SB3 refuses it."""
    space = spaces.Box(-1, 1, (2, 5, 6), np.float32)
    model = PPO("MlpPolicy", SpaceEnv(space, DISCRETE_ACTIONS), seed=0)
    obs = space.sample()
    model.predict(obs)
    for shape in [(6, 2, 5), (5, 6, 2), (3, 6, 2, 5)]:
        with pytest.raises(ValueError, match="shape"):
            model.predict(np.zeros(shape, np.float32))
    images = PPO("CnnPolicy", SpaceEnv(image_space((36, 40, 3)), DISCRETE_ACTIONS), seed=0)
    image = images.observation_space.sample()
    np.testing.assert_array_equal(
        images.predict(image, deterministic=True)[0],
        images.predict(np.ascontiguousarray(image.transpose(2, 0, 1)), deterministic=True)[0],
    )


@pytest.mark.parametrize("key", ["type", "to", "pos.x", "", 0], ids=["type", "to", "dot", "empty", "int"])
def test_a_dict_key_that_cannot_name_an_encoder_is_named_at_the_boundary(key) -> None:
    """Gymnasium takes any key; each key names its encoder in a torch ModuleDict, which refuses these: the error
    names the key and the fix, where torch's KeyError or TypeError named neither (SB3 fails as torch did)."""
    space = spaces.Dict({key: spaces.Box(-1, 1, (2,), np.float32), "goal": spaces.Box(-1, 1, (2,), np.float32)})
    with pytest.raises(ValueError, match=rf"key {re.escape(repr(key))} cannot name a network module.*Rename the key"):
        PPO("MultiInputPolicy", SpaceEnv(space, DISCRETE_ACTIONS))


def test_same_space_takes_a_float_boxs_largest_number_for_infinity():
    """A bound at the dtype's largest number and one at inf (the same sign) both leave the value unbounded:
    gymnasium before 1.0 wrote CartPole's velocity bounds one way, 1.0 the other. Nothing else is relaxed."""
    from covey.spaces import same_space

    big = np.finfo(np.float32).max
    old = spaces.Box(np.array([-4.8, -big], np.float32), np.array([4.8, big], np.float32))
    new = spaces.Box(np.array([-4.8, -np.inf], np.float32), np.array([4.8, np.inf], np.float32))
    assert same_space(old, new) and same_space(new, old)
    assert same_space(
        spaces.Dict({"a": old, "b": spaces.Discrete(2)}), spaces.Dict({"a": new, "b": spaces.Discrete(2)})
    )
    flipped = spaces.Box(np.array([-4.8, -big], np.float32), np.array([4.8, -big], np.float32))
    assert not same_space(flipped, new)  # -largest is not +inf
    assert not same_space(spaces.Box(-1, 1, (2,)), spaces.Box(-1, 2, (2,)))  # other finite bounds
    assert not same_space(old, spaces.Box(new.low, new.high, dtype=np.float64))  # another dtype
    ints = spaces.Box(np.iinfo(np.int64).min, np.iinfo(np.int64).max, (2,), np.int64)
    assert same_space(ints, ints) and not same_space(ints, spaces.Box(0, 1, (2,), np.int64))
    assert not same_space(spaces.Dict({"a": old}), spaces.Dict({"b": new}))
