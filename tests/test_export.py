"""ONNX export of trained actors: the graph, run here with onnxruntime on fresh observations, gives the actions
``model.predict(obs, deterministic=True)`` gives, for every agent and space kind; the file holds no critic;
bad input and failures are reported clearly."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from envs import DictTeam, SpaceEnv, image_space, needs_onnx_exporter
from gymnasium import spaces
from onnx import numpy_helper

from covey import POCA, PPO, SAC
from covey.envs import EarlyExitEnv
from covey.export import ExportedActor, export_onnx
from covey.serialization import ModelFileError
from covey.spaces import is_image_space

pytestmark = needs_onnx_exporter()

# ============================================================================================ helpers


def fresh_obs(space: spaces.Space, n: int, seed: int):
    """A batch of ``n`` observations of ``space`` drawn here (not by the exporter), in the graph's input dtypes."""
    rng = np.random.default_rng(seed)
    if isinstance(space, spaces.Dict):
        return {key: fresh_obs(sub, n, seed + 1 + i) for i, (key, sub) in enumerate(space.spaces.items())}
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=n).astype(np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return (space.start + rng.integers(0, space.nvec, size=(n, *space.shape))).astype(np.int64)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, size=(n, *space.shape)).astype(np.int8)
    if space.dtype == np.uint8:  # pixels whole; another uint8 Box as floats (the graph takes it as predict does)
        return rng.integers(0, 256, size=(n, *space.shape)).astype(np.uint8 if is_image_space(space) else np.float32)
    low = np.where(np.isfinite(space.low), space.low, -3.0)
    high = np.where(np.isfinite(space.high), space.high, 3.0)
    return rng.uniform(low, high, size=(n, *space.shape)).astype(np.float32)


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def feed(obs) -> dict[str, np.ndarray]:
    return dict(obs) if isinstance(obs, dict) else {"obs": obs}


def assert_same_actions(model, path, n: int = 50, seed: int = 123, discrete: bool = True) -> np.ndarray:
    """Run the file on fresh observations (a batch of ``n`` and a batch of one) and compare with predict."""
    sess = session(path)
    for batch in (n, 1):
        obs = fresh_obs(model.observation_space, batch, seed + batch)
        (onnx_actions,) = sess.run(None, feed(obs))
        expected, _ = model.predict(obs, deterministic=True)
        assert onnx_actions.shape == np.asarray(expected).shape
        if discrete:
            np.testing.assert_array_equal(onnx_actions, expected)
        else:
            np.testing.assert_allclose(onnx_actions, expected, rtol=0, atol=1e-5)
    return onnx_actions


