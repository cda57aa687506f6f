"""Recurrent PPO: sequences cut by hand, memories recorded at sequence starts, SB3-contrib's predict."""

import numpy as np
import pytest
import torch
from envs import SpaceEnv
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnvWrapper

from covey import PPO
from covey.buffers.sequences import cut_sequences
from covey.envs import RememberCueEnv


def test_sequences_that_divide_the_length():
    """One env, 4 steps, one episode, L=2: two full sequences, no padding."""
    index, valid = cut_sequences(np.array([[1], [0], [0], [0]], bool), 2)
    assert index.tolist() == [[0, 1], [2, 3]]
    assert valid.all()


def test_sequences_that_do_not_divide_are_padded_at_the_front():
    """Two envs (time-major flat index t * 2 + n), 5 steps, L=3.

    env 0: episodes [0, 3) and [3, 5): 3 steps -> [0, 2, 4]; 2 steps -> [-1, 6, 8]
    env 1: one segment of 5 steps -> [-1, 1, 3] (padded first) and [5, 7, 9]
    """
    starts = np.zeros((5, 2), bool)
    starts[3, 0] = True
    index, valid = cut_sequences(starts, 3)
    assert index.tolist() == [[0, 2, 4], [-1, 6, 8], [-1, 1, 3], [5, 7, 9]]
    assert valid.tolist() == [[1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]]


def test_every_step_appears_once():
    rng = np.random.default_rng(0)
    starts = rng.random((37, 3)) < 0.2
    index, valid = cut_sequences(starts, 5)
    assert sorted(index[valid].tolist()) == list(range(37 * 3))
    assert np.all(valid[:, -1])  # only the front is ever padded


def lstm_ppo(env, n_steps: int) -> PPO:
    """A small LSTM policy that trains on whole rollouts of ``n_steps`` steps."""
    memory = dict(hidden_size=8, sequence_length=4)
    return PPO("MlpLstmPolicy", env, n_steps=n_steps, batch_size=n_steps, seed=0, policy_kwargs=dict(memory=memory))


