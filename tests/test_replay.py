"""ReplayBuffer: ring layout, terminated vs dones, final observations, memory mode, Dict spaces, files.

Every stored transition of a test stream carries a unique integer code in its observation, so a sampled
batch can be checked transition by transition against a table of expected transitions built by hand.
"""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from covey.buffers.replay import ReplayBuffer

N_ENVS = 2
BOX_OBS = spaces.Box(-1e4, 1e4, (1,), np.float32)
DICT_OBS = spaces.Dict({"id": spaces.Discrete(1000), "vec": spaces.Box(-1e4, 1e4, (2,), np.float32)})
ACTIONS = spaces.Box(-1e4, 1e4, (1,), np.float32)


# Episode ends of the test stream: (t, env) -> terminated (True) or truncated (False, a time limit).
ENDS = {(2, 0): True, (6, 0): False, (4, 1): True, (5, 1): False}


def code(t: int, env: int) -> int:
    """The observation of env ``env`` at step ``t``."""
    return 10 * t + env + 1


def final_code(t: int, env: int) -> int:
    """The true final observation of an episode that ends at (t, env); never equal to a reset obs."""
    return code(t, env) + 500


def make_obs(codes, dict_obs: bool):
    codes = np.asarray(codes, dtype=np.int64)
    if dict_obs:
        return {"id": codes.copy(), "vec": np.stack([codes, -codes], axis=-1).astype(np.float32)}
    return codes.reshape(-1, 1).astype(np.float32)


def add_stream(buf: ReplayBuffer, n_steps: int, dict_obs: bool = False, start: int = 0) -> None:
    """Add steps ``start .. start + n_steps - 1`` of ``N_ENVS`` envs; an episode end stores the final obs as
    next obs, while the next row's obs is the reset obs (``code(t + 1, env)``), as a VecEnv reports it."""
    for t in range(start, start + n_steps):
        obs = [code(t, e) for e in range(N_ENVS)]
        dones = np.array([(t, e) in ENDS for e in range(N_ENVS)])
        terminated = np.array([ENDS.get((t, e), False) for e in range(N_ENVS)], dtype=np.float32)
        nxt = [final_code(t, e) if dones[e] else code(t + 1, e) for e in range(N_ENVS)]
        actions = np.array([[0.5 * code(t, e)] for e in range(N_ENVS)], dtype=np.float32)
        rewards = np.array([-float(code(t, e)) for e in range(N_ENVS)], dtype=np.float32)
        buf.store(make_obs(obs, dict_obs), make_obs(nxt, dict_obs), actions, rewards, terminated, dones)


def expected_table(first_t: int, last_t: int) -> set[tuple]:
    """(obs, action, reward, next obs, terminated) of every step t in [first_t, last_t), written out."""
    table = set()
    for t in range(first_t, last_t):
        for e in range(N_ENVS):
            done = (t, e) in ENDS
            nxt = final_code(t, e) if done else code(t + 1, e)
            table.add((code(t, e), 0.5 * code(t, e), -float(code(t, e)), nxt, float(ENDS.get((t, e), False))))
    return table


def decode(obs) -> list[int]:
    if isinstance(obs, dict):
        ids = obs["id"]
        # Both keys of a Dict observation come from the same stored transition.
        assert torch.equal(obs["vec"][:, 0].long(), ids) and torch.equal(obs["vec"][:, 1].long(), -ids)
        return ids.tolist()
    return obs[:, 0].long().tolist()


def sampled_table(buf: ReplayBuffer, n: int = 3000, seed: int = 0) -> set[tuple]:
    """The set of transitions in a large sample (enough to hit each of <= 20 transitions w.p. ~1)."""
    np.random.seed(seed)
    batch = buf.sample_batch(n)
    obs, nxt = decode(batch.observations), decode(batch.next_observations)
    actions, rewards, terminated = batch.actions[:, 0].tolist(), batch.rewards.tolist(), batch.terminated.tolist()
    return set(zip(obs, actions, rewards, nxt, terminated))


def make_buffer(capacity: int, memory: bool, dict_obs: bool = False) -> ReplayBuffer:
    space = DICT_OBS if dict_obs else BOX_OBS
    return ReplayBuffer(capacity * N_ENVS, space, ACTIONS, N_ENVS, optimize_memory_usage=memory)