def graph_arrays(path) -> list[np.ndarray]:
    """Every stored tensor of the graph: initializers and Constant nodes' values."""
    proto = onnx.load(str(path))
    arrays = [numpy_helper.to_array(t) for t in proto.graph.initializer]
    for node in proto.graph.node:
        if node.op_type == "Constant":
            arrays += [numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"]
    return arrays


def _holds(arrays: list[np.ndarray], tensor: torch.Tensor) -> bool:
    t = tensor.detach().cpu().numpy()
    candidates = [t, t.T] if t.ndim == 2 else [t]
    return any(a.shape == c.shape and np.array_equal(a, c) for a in arrays for c in candidates)


def assert_actor_only(model, path) -> None:
    """The file stores the actor's weights and none of the critic's (nor its target's or EMA copy's)."""
    arrays = graph_arrays(path)
    stored = sum(a.size for a in arrays)
    actor_params = list(model.actor.parameters())
    actor_ids = {id(p) for p in actor_params}
    critic_params = [
        p
        for name, net in model._networks().items()
        if name != "actor"
        for p in net.parameters()
        if id(p) not in actor_ids
    ]
    n_actor = sum(p.numel() for p in actor_params)
    n_critic = sum(p.numel() for p in critic_params)
    assert stored < n_actor + n_critic
    assert stored <= n_actor + 64  # the actor's weights plus a few small constants (bounds, shapes)
    assert _holds(arrays, model.actor.head.proj.weight)
    leaked = [p.shape for p in critic_params if p.numel() >= 16 and _holds(arrays, p)]
    assert not leaked, f"critic parameters stored in the ONNX file: {leaked}"


def input_types(path) -> dict[str, str]:
    return {i.name: i.type for i in session(path).get_inputs()}


# ============================================================================================ agents and spaces


def test_ppo_discrete_cartpole(tmp_path):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0).learn(256)
    before = {k: v.clone() for k, v in model.actor.state_dict().items()}
    training_mode = model.actor.training
    result = export_onnx(model, tmp_path / "cartpole.onnx", n_samples=32)
    # The caller's agent is untouched (the exporter works on a copy, and puts back the mode predict changed).
    assert model.actor.training == training_mode is True
    assert result == {
        "path": str(tmp_path / "cartpole.onnx"),
        "verified": True,
        "max_abs_diff": 0.0,
        "n_samples": 32,
        "inputs": ["obs"],
        "outputs": ["action"],
    }
    assert input_types(result["path"]) == {"obs": "tensor(float)"}
    actions = assert_same_actions(model, result["path"])
    assert actions.dtype == np.int64
    assert_actor_only(model, result["path"])
    for key, value in model.actor.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_ppo_box_pendulum_clips_the_mean_to_the_bounds(tmp_path):
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0).learn(256)
    result = export_onnx(model, tmp_path / "pendulum.onnx")
    assert result["verified"] and result["max_abs_diff"] <= 1e-5
    assert_same_actions(model, result["path"], discrete=False)
    assert_actor_only(model, result["path"])
    # Push the Gaussian mean past the upper bound (2) for most observations: the graph must clip as predict does.
    with torch.no_grad():
        model.actor.head.proj.bias += 2.5
    result = export_onnx(model, tmp_path / "pushed.onnx")
    actions = assert_same_actions(model, result["path"], discrete=False)
    assert actions.dtype == np.float32 and actions.shape[1:] == (1,)
    assert np.any(actions == 2.0) and actions.max() <= 2.0


ASYMMETRIC_BOX = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([0.0, 3.0], np.float32))


@pytest.mark.parametrize("env", ["Pendulum-v1", "asymmetric-box", "CartPole-v1"])
def test_sac(tmp_path, env):
    if env == "asymmetric-box":
        # Bounds that are not symmetric around 0 make the rescaling from [-1, 1] visible.
        env = SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), ASYMMETRIC_BOX, episode_length=8)
    model = SAC(
        "MlpPolicy", env, learning_starts=64, batch_size=32, policy_kwargs=dict(net_arch=[32, 32]), seed=0
    ).learn(200)
    result = export_onnx(model, tmp_path / "sac.onnx")
    assert result["verified"]
    discrete = isinstance(model.action_space, spaces.Discrete)
    actions = assert_same_actions(model, result["path"], discrete=discrete)
    if not discrete:
        # tanh-squashed and rescaled to the bounds
        assert np.all(actions >= model.action_space.low) and np.all(actions <= model.action_space.high)
    assert_actor_only(model, result["path"])


def test_sac_with_wide_action_bounds_verifies_within_float32s_relative_rounding(tmp_path):
    """Rescaled to [-1000, 1000], onnxruntime's tanh (a few 1e-7 from torch's) gives actions about 1e-4 apart,
    1e-7 of their size: verified, where an absolute 1e-5 refused a graph that is right."""
    env = SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Box(-1000.0, 1000.0, (2,), np.float32))
    model = SAC("MlpPolicy", env, learning_starts=8, batch_size=8, seed=0)
    result = export_onnx(model, tmp_path / "wide.onnx", n_samples=256)
    assert result["verified"] and result["max_abs_diff"] < 1e-5 * 1000