@pytest.fixture
def collected():
    model = lstm_ppo(make_vec_env(lambda: RememberCueEnv(delay=2), n_envs=3, seed=0), n_steps=20)
    model.learn(60)  # a few rollouts so memories are carried across rollout boundaries
    _, callback = model._setup_learn(60, None, False, "test", False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def test_recorded_critic_memories_equal_a_step_by_step_run(collected):
    """The critic's memory recorded before each step equals running the critic step by step from the memory it
    had at the start of the rollout, resetting at episode starts."""
    rec = collected.recurrent
    buf = collected.rollout_buffer
    critic = collected.critic
    state = tuple(s.clone() for s in rec._start_critic_state)
    with torch.no_grad():
        for t in range(rec.n_steps):
            keep = torch.as_tensor(~rec.episode_starts[t], dtype=torch.float32).view(1, -1, 1)
            state = tuple(s * keep for s in state)
            torch.testing.assert_close(rec.critic_states[t], torch.stack([s[0] for s in state], dim=1))
            _, state = critic.raw_step(buf.observations_tensor[t], state, torch.zeros(rec.n_envs, dtype=torch.bool))


def test_old_log_probs_from_sequences_equal_the_acting_ones(collected):
    """Old log-probs computed over training sequences match the actor stepped through the rollout: the first
    epoch starts at ratio 1."""
    rec, buf, actor = collected.recurrent, collected.rollout_buffer, collected.actor
    state = None
    with torch.no_grad():
        for t in range(rec.n_steps):
            if t == 0:
                state = tuple(rec.actor_states[0][:, i].unsqueeze(0) for i in range(rec.actor_states.shape[2]))
            keep = torch.as_tensor(~rec.episode_starts[t], dtype=torch.float32).view(1, -1, 1)
            state = tuple(s * keep for s in state)
            params, state = actor.forward_step(
                buf.observations_tensor[t], state, torch.zeros(rec.n_envs, dtype=torch.bool)
            )
            log_prob, _ = actor.evaluate_params(params, buf.actions_tensor[t])
            torch.testing.assert_close(buf.log_probs_tensor[t], log_prob, rtol=1e-5, atol=1e-6)
    # and the padded sequences start from the recorded memory of their first real step
    seq = rec.sequences
    rows = np.arange(seq.n_sequences)
    first = seq.index[rows, seq.valid.argmax(axis=1)]
    init = seq.initial_states(rec.actor_states, rows)
    flat = rec.actor_states.reshape(-1, *rec.actor_states.shape[2:])
    torch.testing.assert_close(init[0][0], flat[torch.as_tensor(first)][:, 0])


def test_predict_follows_sb3_contrib(tmp_path):
    model = PPO(
        "MlpLstmPolicy",
        RememberCueEnv(),
        n_steps=16,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(memory=dict(hidden_size=8, sequence_length=4)),
    )
    obs = np.array([1.0, 0.0], np.float32)
    action, state = model.predict(obs)
    assert np.shape(action) == () and len(state) == 2 and state[0].shape == (1, 1, 8)
    # the state moves; episode_start resets it to a fresh memory
    _, moved = model.predict(obs, state=state, episode_start=np.array([False]))
    assert not np.allclose(moved[0], state[0])
    _, fresh = model.predict(obs, state=moved, episode_start=np.array([True]))
    np.testing.assert_allclose(fresh[0], state[0], rtol=1e-6, atol=1e-6)
    # a bool (a single env's done flag) is every row's, as in sb3-contrib for one observation
    _, fresh_from_bool = model.predict(obs, state=moved, episode_start=True)
    np.testing.assert_array_equal(fresh_from_bool[0], fresh[0])
    _, kept = model.predict(obs, state=state, episode_start=False)
    np.testing.assert_array_equal(kept[0], moved[0])
    with pytest.raises(
        ValueError, match=r"episode_start must be a bool or have shape \(1,\) \(or \(1, 1\)\), got \(2,\)"
    ):
        model.predict(obs, state=state, episode_start=[True, False])
    with pytest.raises(ValueError, match="state holds NaN or infinite values"):
        model.predict(obs, state=tuple(np.full_like(s, np.nan) for s in state))
    with pytest.raises(
        ValueError, match=r"a tuple of 2 arrays of shape \(1, 1, 8\).*got one ndarray of shape \(1, 1, 8\)"
    ):
        model.predict(obs, state=state[0])
    # batched: one memory per row
    actions, batched = model.predict(np.stack([obs, obs, obs]))
    assert actions.shape == (3,) and batched[0].shape == (1, 3, 8)
    # sb3-contrib's way to a fresh state for 3 envs, from the policy's lstm_hidden_state_shape: a zero state is
    # a fresh memory, as None is
    layers, _, hidden = model.policy.lstm_hidden_state_shape
    zeros = tuple(np.zeros((layers, 3, hidden), np.float32) for _ in state)
    assert (layers, hidden) == (1, 8)
    _, from_zeros = model.predict(np.stack([obs, obs, obs]), state=zeros)
    for a, b in zip(from_zeros, batched, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert not hasattr(PPO("MlpPolicy", RememberCueEnv()).policy, "lstm_hidden_state_shape")  # not recurrent
    with pytest.raises(ValueError, match=r"shape \(1, 3, 8\)"):
        model.predict(np.stack([obs, obs, obs]), state=state)
    # episode_start as a column (n, 1), which sb3-contrib flattens: the same resets as the flat array
    starts = np.array([True, False, True])
    _, moved3 = model.predict(np.stack([obs, obs, obs]), state=batched)
    flat = model.predict(np.stack([obs, obs, obs]), state=moved3, episode_start=starts)[1]
    column = model.predict(np.stack([obs, obs, obs]), state=moved3, episode_start=starts[:, None])[1]
    np.testing.assert_array_equal(column[0], flat[0])
    np.testing.assert_allclose(flat[0][:, 0], fresh[0][:, 0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="tuple of 2 arrays"):
        model.predict(obs, state=state[0])
    # save/load keeps the memory settings and predicts the same
    model.save(tmp_path / "r.zip")
    loaded = PPO.load(tmp_path / "r.zip")
    assert loaded.actor.memory.hidden_size == 8 and loaded.recurrent.sequence_length == 4
    a1, s1 = model.predict(obs, state=state, deterministic=True)
    a2, s2 = loaded.predict(obs, state=state, deterministic=True)
    assert a1 == a2
    np.testing.assert_allclose(s1[0], s2[0])


def test_gru_memory_and_separate_critic_memory():
    model = PPO(
        "MlpPolicy",
        RememberCueEnv(),
        n_steps=16,
        batch_size=16,
        seed=0,
        policy_kwargs=dict(memory=dict(hidden_size=8, sequence_length=4, kind="gru")),
    )
    assert model.actor.memory.kind == "gru" and model.critic.memory is not model.actor.memory
    model.learn(32)
    _, state = model.predict(np.zeros(2, np.float32))
    assert len(state) == 1
    with pytest.raises(ValueError, match="Unknown memory settings"):
        PPO("MlpPolicy", RememberCueEnv(), policy_kwargs=dict(memory=dict(size=8)))


def test_dict_observations_with_memory(tmp_path):
    """MultiInputLstmPolicy: Dict observations go through the encoder before the memory, in acting, in the
    critic's recorded run (incl. a time-limit bootstrap) and in the training sequences; old log-probs from the
    sequences equal the acting ones, and save/load predicts the same."""
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "tag": spaces.Discrete(4)})
    env = make_vec_env(
        lambda: SpaceEnv(obs_space, spaces.Discrete(2), episode_length=7, truncate=True), n_envs=2, seed=0
    )
    model = PPO(
        "MultiInputLstmPolicy",
        env,
        n_steps=12,
        batch_size=12,
        seed=0,
        policy_kwargs=dict(memory=dict(hidden_size=8, sequence_length=5)),
    )
    model.learn(48)
    _, callback = model._setup_learn(24, None, False, "test", False)
    # a rollout the networks have not been trained on yet
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    rec, buf, actor = model.recurrent, model.rollout_buffer, model.actor
    assert isinstance(buf.observations, dict) and np.abs(buf.truncation_values).sum() > 0
    state = tuple(rec.actor_states[0][:, i].unsqueeze(0) for i in range(2))
    with torch.no_grad():
        for t in range(rec.n_steps):
            keep = torch.as_tensor(~rec.episode_starts[t], dtype=torch.float32).view(1, -1, 1)
            state = tuple(s * keep for s in state)
            obs_t = {k: v[t] for k, v in buf.observations_tensor.items()}
            params, state = actor.forward_step(obs_t, state, torch.zeros(2, dtype=torch.bool))
            log_prob, _ = actor.evaluate_params(params, buf.actions_tensor[t])
            torch.testing.assert_close(buf.log_probs_tensor[t], log_prob, rtol=1e-5, atol=1e-6)
    obs = {"pos": np.zeros((2, 3), np.float32), "tag": np.array([1, 3])}
    model.save(tmp_path / "d.zip")
    a1, s1 = model.predict(obs, deterministic=True)
    a2, s2 = PPO.load(tmp_path / "d.zip").predict(obs, deterministic=True)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_allclose(s1[0], s2[0])


def test_a_shared_cnn_runs_once_per_minibatch_for_both_memories():
    """CnnLstmPolicy with the shared encoder (SB3's default): the actor's and the critic's memories read one
    pass of the CNN per minibatch, and the outputs are exactly those of running each network alone."""
    from envs import image_space

    from covey.networks.actor_critic import actor_critic_sequences

    env = make_vec_env(lambda: SpaceEnv(image_space((36, 36, 1)), spaces.Discrete(2), episode_length=6), n_envs=2)
    model = PPO("CnnLstmPolicy", env, n_steps=8, batch_size=8, n_epochs=2, seed=0)
    assert model.actor.encoder is model.critic.encoder
    model.learn(16)
    calls: list[int] = []
    model.actor.encoder.register_forward_hook(lambda mod, args, out: calls.append(out.shape[0]))
    minibatches = list(model.recurrent.minibatches(8))
    model.train()
    assert len(calls) == 2 * len(minibatches)  # n_epochs passes over the minibatches, one encoder call each

    rec, buffer = model.recurrent, model.rollout_buffer
    rows = minibatches[0]
    valid = rec.sequences.valid_tensor(rows)
    obs = rec.sequences.gather(buffer.flat_observations(), rows)
    actor_init = rec.sequences.initial_states(rec.actor_states, rows)
    critic_init = rec.sequences.initial_states(rec.critic_states, rows)
    with torch.no_grad():
        params, raw = actor_critic_sequences(model.actor, model.critic, obs, actor_init, critic_init, valid)
        torch.testing.assert_close(params, model.actor.forward_sequences(obs, actor_init, valid), rtol=0, atol=0)
        torch.testing.assert_close(raw, model.critic.raw_sequences(obs, critic_init, valid), rtol=0, atol=0)


class RecurrentActorCriticPolicy:
    """Stands for sb3_contrib.ppo_recurrent.MlpLstmPolicy, whose class has this name (matched by name)."""


def test_sb3_contrib_names_map_to_covey_and_its_options_are_taken_or_refused_with_covey_s():
    assert PPO(RecurrentActorCriticPolicy, "CartPole-v1", n_steps=16, batch_size=16).actor.memory is not None
    # the values that are covey's behaviour are accepted, sb3-contrib's defaults among them (lstm_kwargs=None)
    same = dict(n_lstm_layers=1, shared_lstm=False, enable_critic_lstm=True)
    for extra in (None, {}):
        PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(same, lstm_kwargs=extra))
    # NumPy's numbers and Python's truthiness, as sb3-contrib reads them
    PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(n_lstm_layers=np.int64(1), shared_lstm=0))
    PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(shared_lstm=np.False_, enable_critic_lstm=np.True_))
    with pytest.raises(ValueError, match="n_lstm_layers=True is sb3-contrib's RecurrentPPO setting"):
        PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(n_lstm_layers=True))
    # lstm_hidden_size is the memory's size, as sb3-contrib's: the same networks (parameters) as memory's
    sized = PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(same, lstm_hidden_size=64))
    own = PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(memory=dict(hidden_size=64)))
    assert sized.actor.memory.hidden_size == sized.critic.memory.hidden_size == 64
    assert [p.shape for p in sized.policy.parameters()] == [p.shape for p in own.policy.parameters()]
    with pytest.raises(ValueError, match="lstm_hidden_size=64 and memory hidden_size=32 both set"):
        PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(lstm_hidden_size=64, memory=dict(hidden_size=32)))
    with pytest.raises(ValueError, match="policy is 'MlpPolicy': use 'MlpLstmPolicy'"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(lstm_hidden_size=64))
    # the recurrent settings that are covey's behaviour are refused too without memory (SB3's MlpPolicy raises a
    # TypeError for them), not dropped
    with pytest.raises(ValueError, match="n_lstm_layers, enable_critic_lstm are sb3-contrib's settings of its .*Lstm"):
        PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(n_lstm_layers=1, enable_critic_lstm=True))
    with pytest.raises(ValueError, match="shared_lstm is sb3-contrib's setting.*policy is 'CnnPolicy': use 'CnnLstm"):
        PPO("CnnPolicy", "CartPole-v1", policy_kwargs=dict(shared_lstm=False))
    # with covey's own memory key the policy has memory, and the settings are read as with a *LstmPolicy name
    assert PPO("MlpPolicy", "CartPole-v1", policy_kwargs=dict(memory={}, n_lstm_layers=1)).actor.memory is not None
    refusals = {
        "n_lstm_layers": (2, "covey's memory has one layer"),
        "shared_lstm": (True, "the actor and the critic always have memories of their own"),
        "enable_critic_lstm": (False, "the critic always has a memory of its own"),
        "lstm_kwargs": (dict(dropout=0.1), r"covey's is memory=dict\(kind="),
    }
    for key, (value, message) in refusals.items():
        with pytest.raises(ValueError, match=rf"{key}=.* is sb3-contrib's RecurrentPPO setting; {message}"):
            PPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs={key: value})
    with pytest.raises(ValueError, match=r"Unknown policy 'LstmPolicy'.*'MlpLstmPolicy'"):
        PPO("LstmPolicy", "CartPole-v1")