# ---------------------------------------------------------------------------- layout
def test_n_envs_layout_and_capacity_rounding():
    """buffer_size 11 with 2 envs: 5 rows of 2 envs (the remainder is dropped); row t holds step t."""
    buf = ReplayBuffer(11, BOX_OBS, ACTIONS, n_envs=2)
    assert buf.capacity == 5
    assert buf.observations.shape == (5, 2, 1)
    assert buf.actions.shape == (5, 2, 1) and buf.rewards.shape == (5, 2)
    add_stream(buf, 3)
    assert buf.size() == 3 and buf.pos == 3 and not buf.full  # steps per env, as SB3 counts
    for t in range(3):
        for e in range(2):
            assert buf.observations[t, e, 0] == code(t, e)
            assert buf.actions[t, e, 0] == 0.5 * code(t, e)
            assert buf.rewards[t, e] == -code(t, e)


@pytest.mark.parametrize("n_envs", [1, 2])
def test_arrays_have_sb3s_layout(n_envs):
    """The fields a user's code reads in SB3's ReplayBuffer have its shapes: observations (rows, n_envs, *obs_shape)
    as arrays (dicts of them for Dict spaces), buffer_size the rows, size() the rows filled."""
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    ours = ReplayBuffer(10, BOX_OBS, ACTIONS, n_envs=n_envs)
    theirs = SB3ReplayBuffer(10, BOX_OBS, ACTIONS, n_envs=n_envs)
    for buf in (ours, theirs):
        for t in range(3):
            obs = np.full((n_envs, 1), t, np.float32)
            buf.add(obs, obs + 1, np.zeros((n_envs, 1)), np.zeros(n_envs), np.zeros(n_envs), [{}] * n_envs)
    for name in ("observations", "next_observations", "actions", "rewards"):
        assert getattr(ours, name).shape == getattr(theirs, name).shape, name
    np.testing.assert_array_equal(ours.observations[: ours.pos], theirs.observations[: theirs.pos])
    np.testing.assert_array_equal(ours.next_observations[: ours.pos], theirs.next_observations[: theirs.pos])
    assert (ours.buffer_size, ours.size()) == (theirs.buffer_size, theirs.size())
    keyed = ReplayBuffer(10, spaces.Dict({"a": BOX_OBS}), ACTIONS, n_envs=n_envs)
    assert set(keyed.observations) == {"a"} and keyed.observations["a"].shape == (10 // n_envs, n_envs, 1)


@pytest.mark.parametrize(
    "obs_space, action_space",
    [
        (BOX_OBS, ACTIONS),
        (BOX_OBS, spaces.Discrete(3)),
        (spaces.Dict({"a": BOX_OBS, "b": spaces.Box(-1.0, 1.0, (2,), np.float32)}), ACTIONS),
    ],
    ids=["box", "discrete", "dict"],
)
@pytest.mark.cpu
def test_sample_returns_sb3s_samples(obs_space, action_space):
    """``sample()`` is SB3's: the same transitions put in SB3's buffer and covey's, sampled under the same NumPy
    seed, give the same ``ReplayBufferSamples``, field by field (shapes and dtypes included); ``dones`` is the
    bootstrap mask, 1.0 at a termination and 0.0 at a time limit."""
    from stable_baselines3.common.buffers import DictReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    n_envs, rng = 2, np.random.default_rng(0)
    theirs = (DictReplayBuffer if isinstance(obs_space, spaces.Dict) else SB3ReplayBuffer)(
        16, obs_space, action_space, n_envs=n_envs
    )
    ours = ReplayBuffer(16, obs_space, action_space, n_envs=n_envs)

    def draw(space):
        if isinstance(space, spaces.Dict):
            return {k: draw(s) for k, s in space.spaces.items()}
        return rng.normal(size=(n_envs, *space.shape)).astype(np.float32)

    obs = draw(obs_space)
    for t in range(8):
        next_obs = draw(obs_space)
        if isinstance(action_space, spaces.Discrete):
            actions = rng.integers(0, 3, size=(n_envs, 1))
        else:
            actions = rng.uniform(-1, 1, size=(n_envs, 1)).astype(np.float32)
        rewards = rng.normal(size=n_envs).astype(np.float32)
        terminated = np.array([t == 3, False])
        truncated = np.array([False, t == 5])
        dones = terminated | truncated
        infos = [{"TimeLimit.truncated": bool(x)} for x in truncated]
        for buf in (theirs, ours):  # SB3's add, the same arguments
            buf.add(obs, next_obs, actions, rewards, dones, infos)
        obs = next_obs
    np.random.seed(4)
    expected = theirs.sample(64)
    np.random.seed(4)
    got = ours.sample(64)
    assert type(got) is type(expected) and got._fields == expected._fields
    assert got.dones.sum() > 0  # the termination was drawn (and the time limit's 0.0 checked beside it)
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        a, b = getattr(got, name), getattr(expected, name)
        for key in a if isinstance(a, dict) else [None]:
            x, y = (a[key], b[key]) if key is not None else (a, b)
            assert x.shape == y.shape and x.dtype == y.dtype, (name, key)
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert got.discounts is None


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_n_step_returns_by_hand(dict_obs):
    """One env, gamma 0.5, n = 3: rewards 1, 2, 4, 8 with a termination at step 2 and a time limit at step 5.
    A return sums up to 3 rewards of its episode; the bootstrap mask and next observation are its last step's."""
    buf = ReplayBuffer(16, DICT_OBS if dict_obs else BOX_OBS, ACTIONS, n_envs=1, n_steps=3, gamma=0.5)
    ends = {2: True, 5: False}  # step -> terminated (True) or truncated
    for t in range(7):
        obs, nxt = make_obs([t], dict_obs), make_obs([100 + t], dict_obs)
        buf.store(obs, nxt, np.zeros((1, 1)), np.array([2.0**t]), np.array([ends.get(t, False)]), np.array([t in ends]))
    expected = {  # start: (return, discount, next obs, terminated)
        0: (1 + 0.5 * 2 + 0.25 * 4, 0.125, 102, 1.0),  # cut at the termination: no bootstrap
        1: (2 + 0.5 * 4, 0.25, 102, 1.0),
        2: (4, 0.5, 102, 1.0),
        3: (8 + 0.5 * 16 + 0.25 * 32, 0.125, 105, 0.0),  # the time limit: bootstrap from its final obs
        4: (16 + 0.5 * 32, 0.25, 105, 0.0),
        5: (32, 0.5, 105, 0.0),
        6: (64, 0.5, 106, 0.0),  # the newest step: nothing after it is stored yet
    }
    np.random.seed(0)
    batch = buf.sample_batch(200)
    starts, next_obs = decode(batch.observations), decode(batch.next_observations)
    assert set(starts) == set(expected)
    for i, start in enumerate(starts):
        ret, disc, nxt, term = expected[start]
        assert batch.rewards[i].item() == pytest.approx(ret)
        assert batch.discounts[i].item() == pytest.approx(disc)
        assert (next_obs[i], batch.terminated[i].item()) == (nxt, term)


@pytest.mark.cpu
@pytest.mark.parametrize("normalized", [False, True], ids=["raw", "vec-normalize"])
@pytest.mark.parametrize("handle_timeouts", [True, False])
@pytest.mark.parametrize("rows", [7, 20], ids=["part-filled", "wrapped"])
def test_n_step_samples_are_sb3s(rows, handle_timeouts, normalized):
    """The same stream (terminations, time limits, 2 envs; filled in part, or wrapped around a ring of 8 rows)
    in SB3's NStepReplayBuffer and covey's, sampled under the same seed (and the same VecNormalize): the same
    returns, discounts, masks and observations."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = None
    if normalized:  # rewards scaled by 1 / sqrt(4), observations by statistics of a 1-D observation
        venv = VecNormalize(DummyVecEnv([lambda: gym.make("MountainCarContinuous-v0")]), gamma=0.9)
        venv.ret_rms.var, venv.obs_rms.mean, venv.obs_rms.var = np.array(4.0), np.full(1, 3.0), np.full(1, 9.0)
        venv.observation_space = BOX_OBS

    n_envs, rng = 2, np.random.default_rng(1)
    theirs = NStepReplayBuffer(
        16, BOX_OBS, ACTIONS, n_envs=n_envs, n_steps=3, gamma=0.9, handle_timeout_termination=handle_timeouts
    )
    ours = ReplayBuffer(
        16, BOX_OBS, ACTIONS, n_envs=n_envs, n_steps=3, gamma=0.9, handle_timeout_termination=handle_timeouts
    )
    for t in range(rows):
        obs = np.array([[t], [-t]], np.float32)
        terminated = rng.random(n_envs) < 0.15
        truncated = ~terminated & (rng.random(n_envs) < 0.15)
        dones, rewards = terminated | truncated, rng.normal(size=n_envs).astype(np.float32)
        actions = rng.uniform(-1, 1, (n_envs, 1)).astype(np.float32)
        infos = [{"TimeLimit.truncated": bool(x)} for x in truncated]
        for buf in (theirs, ours):
            buf.add(obs, obs + 100, actions, rewards, dones, infos)
    np.random.seed(3)
    expected = theirs.sample(256, env=venv)
    np.random.seed(3)
    got = ours.sample(256, env=venv)
    full = torch.isclose(got.discounts, torch.tensor(0.9**3))
    assert full.any() and not full.all()  # returns of 3 steps and returns cut short
    assert got.dones.sum() > 0
    for name in ("observations", "actions", "next_observations", "dones", "rewards", "discounts"):
        a, b = getattr(got, name), getattr(expected, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


def test_n_steps_with_optimize_memory_usage_is_refused():
    with pytest.raises(NotImplementedError, match="optimize_memory_usage=False"):
        ReplayBuffer(16, BOX_OBS, ACTIONS, optimize_memory_usage=True, n_steps=3)


def test_a_memory_saving_buffer_of_one_row_per_env_is_refused():
    """Its only row's next observation would be the next row's: nothing could ever be sampled (SB3 fails inside
    NumPy at the first sample)."""
    with pytest.raises(ValueError, match=r"buffer_size=2 with optimize_memory_usage=True must be at least 2 \* n_envs"):
        ReplayBuffer(2, BOX_OBS, ACTIONS, n_envs=2, optimize_memory_usage=True)
    assert ReplayBuffer(4, BOX_OBS, ACTIONS, n_envs=2, optimize_memory_usage=True).capacity == 2


@pytest.mark.cpu
@pytest.mark.parametrize("dict_obs", [False, True], ids=["discrete", "dict-with-discrete"])
def test_discrete_observations_have_sb3s_layout(dict_obs):
    """A Discrete observation is ``(..., 1)`` in the arrays and in ``sample()``, as in SB3's buffers, and a
    plain index in covey's own batch."""
    from stable_baselines3.common.buffers import DictReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

    space = spaces.Dict({"k": spaces.Discrete(5), "x": BOX_OBS}) if dict_obs else spaces.Discrete(5)
    ours = ReplayBuffer(8, space, ACTIONS, n_envs=2)
    theirs = (DictReplayBuffer if dict_obs else SB3ReplayBuffer)(8, space, ACTIONS, n_envs=2)
    for t in range(3):
        codes = np.array([t, t + 1])
        obs = {"k": codes, "x": codes[:, None].astype(np.float32)} if dict_obs else codes
        nxt = {"k": codes + 1, "x": codes[:, None] + 1.0} if dict_obs else codes + 1
        for buf in (ours, theirs):
            buf.add(obs, nxt, np.zeros((2, 1)), np.zeros(2), np.zeros(2), [{}, {}])
    for name in ("observations", "next_observations"):
        a, b = getattr(ours, name), getattr(theirs, name)
        a, b = (a["k"], b["k"]) if dict_obs else (a, b)
        assert a.shape == b.shape == (4, 2, 1), name
        np.testing.assert_array_equal(a[:3], b[:3])
    np.random.seed(0)
    expected = theirs.sample(16)
    np.random.seed(0)
    got = ours.sample(16)
    a, b = (
        (got.observations["k"], expected.observations["k"]) if dict_obs else (got.observations, expected.observations)
    )
    assert a.shape == b.shape == (16, 1) and a.dtype == b.dtype and torch.equal(a, b)
    batch = ours.sample_batch(16).observations
    assert (batch["k"] if dict_obs else batch).shape[:1] == (16,)


def test_a_file_of_another_env_or_not_a_buffer_is_named_at_load(tmp_path):
    """A buffer file of other observations (a width of 1 was broadcast into every column, silently) or a model's
    .zip file is refused with what it is; the buffer is left as it was."""
    buf = make_buffer(10, memory=False)
    add_stream(buf, 3)
    buf.save(tmp_path / "buffer.npz")
    wide = ReplayBuffer(10 * N_ENVS, spaces.Box(-1, 1, (3,)), ACTIONS, N_ENVS)
    with pytest.raises(
        ValueError, match=r"holds obs/None of shape \(2, 1\) per step \(envs first\); this buffer stores \(2, 3\)"
    ):
        wide.load(tmp_path / "buffer.npz")
    assert wide.size() == 0 and not wide._obs[None].any()
    with np.load(tmp_path / "buffer.npz") as data:
        arrays = dict(data)
    arrays["obs/None"] = arrays["obs/None"][..., :0]
    np.savez(tmp_path / "narrow.npz", **arrays)
    with pytest.raises(ValueError, match=r"holds obs/None of shape \(2, 0\)"):
        make_buffer(10, memory=False).load(tmp_path / "narrow.npz")
    from covey import SAC

    SAC("MlpPolicy", "Pendulum-v1").save(tmp_path / "model.zip")
    with pytest.raises(ValueError, match=r"model.zip is not a replay buffer file"):
        make_buffer(10, memory=False).load(tmp_path / "model.zip")


def test_a_damaged_or_truncated_file_leaves_the_buffer_as_it_was(tmp_path):
    """Every array is read (its checksum checked) before any is written: a damaged late entry ('dones') raised only
    after the actions and rewards had been replaced, and training went on on the mixed buffer. A truncated file is
    named with its path."""
    import zipfile

    other = make_buffer(10, memory=False)
    add_stream(other, 7)
    other.save(tmp_path / "other.npz")
    raw = bytearray((tmp_path / "other.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "other.npz") as zf:
        info = zf.getinfo("dones.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size - 4
    raw[start : start + 4] = bytes(b ^ 0xFF for b in raw[start : start + 4])
    (tmp_path / "damaged.npz").write_bytes(bytes(raw))
    (tmp_path / "truncated.npz").write_bytes((tmp_path / "other.npz").read_bytes()[:200])

    buf = make_buffer(10, memory=False)
    add_stream(buf, 3)
    before = {name: np.copy(getattr(buf, name)) for name in ("actions", "rewards", "terminated", "dones")}
    observations, pos = np.copy(buf._obs[None]), buf.pos
    for name in ("damaged.npz", "truncated.npz"):
        with pytest.raises(ValueError, match=rf"{name} is a corrupt replay buffer file .*the buffer is unchanged"):
            buf.load(tmp_path / name)
        for key, value in before.items():
            np.testing.assert_array_equal(getattr(buf, key), value)
        np.testing.assert_array_equal(buf._obs[None], observations)
        assert buf.pos == pos


def _edited(arrays: dict, name: str) -> dict:
    """``arrays`` (a saved buffer's, 7 rows of 2 envs, one final observation) with one edit, as a damaged or
    hand-edited file holds them."""
    arrays = dict(arrays)
    if name == "no dones":
        del arrays["dones"]
    elif name == "short rewards":
        arrays["rewards"] = arrays["rewards"][:2]
    elif name == "position past the ring":
        arrays["meta"] = arrays["meta"].copy()
        arrays["meta"][2] = 9999
    elif name == "short meta":
        arrays["meta"] = arrays["meta"][:2]
    elif name == "returns of no buffer":
        arrays["returns"] = np.array([0, 1])
    elif name == "final row past the rows":
        arrays["final_index"] = np.array([[10**6, 0]])
    elif name == "no final observations":
        del arrays["final_obs/None"]
    else:  # "objects"
        arrays["actions"] = np.array([object()] * 7, dtype=object)
    return arrays


@pytest.mark.parametrize(
    "edit,message",
    [
        ("no dones", r"holds no 'dones'"),
        ("short rewards", r"holds 2 rows of rewards where its position says 7 were saved"),
        ("position past the ring", r"holds meta \[10, 2, 9999, 0, 0\].*position must lie in \[0, capacity\)"),
        ("short meta", r"holds a meta array of shape \(2,\)"),
        ("returns of no buffer", r"holds returns \[0, 1\] where covey's save_replay_buffer writes \(n_steps >= 1"),
        ("final row past the rows", r"final observations for rows or envs outside its 7 rows of 2 envs"),
        ("no final observations", r"holds final_obs/None of shape none"),
        ("objects", r"holds an array of Python objects"),
    ],
)
def test_an_edited_file_is_refused_by_name_before_the_buffer_changes(tmp_path, edit, message):
    """Names, rows, positions and final observations are checked before any array is written: a file without its
    dones replaced the actions and rewards before failing with a KeyError, one whose rewards were short filled the
    rest with zeros, and a position past the ring loaded and failed at the next step."""
    other = make_buffer(10, memory=False)
    add_stream(other, 7)
    other.final_observations = {(3, 1): {None: np.ones(1, np.float32)}}
    other.save(tmp_path / "other.npz")
    with np.load(tmp_path / "other.npz", allow_pickle=True) as data:
        np.savez(tmp_path / "edited.npz", **_edited(dict(data), edit))
    buf = make_buffer(10, memory=False)
    add_stream(buf, 3)
    before = {name: np.copy(getattr(buf, name)) for name in ("actions", "rewards", "terminated", "dones")}
    observations, pos, finals = np.copy(buf._obs[None]), buf.pos, sorted(buf.final_observations)
    with pytest.raises(ValueError, match=message):
        buf.load(tmp_path / "edited.npz")
    for key, value in before.items():
        np.testing.assert_array_equal(getattr(buf, key), value)
    np.testing.assert_array_equal(buf._obs[None], observations)
    assert buf.pos == pos and sorted(buf.final_observations) == finals


def test_a_file_that_cannot_be_read_is_closed(tmp_path):
    """The error leaves no file open: NumPy's np.load kept the file of a truncated archive open until the garbage
    collector found it (a ResourceWarning, an error under ``-W error``)."""
    import gc
    import warnings

    good = make_buffer(10, memory=False)
    add_stream(good, 3)
    good.save(tmp_path / "good.npz")
    (tmp_path / "truncated.npz").write_bytes((tmp_path / "good.npz").read_bytes()[:200])
    (tmp_path / "zip_header.npz").write_bytes(b"PK\x03\x04" + bytes(60))
    np.save(tmp_path / "array.npy", np.zeros(3))
    gc.collect()  # other tests' garbage (a logger's open file) is not this test's
    for name in ("truncated.npz", "zip_header.npz", "array.npy"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                make_buffer(10, memory=False).load(tmp_path / name)
            except ValueError as error:
                assert name in str(error)
            else:
                raise AssertionError(f"{name} was read as a replay buffer")
            gc.collect()
        unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        unclosed = [message for message in unclosed if str(tmp_path) in message]
        assert not unclosed, (name, unclosed)


def test_sacs_buffer_takes_sb3s_add_for_prefilled_demonstrations():
    """An SB3 script that fills model.replay_buffer with add(obs, next_obs, action, reward, done, infos) before
    learning: a done its info marks as a time limit keeps its bootstrap (unless handle_timeout_termination=False),
    as SB3 samples it, and infos of the wrong length are refused."""
    import stable_baselines3 as sb3

    from covey import SAC

    for kwargs in ({}, {"handle_timeout_termination": False}):
        buffers = [
            lib.SAC("MlpPolicy", "Pendulum-v1", replay_buffer_kwargs=kwargs, device="cpu").replay_buffer
            for lib in (sb3, __import__("covey"))
        ]
        obs = np.zeros((1, 3), np.float32)
        for t in range(6):
            done, info = t in (2, 5), {"TimeLimit.truncated": t == 5}  # a termination, then a time limit
            for buf in buffers:
                buf.add(
                    obs + t, obs + t + 1, np.full((1, 1), 0.1 * t, np.float32), np.array([t]), np.array([done]), [info]
                )
        np.random.seed(0)
        theirs = buffers[0].sample(64)
        np.random.seed(0)
        ours = buffers[1].sample(64)
        for name in ("observations", "actions", "next_observations", "dones", "rewards"):
            torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), msg=name)
        assert float(ours.dones.sum()) > 0
    with pytest.raises(ValueError, match="2 infos for 1 envs"):
        SAC("MlpPolicy", "Pendulum-v1").replay_buffer.add(
            obs, obs, np.zeros((1, 1)), np.zeros(1), np.zeros(1), [{}, {}]
        )


def test_discrete_actions_stored_as_integers():
    buf = ReplayBuffer(8, BOX_OBS, spaces.Discrete(3), n_envs=2)
    buf.store(make_obs([1, 2], False), make_obs([3, 4], False), np.array([2, 1]), np.zeros(2), np.zeros(2), np.zeros(2))
    assert buf.actions.dtype == np.int64 and buf.actions[0].tolist() == [2, 1]
    np.random.seed(0)
    assert set(buf.sample_batch(50).actions.tolist()) == {1, 2}


def test_circular_overwrite_wraps_and_size_caps():
    """Capacity 5 rows: after 8 steps rows hold steps [5, 6, 7, 3, 4] and pos = 8 % 5 = 3."""
    buf = make_buffer(5, memory=False)
    add_stream(buf, 5)
    assert buf.pos == 0 and buf.full and buf.size() == 5
    add_stream(buf, 3, start=5)  # steps 5, 6, 7 overwrite rows 0, 1, 2
    assert buf.pos == 3 and buf.full and buf.size() == 5  # capped at the capacity in rows
    assert buf.observations[:, 0, 0].tolist() == [code(t, 0) for t in (5, 6, 7, 3, 4)]
    # The same stream added in one go gives the same ring.
    other = make_buffer(5, memory=False)
    add_stream(other, 8)
    np.testing.assert_array_equal(other.observations, buf.observations)
    np.testing.assert_array_equal(other.next_observations, buf.next_observations)
    # Only the newest 5 steps can be sampled; overwritten steps 0..2 are gone.
    assert sampled_table(buf) == expected_table(3, 8)


def test_terminated_is_stored_apart_from_dones():
    """A time limit ends the episode (dones) but keeps the bootstrap (terminated = 0)."""
    buf = make_buffer(10, memory=False)
    add_stream(buf, 8)
    assert buf.dones[2, 0] and buf.terminated[2, 0] == 1.0  # terminated
    assert buf.dones[6, 0] and buf.terminated[6, 0] == 0.0  # truncated
    assert buf.dones[4, 1] and buf.terminated[4, 1] == 1.0
    assert buf.dones[5, 1] and buf.terminated[5, 1] == 0.0
    assert buf.dones.sum() == 4 and buf.terminated.sum() == 2
    # Sampled batches carry terminated, not dones.
    table = sampled_table(buf)
    assert (code(6, 0), 0.5 * code(6, 0), -float(code(6, 0)), final_code(6, 0), 0.0) in table
    assert (code(2, 0), 0.5 * code(2, 0), -float(code(2, 0)), final_code(2, 0), 1.0) in table


def test_next_observation_at_episode_end_is_the_final_observation():
    buf = make_buffer(10, memory=False)
    add_stream(buf, 8)
    assert buf.next_observations[2, 0, 0] == final_code(2, 0)
    assert buf.observations[3, 0, 0] == code(3, 0)  # the reset observation of the next episode
    assert buf.next_observations[3, 0, 0] == code(4, 0)


# ---------------------------------------------------------------------------- sampling: both modes, full table
@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_normal_mode_samples_every_stored_transition_exactly(dict_obs):
    buf = make_buffer(10, memory=False, dict_obs=dict_obs)
    add_stream(buf, 8, dict_obs)
    assert sampled_table(buf) == expected_table(0, 8)


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_memory_mode_matches_normal_mode_before_wrap(dict_obs):
    """Memory mode reads next obs from the next row, except at episode ends (kept final obs); the newest
    step (t = 7, its next row not written yet) is never sampled."""
    normal, memory = make_buffer(10, False, dict_obs), make_buffer(10, True, dict_obs)
    add_stream(normal, 8, dict_obs)
    add_stream(memory, 8, dict_obs)
    assert memory.next_observations is None
    assert sampled_table(memory) == expected_table(0, 7)
    assert sampled_table(memory) < sampled_table(normal)


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_memory_mode_matches_normal_mode_after_wrap(dict_obs):
    """Capacity 5, 8 steps: steps 3..7 are stored; memory mode can sample 3..6 (7 has no next row yet)."""
    normal, memory = make_buffer(5, False, dict_obs), make_buffer(5, True, dict_obs)
    add_stream(normal, 8, dict_obs)
    add_stream(memory, 8, dict_obs)
    assert sampled_table(normal) == expected_table(3, 8)
    assert sampled_table(memory) == expected_table(3, 7)


def test_memory_mode_never_samples_the_newest_row():
    for n in (2, 5, 9):
        buf = make_buffer(10, memory=True)
        add_stream(buf, n)
        newest = {code(n - 1, e) for e in range(N_ENVS)}
        assert not newest & {row[0] for row in sampled_table(buf)}


def test_memory_mode_never_samples_the_newest_row_once_full():
    buf = make_buffer(5, memory=True)
    add_stream(buf, 8)  # newest step 7 in row 2; oldest step 3 in row 3 (= pos)
    sampled = {row[0] for row in sampled_table(buf)}
    assert not {code(7, 0), code(7, 1)} & sampled
    assert {code(3, 0), code(3, 1)} <= sampled


def test_memory_mode_keeps_final_observations_only_for_stored_episode_ends():
    """Overwriting a row drops its kept final observations (no stale entries, no unbounded growth)."""
    buf = make_buffer(5, memory=True)
    add_stream(buf, 5)
    assert set(buf.final_observations) == {(2, 0), (4, 1)}
    add_stream(buf, 3, start=5)  # steps 5, 6, 7 overwrite rows 0, 1, 2
    # Stored episode ends: step 4 env 1 (row 4), step 5 env 1 (row 0), step 6 env 0 (row 1); the end of step 2
    # env 0 (row 2) was overwritten by step 7, which does not end an episode.
    assert set(buf.final_observations) == {(4, 1), (0, 1), (1, 0)}
    assert buf.final_observations[(1, 0)][None][0] == final_code(6, 0)
    assert buf.final_observations[(0, 1)][None][0] == final_code(5, 1)


def test_sampling_an_empty_or_one_step_buffer_raises():
    with pytest.raises(ValueError, match="empty"):
        make_buffer(5, memory=False).sample(4)
    buf = make_buffer(5, memory=True)
    add_stream(buf, 1)
    with pytest.raises(ValueError, match="two stored steps"):
        buf.sample(4)


# ---------------------------------------------------------------------------- files
def _assert_same_buffer(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert (a.pos, a.full, a.size()) == (b.pos, b.full, b.size())
    for key in a.spaces:
        np.testing.assert_array_equal(a._obs[key], b._obs[key])
        if a.next_observations is not None:
            np.testing.assert_array_equal(a._next_obs[key], b._next_obs[key])
    for name in ("actions", "rewards", "terminated", "dones"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert set(a.final_observations) == set(b.final_observations)
    for index, final in a.final_observations.items():
        for key in final:
            np.testing.assert_array_equal(final[key], b.final_observations[index][key])


@pytest.mark.parametrize("memory", [False, True], ids=["normal", "memory"])
@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
def test_save_load_round_trip(tmp_path, memory, dict_obs):
    buf = make_buffer(10, memory, dict_obs)
    add_stream(buf, 8, dict_obs)
    path = tmp_path / "buffer.npz"
    buf.save(path)
    with np.load(path, allow_pickle=False) as data:  # plain arrays only: no pickled objects
        for name in data.files:
            assert data[name].dtype != object
    loaded = make_buffer(10, memory, dict_obs)
    loaded.load(path)
    _assert_same_buffer(buf, loaded)
    if memory:
        assert set(loaded.final_observations) == {(2, 0), (6, 0), (4, 1), (5, 1)}
    # The loaded buffer samples the same transitions, final observations included.
    assert sampled_table(loaded) == expected_table(0, 7 if memory else 8)


def test_save_load_round_trip_of_a_full_ring(tmp_path):
    buf = make_buffer(5, memory=False)
    add_stream(buf, 8)
    buf.save(tmp_path / "ring.npz")
    loaded = make_buffer(5, memory=False)
    loaded.load(tmp_path / "ring.npz")
    _assert_same_buffer(buf, loaded)
    # Adding continues at the same ring position.
    add_stream(loaded, 1)
    assert loaded.pos == 4


@pytest.mark.parametrize("memory", [False, True], ids=["normal", "memory"])
def test_a_file_holds_only_the_rows_written_and_loading_it_clears_the_rest(tmp_path, memory):
    buf = make_buffer(1000, memory)
    add_stream(buf, 8)
    buf.save(tmp_path / "few.npz")
    with np.load(tmp_path / "few.npz", allow_pickle=False) as data:
        assert data["actions"].shape == (8, N_ENVS, 1) and data["obs/None"].shape == (8, N_ENVS, 1)
        assert ("next_obs/None" in data.files) != memory
        if not memory:
            assert data["next_obs/None"].shape == (8, N_ENVS, 1)
    # Into a buffer that held more steps: the rows after the file's are zeros again, as in a fresh buffer.
    loaded = make_buffer(1000, memory)
    add_stream(loaded, 30, start=100)
    loaded.load(tmp_path / "few.npz")
    _assert_same_buffer(buf, loaded)
    assert sampled_table(loaded) == expected_table(0, 7 if memory else 8)
    # A file of every row (as saved before only the written rows were) loads the same.
    every_row = {name: getattr(buf, name) for name in ("actions", "rewards", "terminated", "dones")}
    every_row["obs/None"] = buf._obs[None]
    if not memory:
        every_row["next_obs/None"] = buf._next_obs[None]
    with np.load(tmp_path / "few.npz", allow_pickle=False) as data:
        rest = {name: data[name] for name in data.files if name not in every_row}
    np.savez(tmp_path / "every_row.npz", **every_row, **rest)
    again = make_buffer(1000, memory)
    again.load(tmp_path / "every_row.npz")
    _assert_same_buffer(buf, again)


def test_load_into_a_buffer_of_another_shape_raises(tmp_path):
    buf = make_buffer(10, memory=False)
    add_stream(buf, 3)
    path = tmp_path / "buffer.npz"
    buf.save(path)
    with pytest.raises(ValueError, match="capacity"):
        make_buffer(8, memory=False).load(path)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        make_buffer(10, memory=True).load(path)
    with pytest.raises(ValueError, match="n_envs"):
        ReplayBuffer(20, BOX_OBS, ACTIONS, n_envs=1).load(path)


def test_an_empty_buffer_takes_no_memory_for_its_observations_until_they_are_stored():
    """A million observations of 100 floats (400 MB per array) with next observations: np.zeros_like wrote every
    page of the next observations at construction (+381 MiB resident before the first step), where SB3's buffer,
    as covey's now, takes memory as it fills."""
    import gc

    def resident_mib() -> float:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    gc.collect()
    before = resident_mib()
    buffer = ReplayBuffer(1_000_000, spaces.Box(-1, 1, (100,), np.float32), spaces.Box(-1, 1, (2,), np.float32))
    grown = resident_mib() - before
    assert buffer._obs[None].nbytes + buffer._next_obs[None].nbytes >= 800_000_000
    assert grown < 100, f"{grown:.0f} MiB resident for an empty buffer"