def test_float16_actions_verify_within_a_float16_rounding_of_the_graphs_float32(tmp_path):
    """predict rounds a float16 action space's actions to float16, the graph gives float32: a rounding apart (up to
    about 5e-4 at 1), which an absolute 1e-5 refused as a graph that does not act as the model."""
    from covey.export import compare_actions

    env = SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Box(-1.0, 1.0, (2,), np.float16))
    model = SAC("MlpPolicy", env, learning_starts=8, batch_size=8, seed=0)
    result = export_onnx(model, tmp_path / "half.onnx", n_samples=256)
    assert result["verified"] and 0 < result["max_abs_diff"] < 1e-3
    exact = np.linspace(-1, 1, 101, dtype=np.float32)
    assert compare_actions(exact.astype(np.float16), exact, discrete=False)[0]
    assert not compare_actions(exact.astype(np.float16), exact + 2e-3, discrete=False)[0]  # 2 roundings apart
    assert not compare_actions(exact, exact + 2e-4, discrete=False)[0]  # float32 on both sides: 1e-5 as before


@pytest.mark.cpu
def test_ppo_with_squashed_sde_rescales_to_the_bounds(tmp_path):
    """PPO with use_sde and squash_output=True: the graph squashes the mean and rescales it to the bounds (not
    clips it), as predict does."""
    env = SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), ASYMMETRIC_BOX, episode_length=8)
    model = PPO("MlpPolicy", env, use_sde=True, policy_kwargs=dict(squash_output=True), n_steps=32, batch_size=32)
    with torch.no_grad():
        model.actor.head.proj.bias += torch.tensor([0.5, -0.5])  # off-centre, so the rescaling shows
    result = export_onnx(model, tmp_path / "squashed.onnx")
    assert result["verified"]
    actions = assert_same_actions(model, result["path"], discrete=False)
    assert np.all(actions > ASYMMETRIC_BOX.low) and np.all(actions < ASYMMETRIC_BOX.high)
    assert_actor_only(model, result["path"])


def test_ppo_dict_observations_one_input_per_key(tmp_path):
    obs_space = spaces.Dict(
        {
            "image": image_space((36, 36, 3)),
            "position": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "room": spaces.Discrete(4, start=1),
            "flags": spaces.MultiBinary(3),
        }
    )
    action_space = spaces.MultiDiscrete([3, 4], start=[1, -2])
    env = SpaceEnv(obs_space, action_space, episode_length=8)
    model = PPO("MultiInputPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=0).learn(128)
    result = export_onnx(model, tmp_path / "dict.onnx")
    assert result["verified"]
    assert sorted(result["inputs"]) == ["flags", "image", "position", "room"]
    assert input_types(result["path"]) == {
        "image": "tensor(uint8)",
        "position": "tensor(float)",
        "room": "tensor(int64)",
        "flags": "tensor(int8)",
    }
    actions = assert_same_actions(model, result["path"])
    assert actions.dtype == np.int64 and actions.shape[1:] == (2,)
    assert actions[:, 0].min() >= 1 and actions[:, 1].min() >= -2  # the spaces' start offsets
    assert_actor_only(model, result["path"])


@pytest.mark.parametrize(
    ("policy", "shape", "action_space"),
    [
        ("CnnPolicy", (40, 40, 3), spaces.Discrete(3, start=2)),  # channel-last NatureCNN
        ("CnnPolicy", (1, 36, 36), spaces.Discrete(2)),  # channel-first NatureCNN
        ("MlpPolicy", (8, 8, 1), spaces.MultiBinary(4)),  # flattened and scaled
    ],
)
def test_ppo_image_observations_are_uint8_inputs(tmp_path, policy, shape, action_space):
    env = SpaceEnv(image_space(shape), action_space, episode_length=8)
    model = PPO(policy, env, n_steps=32, batch_size=32, n_epochs=2, seed=0).learn(96)
    result = export_onnx(model, tmp_path / "image.onnx")
    assert result["verified"]
    assert input_types(result["path"]) == {"obs": "tensor(uint8)"}  # pixels are scaled inside the graph
    assert_same_actions(model, result["path"])
    assert_actor_only(model, result["path"])


@pytest.mark.parametrize(
    ("obs_space", "action_space", "input_type"),
    [
        (spaces.Discrete(6), spaces.Box(-1.0, 1.0, (2, 2), np.float32), "tensor(int64)"),
        (spaces.MultiDiscrete([2, 5]), spaces.Box(-np.inf, np.inf, (2,), np.float32), "tensor(int64)"),
        (spaces.MultiBinary(5), ASYMMETRIC_BOX, None),
    ],
)
def test_ppo_discrete_observations_and_box_action_shapes(tmp_path, obs_space, action_space, input_type):
    env = SpaceEnv(obs_space, action_space, episode_length=8)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=0).learn(96)
    result = export_onnx(model, tmp_path / "spaces.onnx")
    assert result["verified"]
    assert input_types(result["path"]) == {"obs": input_type or "tensor(int8)"}
    actions = assert_same_actions(model, result["path"], discrete=False)
    assert actions.shape[1:] == action_space.shape