def test_covey_ppo_has_sb3_contribs_recurrent_policy_names(tmp_path):
    """``from covey.ppo import MlpLstmPolicy`` (sb3-contrib's names, as covey.ppo has SB3's): passed as the policy
    they build the recurrent networks of that name, and their load reads a saved recurrent policy."""
    from covey.ppo import CnnLstmPolicy, MlpLstmPolicy, MultiInputLstmPolicy

    model = PPO(MlpLstmPolicy, "CartPole-v1", n_steps=16, batch_size=16).learn(16)
    assert model.policy_name == "MlpLstmPolicy" and model.actor.memory is not None
    image = SpaceEnv(spaces.Box(0, 255, (36, 36, 1), np.uint8), spaces.Discrete(2))
    assert PPO(CnnLstmPolicy, image, n_steps=16, batch_size=16).policy_name == "CnnLstmPolicy"
    keyed = SpaceEnv(spaces.Dict({"x": spaces.Box(-1, 1, (3,), np.float32)}), spaces.Discrete(2))
    assert PPO(MultiInputLstmPolicy, keyed, n_steps=16, batch_size=16).policy_name == "MultiInputLstmPolicy"
    model.policy.save(tmp_path / "policy")
    policy = MlpLstmPolicy.load(tmp_path / "policy.zip")
    obs = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(policy.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])


