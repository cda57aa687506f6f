"""Recurrent MA-POCA: the actor's memory per agent slot (reset where an agent's trajectory starts, so a dead
agent's memory is dropped), the critic's memory per group after pooling (advanced by the value path, read by
the baselines), recorded memories equal to a step-by-step run, the training path equal to the collection
path, and predict's state.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_group_env import ScriptedEnv

from covey import POCA
from covey.envs import EarlyExitEnv, GroupCueEnv
from covey.evaluation import evaluate_group
from covey.networks.memory import Memory
from covey.wrappers.group_env import GroupVecEnv

MEMORY = dict(memory=dict(hidden_size=8, sequence_length=4))


def reset(state, starts: np.ndarray):
    keep = torch.as_tensor(~np.asarray(starts).reshape(-1), dtype=torch.float32).view(1, -1, 1)
    return tuple(s * keep for s in state)


# ------------------------------------------------------------------------------------------------ the memory layer
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_memory_sequences_with_resets_equal_stepping(kind):
    """Resets inside a sequence zero the memory before that step; padding keeps it; ``run`` returns the state
    each step started from and the one after it."""
    torch.manual_seed(0)
    memory = Memory(3, 5, kind)
    x = torch.randn(2, 6, 3)
    valid = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    resets = torch.zeros(2, 6, dtype=torch.bool)
    resets[0, 3] = resets[1, 4] = True
    state = tuple(torch.randn(1, 2, 5) for _ in range(memory.n_state))
    started, finished = memory.run(x, state, valid, resets)
    with torch.no_grad():
        for row in range(2):
            s = tuple(x_[:, row : row + 1] for x_ in state)
            for t in range(6):
                if resets[row, t]:
                    s = tuple(torch.zeros_like(x_) for x_ in s)
                for i in range(memory.n_state):
                    torch.testing.assert_close(started[i][row, t], s[i][0, 0])
                if valid[row, t]:
                    _, s = memory.step(x[row : row + 1, t], s, torch.zeros(1, dtype=torch.bool))
                for i in range(memory.n_state):
                    torch.testing.assert_close(finished[i][row, t], s[i][0, 0])
    assert torch.equal(started[0][0, 1], state[0][0, 0])  # the padded step left the memory untouched
    assert torch.equal(started[0][0, 3], torch.zeros(5))  # reset
    torch.testing.assert_close(memory.sequences(x, state, valid, resets), finished[0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_reset_on_a_padding_step_is_ignored(kind):
    """Training pads sequences with another step's data, its reset flag included: a reset there must not
    wipe the memory the sequence starts from, on the step-by-step path or the fused one."""
    torch.manual_seed(2)
    memory = Memory(3, 5, kind)
    x = torch.randn(3, 4, 3)
    valid = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    state = tuple(torch.randn(1, 3, 5) for _ in range(memory.n_state))
    padding_resets = ~valid
    expected = memory.run(x, state, valid)[1][0]
    torch.testing.assert_close(memory.run(x, state, valid, padding_resets)[1][0], expected)
    torch.testing.assert_close(memory.sequences(x, state, valid, padding_resets)[valid], expected[valid])
    gap = valid.clone()
    gap[2, 1] = False  # not front-padded: the step-by-step path
    torch.testing.assert_close(memory.sequences(x, state, gap, ~gap)[gap], memory.run(x, state, gap)[1][0][gap])


# ------------------------------------------------------------------------------------------------ collection
@pytest.fixture(params=[(13, 2), (10, 1)], ids=["mid-episode", "copy-0-starts-an-episode"])
def scripted(request):
    """Two copies of ScriptedEnv (a, b at reset; c joins after 2 steps; a terminates at its 3rd; the copy ends
    at step 5 or 6), a few rollouts so memories cross rollout boundaries, then one more collected rollout.
    With 10 steps a rollout, the collected one starts an episode in copy 0 and goes on with one in copy 1 for 2
    steps: that sequence is padded at the front with copy 0's first step, where every slot starts."""
    n_steps, rollouts = request.param
    env = GroupVecEnv([lambda end=end: ScriptedEnv(end) for end in (5, 6)])
    model = POCA(
        "MlpLstmPolicy", env, n_steps=n_steps, batch_size=2 * n_steps, n_epochs=1, seed=0, policy_kwargs=MEMORY
    )
    model.learn(2 * n_steps * rollouts)
    _, callback = model._setup_learn(2 * n_steps, None, False, "test", False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def test_actor_memory_resets_where_each_agent_starts_and_drops_the_dead(scripted):
    rec, buf = scripted.recurrent, scripted.rollout_buffer
    present = buf.present_tensor.numpy()
    starts = rec.slot_starts & present  # a trajectory starts for a present agent
    for e, end in enumerate((5, 6)):
        for t in range(rec.n_steps):
            step = (scripted.num_timesteps // 2 - rec.n_steps + t) % end  # steps into the copy's episode
            a, b, c = starts[t, e]
            assert a == b == (step == 0), (e, t, step)  # a and b start with the episode
            assert c == (step == 2), (e, t, step)  # c joins after step 2 and acts from then on
            assert present[t, e, 0] == (step < 3)  # a is gone after terminating at step 3
    # where a trajectory starts, the recorded memory is a fresh one: nothing of a dead agent is passed on
    fresh = rec.actor_states[torch.as_tensor(starts)]
    assert fresh.shape[0] > 4 and not fresh.abs().any()
    continuing = rec.actor_states[torch.as_tensor(present & ~rec.slot_starts)]
    assert continuing.abs().sum(dim=(1, 2)).gt(0).all()


def test_old_log_probs_from_sequences_equal_acting_step_by_step(scripted):
    """Training's sequences (per slot, padded, reset inside a sequence where an agent joins) give the log-probs
    the actor had while acting, so the first epoch starts at ratio 1."""
    rec, buf, actor = scripted.recurrent, scripted.rollout_buffer, scripted.actor
    n = rec.n_envs * rec.n_slots
    state = tuple(rec.actor_states[0].reshape(n, -1, actor.memory.hidden_size)[:, i][None] for i in range(2))
    present = buf.present_tensor
    with torch.no_grad():
        for t in range(rec.n_steps):
            state = reset(state, rec.slot_starts[t])
            obs = buf.observations_tensor[t].reshape(n, -1)
            params, state = actor.forward_step(obs, state, torch.zeros(n, dtype=torch.bool))
            log_prob, _ = actor.evaluate_params(params, buf.actions_tensor[t].reshape(n))
            mask = present[t].reshape(n)
            torch.testing.assert_close(buf.log_probs_tensor[t].reshape(n)[mask], log_prob[mask], rtol=1e-5, atol=1e-6)


def test_critic_memory_recorded_and_read_like_a_step_by_step_run(scripted):
    """The group's memory before each step equals stepping the value path from the rollout's first memory
    (reset at episode starts); values come from the memory after the step, baselines read the memory before
    it without advancing it, and a leaver's bootstrap reads the memory after its last step."""
    rec, buf, critic = scripted.recurrent, scripted.rollout_buffer, scripted.critic
    head = critic.value_head
    state = tuple(rec.critic_states[0][:, i][None] for i in range(2))
    no_reset = torch.zeros(rec.n_envs, dtype=torch.bool)
    with torch.no_grad():
        for t in range(rec.n_steps):
            state = reset(state, rec.episode_starts[t])
            torch.testing.assert_close(rec.critic_states[t], torch.stack([s[0] for s in state], dim=1))
            before = state
            pooled = critic.pooled_value(buf.observations_tensor[t], buf.present_tensor[t])
            out, state = critic.memory.step(pooled, state, no_reset)
            torch.testing.assert_close(buf.values_tensor[t], head.value(critic.head(out)))
            baseline = critic.read(
                critic.pooled_baseline(buf.observations_tensor[t], buf.actions_tensor[t], buf.present_tensor[t]), before
            )
            torch.testing.assert_close(buf.baselines_tensor[t], head.value(baseline))
            continuing = critic.read(critic.pooled_value(buf.continuing_obs[t], buf.continuing_present[t]), state)
            torch.testing.assert_close(buf.continuing_values[t], head.value(continuing))
    # the memory carried into the next rollout is the one after the last step
    for carried, stepped in zip(rec.critic_state, state):
        torch.testing.assert_close(carried, stepped)


def test_training_outputs_equal_the_collection_outputs(scripted):
    """On sequences started from their recorded memories, the training path reproduces the collected values,
    baselines and log-probs at the same group-steps (before any update)."""
    rec, buf = scripted.recurrent, scripted.rollout_buffer
    rows = np.arange(rec.sequences.n_sequences)
    with torch.no_grad():
        log_prob, _, raw_value, raw_baseline, ema, batch = rec.outputs(scripted.actor, scripted.critic, None, buf, rows)
    head = scripted.critic.value_head
    torch.testing.assert_close(head.value(raw_value), batch.old_values)
    present = batch.present
    torch.testing.assert_close(head.value(raw_baseline)[present], batch.old_baselines[present])
    torch.testing.assert_close(log_prob, batch.old_log_prob[present])
    assert ema is None and len(batch.old_values) == rec.n_steps * rec.n_envs  # every group-step once


def test_baselines_read_the_memory_without_advancing_it():
    """Changing the actions taken changes the baselines but neither the values nor the recorded memories."""
    model = POCA("MlpLstmPolicy", EarlyExitEnv, n_envs=2, n_steps=8, seed=0, policy_kwargs=MEMORY)
    _, callback = model._setup_learn(16, None, False, "test", False)
    model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    rec, buf = model.recurrent, model.rollout_buffer
    values, baselines, memories = buf.values_tensor.clone(), buf.baselines_tensor.clone(), rec.critic_states.clone()
    rec.critic_state = tuple(rec.critic_states[0][:, i][None] for i in range(2))  # the same starting memory
    buf.actions_tensor = 1 - buf.actions_tensor
    model._evaluate_rollout()
    torch.testing.assert_close(buf.values_tensor, values)
    torch.testing.assert_close(rec.critic_states, memories)
    assert not torch.allclose(buf.baselines_tensor[buf.present_tensor], baselines[buf.present_tensor])


# ------------------------------------------------------------------------------------------------ the API
def test_predict_keeps_one_memory_per_agent_slot(tmp_path):
    model = POCA("MlpPolicy", GroupCueEnv, n_steps=8, seed=0, policy_kwargs=MEMORY)
    obs, _ = GroupCueEnv().reset(seed=0)
    actions, state = model.predict(obs)
    assert sorted(actions) == model.agent_ids and len(state) == 2 and state[0].shape == (1, 3, 8)
    # a subset of agents advances only its own slots
    _, moved = model.predict({"agent_1": obs["agent_1"]}, state=state)
    assert np.array_equal(moved[0][:, [0, 2]], state[0][:, [0, 2]])
    assert not np.allclose(moved[0][:, 1], state[0][:, 1])
    # episode_start for one agent (it just joined): its memory starts fresh, the others carry theirs
    _, joined = model.predict(obs, state=moved, episode_start={"agent_1": True})
    _, fresh = model.predict(obs, state=None)
    np.testing.assert_allclose(joined[0][:, 1], fresh[0][:, 1], atol=1e-6)
    _, carried = model.predict(obs, state=moved)
    np.testing.assert_allclose(joined[0][:, [0, 2]], carried[0][:, [0, 2]])
    assert not np.allclose(joined[0][:, 1], carried[0][:, 1])
    # an episode_start that names no agent of the group, or of another length, is refused (not ignored)
    with pytest.raises(ValueError, match=r"episode_start for agents \['agent1'\] that are not in this model's group"):
        model.predict(obs, state=moved, episode_start={"agent1": True})
    with pytest.raises(ValueError, match=r"one bool per observation given \(shape \(3,\).*got shape \(2,\)"):
        model.predict(obs, state=moved, episode_start=[True, False])
    # the array forms: (n_slots, ...) and (n_envs, n_slots, ...)
    stacked = np.stack([obs[a] for a in model.agent_ids])
    acts, s1 = model.predict(stacked)
    assert acts.shape == (3,) and s1[0].shape == (1, 3, 8)
    acts, s2 = model.predict(np.stack([stacked, stacked]), episode_start=np.array([True, False]))
    assert acts.shape == (2, 3) and s2[0].shape == (1, 6, 8)
    with pytest.raises(ValueError, match=r"shape \(1, 3, 8\)"):
        model.predict(obs, state=s2)
    # episode_start for the (n_envs, n_slots, ...) form: one bool, per copy, per slot or per row, the same resets
    pair = np.stack([stacked, stacked])
    _, moved2 = model.predict(pair, state=s2)
    per_slot = np.array([[True, False, True], [False, False, True]])
    expected = model.predict(pair, state=moved2, episode_start=per_slot)[1][0]
    np.testing.assert_array_equal(model.predict(pair, state=moved2, episode_start=per_slot.reshape(-1))[1][0], expected)
    assert not np.allclose(expected, model.predict(pair, state=moved2)[1][0])
    for everyone in (True, np.True_, [True, True], np.ones((2, 3), bool), np.ones(6, bool)):
        np.testing.assert_array_equal(model.predict(pair, state=moved2, episode_start=everyone)[1][0], s2[0])
    with pytest.raises(ValueError, match=r"episode_start of shape \(3,\) for observations of 2 env copies of 3"):
        model.predict(pair, state=moved2, episode_start=[True, False, True])
    feed_forward = POCA("MlpPolicy", GroupCueEnv, n_steps=8, seed=0)  # takes and ignores it, as SB3's do
    assert feed_forward.predict(pair, episode_start=True)[0].shape == (2, 3)
    # save/load keeps the memories' settings and acts the same from the same state
    model.save(tmp_path / "poca.zip")
    loaded = POCA.load(tmp_path / "poca.zip")
    assert loaded.actor.memory.hidden_size == 8 and loaded.critic.memory is not None
    assert loaded.recurrent.sequence_length == 4
    a1, m1 = model.predict(obs, state=moved, deterministic=True)
    a2, m2 = loaded.predict(obs, state=moved, deterministic=True)
    assert a1 == a2
    np.testing.assert_allclose(m1[0], m2[0])


def test_feed_forward_predict_passes_state_through():
    model = POCA("MlpPolicy", GroupCueEnv, n_steps=8, seed=0)
    obs, _ = GroupCueEnv().reset(seed=0)
    marker = (np.ones(1),)
    assert model.predict(obs, state=marker)[1] is marker


def test_evaluate_group_carries_the_memory():
    """A recurrent model is evaluated with its memory carried from step to step (a fresh one per episode)."""
    model = POCA("MlpPolicy", GroupCueEnv, n_steps=8, seed=0, policy_kwargs=MEMORY)
    calls = []
    predict = model.predict

    def spy(obs, state=None, episode_start=None, deterministic=False):
        calls.append((state, dict(episode_start)))
        return predict(obs, state, episode_start, deterministic)

    model.predict = spy
    evaluate_group(model, lambda: GroupCueEnv(delay=1), n_eval_episodes=2)
    assert len(calls) == 6  # 2 episodes of 3 steps
    assert calls[0][0] is None and all(calls[0][1].values())
    assert calls[1][0] is not None and not any(calls[1][1].values())
    assert all(calls[3][1].values())  # the second episode starts fresh


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_fused_sequences_equal_stepping_with_front_padding(kind):
    """The fused path (front padding, a reset only at a sequence's first real step) gives the step-by-step
    outputs and gradients on every real step; a reset later in a sequence or a gap takes the step-by-step path."""
    torch.manual_seed(1)
    memory = Memory(4, 6, kind)
    x = torch.randn(4, 5, 4, requires_grad=True)
    valid = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    resets = torch.zeros(4, 5, dtype=torch.bool)
    resets[1, 2] = resets[0, 0] = True  # at the first real step
    state = tuple(torch.randn(1, 4, 6) for _ in range(memory.n_state))
    fused = memory.sequences(x, state, valid, resets)
    stepped = memory.run(x, state, valid, resets)[1][0]
    torch.testing.assert_close(fused[valid], stepped[valid])
    (g_fused,) = torch.autograd.grad(fused[valid].square().sum(), x)
    (g_stepped,) = torch.autograd.grad(stepped[valid].square().sum(), x)
    torch.testing.assert_close(g_fused, g_stepped)
    # a reset in the middle of a sequence: still exact (it runs step by step)
    resets[0, 3] = True
    torch.testing.assert_close(
        memory.sequences(x, state, valid, resets)[valid], memory.run(x, state, valid, resets)[1][0][valid]
    )
    gap = valid.clone()
    gap[0, 2] = False
    torch.testing.assert_close(memory.sequences(x, state, gap)[gap], memory.run(x, state, gap)[1][0][gap])


class FailsAtThirdStep(GroupCueEnv):
    """GroupCueEnv whose third step (over the env's life) raises, as a crashing simulator would."""

    def __init__(self):
        super().__init__(delay=4)
        self.steps = 0

    def step(self, actions):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the simulator diverged")
        return super().step(actions)


@pytest.mark.parametrize("how", ["callback", "exception"])
def test_memories_after_a_rollout_cut_at_its_third_step_are_those_of_the_two_steps_taken(how):
    """Cut at its third step (not stored), by a callback's stop or by an env's exception, a rollout leaves the
    actor's and the critic's memories as a rollout of those two steps leaves them, so going on from that step's
    observations takes them in once (the actor's had taken them in, and the critic's had not moved)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAtThirdStep(BaseCallback):
        def _on_step(self) -> bool:
            return self.n_calls < 3

    def model(n_steps, env=GroupCueEnv):
        return POCA(
            "MlpPolicy",
            lambda: env(**({"delay": 4} if env is GroupCueEnv else {})),
            n_steps=n_steps,
            batch_size=2,
            n_epochs=1,
            seed=0,
            policy_kwargs=MEMORY,
        )

    reference = model(2)
    _, callback = reference._setup_learn(2, None, True, "test", False)
    # two steps, and the critic run through them
    assert reference.collect_rollouts(reference.env, callback, reference.rollout_buffer, reference.n_steps)
    if how == "callback":
        cut = model(8)
        _, callback = cut._setup_learn(8, StopAtThirdStep(), True, "test", False)
        assert not cut.collect_rollouts(cut.env, callback, cut.rollout_buffer, cut.n_steps)
    else:
        cut = model(8, FailsAtThirdStep)
        _, callback = cut._setup_learn(8, None, True, "test", False)
        with pytest.raises(RuntimeError, match="diverged"):
            cut.collect_rollouts(cut.env, callback, cut.rollout_buffer, cut.n_steps)
    np.testing.assert_array_equal(cut._last_obs, reference._last_obs)  # training goes on from the third step's
    for name in ("actor_state", "critic_state"):
        for got, want in zip(getattr(cut.recurrent, name), getattr(reference.recurrent, name), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