@pytest.mark.parametrize(
    ("policy", "policy_kwargs", "state_names"),
    [
        ("MlpLstmPolicy", None, ["state_h", "state_c"]),
        ("MlpPolicy", dict(memory=dict(kind="gru", hidden_size=16, sequence_length=8)), ["state_h"]),
    ],
)
def test_ppo_recurrent_takes_and_returns_the_memory(tmp_path, policy, policy_kwargs, state_names):
    model = PPO(
        policy, "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, policy_kwargs=policy_kwargs, seed=0
    ).learn(256)
    result = export_onnx(model, tmp_path / "recurrent.onnx")
    assert result["verified"]
    assert result["inputs"] == ["obs", *state_names, "episode_start"]
    assert result["outputs"] == ["action", *[f"next_{name}" for name in state_names]]
    sess = session(result["path"])
    assert input_types(result["path"])["episode_start"] == "tensor(bool)"
    # Each side carries its own memory through three steps; some rows start a new episode at each step.
    n, rng = 20, np.random.default_rng(5)
    predict_state, onnx_state = None, None
    for step in range(3):
        obs = fresh_obs(model.observation_space, n, seed=step)
        starts = rng.random(n) < 0.3
        expected, predict_state = model.predict(obs, predict_state, starts, deterministic=True)
        if onnx_state is None:
            onnx_state = [np.zeros((1, n, model.actor.memory.hidden_size), np.float32) for _ in state_names]
        actions, *onnx_state = sess.run(
            None, {"obs": obs, **dict(zip(state_names, onnx_state)), "episode_start": starts}
        )
        np.testing.assert_array_equal(actions, expected)
        assert len(onnx_state) == len(predict_state)
        for got, want in zip(onnx_state, predict_state):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert np.abs(onnx_state[0]).max() > 0  # the memory really moved
    assert_actor_only(model, result["path"])


def test_poca_exports_the_shared_actor_for_one_agent(tmp_path):
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(128)
    result = export_onnx(model, tmp_path / "poca.onnx")
    assert result["verified"]
    sess = session(result["path"])
    (input_info,) = sess.get_inputs()
    assert input_info.shape[1:] == [5]  # one agent's observation (3 one-hot + switch + time left)
    # A group's observations as PettingZoo gives them: {agent: obs}; the graph runs them as a batch of rows.
    obs = fresh_obs(model.observation_space, len(model.agent_ids), seed=9)
    group = {agent: obs[i] for i, agent in enumerate(model.agent_ids)}
    expected, _ = model.predict(group, deterministic=True)
    (actions,) = sess.run(None, {"obs": obs})
    assert actions.tolist() == [expected[agent] for agent in model.agent_ids]
    assert_same_actions(model, result["path"])
    assert_actor_only(model, result["path"])


# ============================================================================================ files and paths


@pytest.fixture(scope="module")
def cartpole():
    torch.set_num_threads(1)
    return PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=1).learn(192)


def test_export_from_a_model_file(tmp_path, cartpole):
    cartpole.save(tmp_path / "model.zip")
    result = export_onnx(str(tmp_path / "model.zip"), tmp_path / "from_file.onnx")
    assert result["verified"]
    assert_same_actions(cartpole, result["path"])
    # SB3's rule for model paths: the .zip suffix may be left out.
    assert export_onnx(tmp_path / "model", tmp_path / "again.onnx")["verified"]


def test_suffix_added_and_verify_off(tmp_path, cartpole):
    result = export_onnx(cartpole, tmp_path / "sub" / "policy", verify=False)
    assert result["path"] == str(tmp_path / "sub" / "policy.onnx")
    assert result["verified"] is False and np.isnan(result["max_abs_diff"])
    assert_same_actions(cartpole, result["path"])