def test_sb3_contribs_policy_calls_with_memory_name_the_ways_that_work():
    """sb3-contrib's ``policy(obs, lstm_states, episode_starts, deterministic)`` and its siblings (its ONNX recipe
    wraps them) get covey's ways to act and export, not a bare TypeError; a policy without memory given such
    arguments says it has none."""
    recurrent = PPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    obs, states, starts = torch.zeros(2, 4), (torch.zeros(1, 2, 64), torch.zeros(1, 2, 64)), torch.ones(2)
    calls = {
        "forward": lambda p: p(obs, states, starts, True),
        "get_distribution": lambda p: p.get_distribution(obs, states, starts),
        "predict_values": lambda p: p.predict_values(obs, states, starts),
        "evaluate_actions": lambda p: p.evaluate_actions(obs, torch.zeros(2), states, starts),
    }
    for method, call in calls.items():
        with pytest.raises(NotImplementedError, match=rf"policy.{method} has no memory input .*export_onnx"):
            call(recurrent.policy)
    with pytest.raises(NotImplementedError, match=r"policy.forward has no memory input"):
        recurrent.policy(obs)
    plain = PPO("MlpPolicy", "CartPole-v1").policy
    for method, call in calls.items():
        with pytest.raises(TypeError, match=rf"policy.{method} got 2 arguments more .* no recurrent memory"):
            call(plain)