def test_metadata_names_the_agent_and_spaces(tmp_path, cartpole):
    path = export_onnx(cartpole, tmp_path / "m.onnx")["path"]
    meta = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert meta["covey_agent"] == "PPO"
    assert '"Discrete"' in meta["action_space"] and '"Box"' in meta["observation_space"]


def test_missing_file_and_not_a_model(tmp_path, cartpole):
    with pytest.raises(FileNotFoundError, match="No model file"):
        export_onnx(tmp_path / "missing.zip", tmp_path / "out.onnx")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    with pytest.raises(ModelFileError, match="not a readable covey model"):
        export_onnx(notes, tmp_path / "out.onnx")
    with pytest.raises(IsADirectoryError, match="folder, not a covey model file"):
        export_onnx(tmp_path, tmp_path / "out.onnx")
    with pytest.raises(TypeError, match="covey agent"):
        export_onnx(cartpole.actor, tmp_path / "out.onnx")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        export_onnx(cartpole, tmp_path)
    with pytest.raises(ValueError, match="n_samples"):
        export_onnx(cartpole, tmp_path / "out.onnx", n_samples=0)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("module", ["onnxruntime", "onnx"])
def test_missing_onnx_packages_name_the_extra(tmp_path, monkeypatch, cartpole, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(ImportError, match=r'pip install "covey\[export\]"'):
        export_onnx(cartpole, tmp_path / "out.onnx")


def test_failed_export_keeps_the_previous_file(tmp_path, monkeypatch, cartpole):
    target = tmp_path / "policy.onnx"
    target.write_bytes(b"previous")

    def crash(*args, **kwargs):
        raise RuntimeError("crash during verification")

    monkeypatch.setattr("covey.export._verify", crash)
    with pytest.raises(RuntimeError, match="crash during verification"):
        export_onnx(cartpole, target)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.onnx"]  # no temporary file left


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_verification_catches_a_graph_that_differs_from_predict(tmp_path, monkeypatch, env_id):
    model = PPO("MlpPolicy", env_id, n_steps=64, batch_size=32, n_epochs=1, seed=0).learn(64)
    original = ExportedActor._to_env_actions
    if env_id == "CartPole-v1":

        def wrong(self, action):  # the other of CartPole's two actions
            return 1 - original(self, action)
    else:

        def wrong(self, action):
            return original(self, action) + 0.25

    monkeypatch.setattr(ExportedActor, "_to_env_actions", wrong)
    with pytest.warns(RuntimeWarning, match="does not reproduce model.predict"):
        result = export_onnx(model, tmp_path / "wrong.onnx")
    assert result["verified"] is False
    assert result["max_abs_diff"] == pytest.approx(1.0 if env_id == "CartPole-v1" else 0.25, abs=1e-5)


@pytest.mark.parametrize("policy", ["MultiInputPolicy", "MultiInputLstmPolicy"])
def test_poca_with_dict_observations_takes_one_input_per_key(tmp_path, policy):
    """A team's actor takes each agent's Dict observation flattened; its graph takes the keys, as PettingZoo gives
    them, and flattens them inside: the actions equal predict({agent: {key: value}})."""
    model = POCA(policy, lambda: DictTeam(view=True), n_envs=2, n_steps=16, batch_size=32, seed=0).learn(32)
    result = export_onnx(model, tmp_path / "team.onnx")
    assert result["verified"]
    assert result["inputs"][:3] == ["obs", "slot", "view"]
    assert {k: v for k, v in input_types(result["path"]).items() if k in ("obs", "slot", "view")} == {
        "obs": "tensor(float)",
        "slot": "tensor(int64)",
        "view": "tensor(uint8)",
    }
    observations, _ = DictTeam(view=True).reset(seed=5)
    agents = list(observations)
    keys = {key: np.stack([np.asarray(observations[a][key]) for a in agents]) for key in ("obs", "slot", "view")}
    feeds = {"obs": keys["obs"].astype(np.float32), "slot": keys["slot"].astype(np.int64), "view": keys["view"]}
    if policy == "MultiInputLstmPolicy":
        memory = model.actor.memory
        state = tuple(np.zeros((1, len(agents), memory.hidden_size), np.float32) for _ in range(memory.n_state))
        feeds.update(zip(result["inputs"][3 : 3 + memory.n_state], state))
        feeds["episode_start"] = np.ones(len(agents), bool)
        expected, _ = model.predict(observations, state=None, episode_start=True, deterministic=True)
    else:
        expected, _ = model.predict(observations, deterministic=True)
    actions = session(result["path"]).run(None, feeds)[0]
    assert actions.tolist() == [expected[a] for a in agents]
    assert_actor_only(model, result["path"])


def test_keys_named_like_the_graphs_ops_are_still_the_inputs_names(tmp_path):
    """The exporter names inner values after their ops (view, cat, ...): a Dict key of such a name stays the name of
    its input, and the graph stays valid ONNX (each name once)."""
    obs_space = spaces.Dict({"view": spaces.Box(-1, 1, (2, 2), np.float32), "cat": spaces.Discrete(3)})
    env = SpaceEnv(obs_space, spaces.Discrete(2), episode_length=8)
    model = PPO("MultiInputPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16)
    result = export_onnx(model, tmp_path / "ops.onnx")
    assert result["verified"] and result["inputs"] == list(obs_space.spaces) == ["cat", "view"]
    onnx.checker.check_model(onnx.load(result["path"]))
    assert_same_actions(model, result["path"])


@pytest.mark.parametrize("agent", [PPO, SAC])
def test_keys_named_like_the_action_bounds_are_inputs_not_the_bounds(tmp_path, agent):
    """The action bounds are constants named ``low`` and ``high`` in the graph: Dict keys of those names stay the
    inputs, and the bounds stay the bounds (the file failed to load, or with a scalar key read it as a bound)."""
    obs_space = spaces.Dict({"low": spaces.Box(-1, 1, (), np.float32), "high": spaces.Box(-1, 1, (2,), np.float32)})
    env = SpaceEnv(obs_space, ASYMMETRIC_BOX, episode_length=8)
    kwargs = dict(n_steps=16, batch_size=16) if agent is PPO else dict(learning_starts=8, batch_size=8)
    model = agent("MultiInputPolicy", env, seed=0, **kwargs).learn(16)
    result = export_onnx(model, tmp_path / "bounds.onnx")
    assert result["verified"] and result["inputs"] == ["high", "low"]
    onnx.checker.check_model(onnx.load(result["path"]))
    assert_same_actions(model, result["path"], discrete=False)


def test_a_graph_onnxruntime_cannot_load_is_a_runtime_error_that_keeps_the_previous_file(tmp_path, monkeypatch):
    """onnxruntime's errors are no RuntimeError, which ``covey export`` reports: one at verification becomes one,
    naming the file not written and verify=False."""
    import covey.export

    obs_space = spaces.Dict({"low": spaces.Box(-1, 1, (3,), np.float32), "high": spaces.Box(-1, 1, (2,), np.float32)})
    model = PPO("MultiInputPolicy", SpaceEnv(obs_space, ASYMMETRIC_BOX), n_steps=16, batch_size=16, seed=0)
    target = tmp_path / "broken.onnx"
    target.write_bytes(b"previous")
    monkeypatch.setattr(covey.export, "_unique_value_names", lambda model: None)  # the bounds clash with the keys
    with pytest.raises(RuntimeError, match=r"onnxruntime could not run the exported graph.*broken.onnx.*verify=False"):
        export_onnx(model, target)
    assert target.read_bytes() == b"previous"


def test_a_uint8_box_that_is_not_an_image_is_a_float_input(tmp_path):
    """A uint8 vector (an Atari RAM) reaches predict as floats where SB3's VecNormalize scales it, so the graph
    takes float32 as predict does (it took uint8, which refused the normalized observations)."""
    env = SpaceEnv(spaces.Box(0, 255, (8,), np.uint8), spaces.Discrete(3), episode_length=8)
    model = PPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16)
    result = export_onnx(model, tmp_path / "ram.onnx")
    assert result["verified"] and input_types(result["path"]) == {"obs": "tensor(float)"}
    assert_same_actions(model, result["path"])
    normalized = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)  # what VecNormalize gives
    (actions,) = session(result["path"]).run(None, {"obs": normalized})
    np.testing.assert_array_equal(actions, model.predict(normalized, deterministic=True)[0])


@pytest.mark.parametrize("agent", ["ppo", "sac"])
@pytest.mark.parametrize("narrow", [True, False], ids=["narrow-products", "plain-products"])
def test_entity_encoder_policies_export(tmp_path, monkeypatch, agent, narrow):
    """An entity encoder multiplies batch x entities rows: the exporter traces its layers as F.linear whatever
    the CPU's choice of kernels (covey.networks.linear.NARROW, on for AMD CPUs, tested a size of the traced
    batch, which torch.export cannot keep)."""
    from covey.networks import linear

    monkeypatch.setattr(linear, "NARROW", narrow)
    obs_space = spaces.Box(-1, 1, (5, 3), np.float32)  # 5 entities of 3 features
    if agent == "ppo":
        env = SpaceEnv(obs_space, spaces.Discrete(3), episode_length=8)
        model = PPO(
            "MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0, policy_kwargs={"entity_encoder": True}
        )
    else:
        env = SpaceEnv(obs_space, spaces.Box(-1, 1, (2,), np.float32), episode_length=8)
        model = SAC("MlpPolicy", env, learning_starts=8, batch_size=8, seed=0, policy_kwargs={"entity_encoder": True})
    model.learn(16)
    result = export_onnx(model, tmp_path / "entities.onnx")
    assert result["verified"] and result["max_abs_diff"] <= 1e-5
    assert_same_actions(model, result["path"], discrete=agent == "ppo")