class IntegerDones(VecEnvWrapper):
    """A VecEnv that reports its dones as 0/1 integers, as some hand-written VecEnvs do."""

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        return obs, rewards, dones.astype(np.int64), infos


def test_integer_dones_reset_the_memory_as_boolean_ones():
    """Read as booleans, 0/1 dones reset the memories at episode starts (``~1`` on an int is -2: the memory
    was doubled and its sign flipped instead), so the run is the same, weight for weight."""
    weights = []
    for wrap in (lambda env: env, IntegerDones):
        model = lstm_ppo(wrap(make_vec_env(lambda: RememberCueEnv(delay=2), n_envs=2, seed=0)), n_steps=16).learn(64)
        assert model.recurrent.episode_starts.any()
        starts = torch.as_tensor(model.recurrent.episode_starts)
        assert model.recurrent.actor_states[starts].abs().max() == 0  # recorded after the reset
        weights.append(torch.cat([p.detach().flatten() for p in model.policy.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


class StopAtThirdStep(BaseCallback):
    def _on_step(self) -> bool:
        return self.n_calls < 3


class RaisesAtThirdStep(RememberCueEnv):
    def __init__(self):
        super().__init__(delay=20)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the simulator diverged")
        return super().step(action)


@pytest.mark.parametrize("how", ["callback", "exception"])
def test_memories_after_a_rollout_cut_at_its_third_step_are_those_of_the_steps_taken(how):
    """Cut at its third step (not stored), by a callback's stop or an env's exception, a rollout leaves both memories
    as after the two steps taken, so going on from that step's observation (SB3's _last_obs) takes it in once
    (sb3-contrib's memories are the last completed step's too). Before, an exception left the actor's memory past
    that observation and the critic's where the rollout began."""
    if how == "callback":
        model = lstm_ppo(RememberCueEnv(delay=20), n_steps=8)
        model.learn(100, callback=StopAtThirdStep())
    else:
        model = lstm_ppo(RaisesAtThirdStep(), n_steps=8)
        with pytest.raises(RuntimeError, match="diverged"):
            model.learn(100)
    assert model.rollout_buffer.pos == 2
    obs = model.rollout_buffer.observations_tensor[:, 0]
    for net, state in ((model.actor, model.recurrent.actor_state), (model.critic, model.recurrent.critic_state)):
        expected = net.memory.initial_state(1)
        with torch.no_grad():
            for t in range(2):
                _, expected = net.memory.encode_step(net.encoder, obs[t : t + 1], expected, torch.tensor([t == 0]))
        for got, want in zip(state, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    model.learn(16, reset_num_timesteps=False)  # goes on from there


class RecordsMemories(BaseCallback):
    """Records what a RecurrentPPO user's callback reads at each step: the observations, the episode starts and
    lstm_states."""

    def _on_training_start(self) -> None:
        self.seen = []

    def _on_step(self) -> bool:
        locals_ = self.locals
        pi = tuple(s.clone() for s in locals_["lstm_states"].pi)
        self.seen.append((locals_["obs_tensor"].clone(), locals_["episode_starts"].clone(), pi, locals_["lstm_states"]))
        return True


def test_callback_locals_hold_sb3_contribs_episode_starts_and_lstm_states():
    """lstm_states.pi is the actor's memory after each step (predict from the step before gives it again) and
    episode_starts the step's starts as a float tensor, as sb3-contrib's locals hold them (a KeyError before)."""
    model = lstm_ppo(make_vec_env(lambda: RememberCueEnv(delay=2), n_envs=2, seed=0), n_steps=8)
    callback = RecordsMemories()
    model._setup_learn(16, callback, True, "test", False)
    callback.on_training_start(locals(), globals())
    # with the weights that acted (learn would update them after)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    assert len(callback.seen) == 8
    state = None
    for t, (obs, starts, pi, whole) in enumerate(callback.seen):
        assert starts.dtype == torch.float32 and starts.shape == (2,)
        np.testing.assert_array_equal(starts.numpy(), model.recurrent.episode_starts[t])
        assert whole.vf is None and len(pi) == 2 and pi[0].shape == (1, 2, 8)
        _, state = model.predict(obs.numpy(), state=state, episode_start=starts.numpy())
        for got, want in zip(pi, state, strict=True):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert np.asarray(model.recurrent.episode_starts).sum() > 2  # episodes ended and restarted in the rollout


@pytest.mark.parametrize("episode", [3, 9, 200])
def test_a_minibatch_holds_batch_size_real_steps_however_short_the_episodes(episode):
    """sb3-contrib's RecurrentPPO counts batch_size in real steps: a rollout of 1024 steps in minibatches of 256
    is 4 minibatches, whatever the episodes. covey took batch_size // sequence_length sequences each, padding
    counted: 22 minibatches of about 47 real steps for 3-step episodes."""
    from covey.agents.recurrent import Sequences

    starts = np.zeros((1024, 2), dtype=bool)
    starts[::episode, 0] = True
    starts[1::episode, 1] = True
    sequences = Sequences(starts, 16)
    np.random.seed(0)
    batches = list(sequences.minibatches(256))
    assert len(batches) == 8  # 2048 real steps
    real = [int(sequences.valid[rows].sum()) for rows in batches]
    assert sum(real) == 2048 and max(abs(n - 256) for n in real) < 16  # within one sequence of batch_size
    assert sorted(np.concatenate(batches).tolist()) == list(range(sequences.n_sequences))  # each sequence once