@pytest.mark.parametrize("policy_kwargs", [{"value_head": "twohot"}, {"critic_ema_decay": 0.9}, {}])
def test_sac_with_sde_exports_after_gradient_steps_through_autograd(tmp_path, policy_kwargs):
    """SAC's gSDE gradient step draws the exploration matrix through log_std; the matrix kept for acting holds
    none of that step's graph, so the actor copies (export, deepcopy) after learn, on every gradient path."""
    import copy

    model = SAC(
        "MlpPolicy", "Pendulum-v1", use_sde=True, learning_starts=16, batch_size=16, seed=0, policy_kwargs=policy_kwargs
    )
    model.learn(32)
    assert model.actor.head.exploration.grad_fn is None
    copy.deepcopy(model.actor)
    result = export_onnx(model, tmp_path / "sde.onnx")
    assert result["verified"]
    assert_same_actions(model, result["path"], discrete=False)


@pytest.mark.parametrize(
    "policy, key", [("MultiInputPolicy", "action"), ("MultiInputLstmPolicy", "episode_start")], ids=["action", "memory"]
)
def test_a_dict_key_named_like_another_port_of_the_graph_is_named_in_the_error(tmp_path, policy, key):
    obs_space = spaces.Dict({key: spaces.Box(-1, 1, (2,), np.float32), "pos": spaces.Discrete(3)})
    model = PPO(policy, SpaceEnv(obs_space, spaces.Discrete(2), episode_length=8), n_steps=16, batch_size=16, seed=0)
    with pytest.raises(ValueError, match=rf"Dict observation keys \['{key}'\] are also names of the graph's other"):
        export_onnx(model, tmp_path / "clash.onnx")
    assert not (tmp_path / "clash.onnx").exists()


def test_a_file_where_a_folder_of_the_path_should_be_is_named_as_save_names_it(tmp_path, cartpole):
    (tmp_path / "blocker").write_text("mine")
    with pytest.raises(NotADirectoryError, match=r"Cannot write .*policy\.onnx: .*blocker is a file, not a folder"):
        export_onnx(cartpole, tmp_path / "blocker" / "policy.onnx")
    with pytest.raises(NotADirectoryError, match=r"blocker is a file, not a folder"):
        cartpole.save(tmp_path / "blocker" / "model.zip")
    assert (tmp_path / "blocker").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]  # no temporary file left
