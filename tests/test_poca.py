"""MA-POCA: the attention critic's invariances, gradient isolation of the loss, posthumous credit in the
returns, the agent's SB3-style API, bad input, and PettingZoo MPE envs (parallel and AEC).

Everything here is small and fast (tiny rollouts, a few updates): this checks wiring and maths, not learning.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import re
import warnings
import zipfile

import numpy as np
import pytest
import supersuit
import torch
from envs import DictTeam, NormExtractor
from gymnasium import spaces
from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo import ParallelEnv
from stable_baselines3.common.logger import configure

from covey import POCA, PPO
from covey.agents import poca as poca_module
from covey.agents.poca import poca_loss
from covey.agents.ppo import clipped_surrogate_loss, value_loss
from covey.buffers.group import GroupBatch, GroupRolloutBuffer
from covey.envs import EarlyExitEnv
from covey.evaluation import evaluate_group
from covey.networks import attention as attention_module
from covey.networks.attention import POCACritic, ResidualSelfAttention, _poca_sets, masked_mean, set_attention
from covey.networks.encoders import FlattenEncoder, NatureCNN, obs_dtype
from covey.networks.twohot import make_value_head
from covey.serialization import SETTINGS_ENTRY
from covey.wrappers.group_env import GroupVecEnv

OBS_DIM = 5
N_SLOTS = 4
BATCH = 8


# ============================================================================================ 1. critic invariances

CRITIC_CASES = {
    "discrete-scalar": (spaces.Discrete(3), "scalar"),
    "box-scalar": (spaces.Box(-1.0, 1.0, (2,), np.float32), "scalar"),
    "discrete-twohot": (spaces.Discrete(3), "twohot"),
    "box-twohot": (spaces.Box(-1.0, 1.0, (2,), np.float32), "twohot"),
}


def make_critic(action_space: spaces.Space, head: str, seed: int = 0) -> POCACritic:
    torch.manual_seed(seed)
    critic = POCACritic(
        FlattenEncoder(spaces.Box(-1.0, 1.0, (OBS_DIM,))), action_space, lambda d: make_value_head(d, 1, head)
    )
    if head == "twohot":
        # The two-hot head starts at zero (every prediction 0): give it weights so outputs depend on inputs.
        torch.nn.init.normal_(critic.value_head.proj.weight, std=0.05)
    return critic.eval()


def random_actions(action_space: spaces.Space, *lead: int, generator: torch.Generator) -> torch.Tensor:
    if isinstance(action_space, spaces.Discrete):
        return torch.randint(0, int(action_space.n), lead, generator=generator)
    return torch.rand(*lead, *action_space.shape, generator=generator) * 2 - 1


def other_action(action_space: spaces.Space, actions: torch.Tensor) -> torch.Tensor:
    """A different valid action for every entry of ``actions`` (same shape)."""
    if isinstance(action_space, spaces.Discrete):
        return (actions + 1) % int(action_space.n)
    return -actions + 0.5 * torch.sign(actions)  # another point inside [-1, 1], far from the first


def group_inputs(action_space: spaces.Space, seed: int = 1):
    """obs (B, S, OBS_DIM), actions (B, S, ...), present (B, S) with a mix of 1..S agents per row."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.rand(BATCH, N_SLOTS, OBS_DIM, generator=g) * 2 - 1
    actions = random_actions(action_space, BATCH, N_SLOTS, generator=g)
    present = torch.rand(BATCH, N_SLOTS, generator=g) < 0.6
    present[0] = True  # all present
    present[1] = torch.tensor([False, False, True, False])  # one agent
    present[2] = torch.tensor([True, False, True, False])
    present[3] = torch.tensor([False, True, True, True])
    present[:, 0] |= ~present.any(1)  # every row has someone
    return obs, actions, present


def outputs(critic: POCACritic, obs, actions, present):
    with torch.no_grad():
        return critic.value(obs, present), critic.baseline(obs, actions, present)


def close(a: torch.Tensor, b: torch.Tensor, head: str) -> bool:
    rtol = 1e-4 if head == "twohot" else 1e-5  # symexp amplifies float32 noise
    return torch.allclose(a, b, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_critic_output_shapes_and_finite(case):
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    value, baseline = outputs(critic, obs, actions, present)
    assert value.shape == (BATCH,)
    assert baseline.shape == (BATCH, N_SLOTS)
    assert torch.isfinite(value).all() and torch.isfinite(baseline).all()
    # Not a constant function (the checks below would be vacuous otherwise).
    assert value.std() > 1e-4
    assert baseline[present].std() > 1e-4


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_critic_is_invariant_to_slot_order(case, grad):
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    perm = torch.tensor([2, 0, 3, 1])
    with torch.set_grad_enabled(grad):
        value = critic.value(obs, present).detach()
        baseline = critic.baseline(obs, actions, present).detach()
        value_p = critic.value(obs[:, perm], present[:, perm]).detach()
        baseline_p = critic.baseline(obs[:, perm], actions[:, perm], present[:, perm]).detach()
    assert close(value_p, value, head)
    # The baselines follow their agents: slot k of the permuted group is slot perm[k] of the original.
    pp = present[:, perm]
    assert close(baseline_p[pp], baseline[:, perm][pp], head)


@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_critic_ignores_the_content_of_absent_slots(case):
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    absent = ~present
    obs0 = torch.where(present[..., None], obs, torch.zeros(()))
    value, baseline = outputs(critic, obs0, actions, present)
    for fill in (1e6, float("nan"), -float("inf")):
        obs_g = obs.clone()
        obs_g[absent] = fill
        actions_g = actions.clone()
        if isinstance(action_space, spaces.Discrete):
            actions_g[absent] = 10**6  # out of range: must not matter
        else:
            actions_g[absent] = fill
        value_g, baseline_g = outputs(critic, obs_g, actions_g, present)
        assert torch.isfinite(value_g).all() and torch.isfinite(baseline_g[present]).all(), fill
        assert close(value_g, value, head), fill
        assert close(baseline_g[present], baseline[present], head), fill


@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_critic_padding_slots_change_nothing(case):
    """A group of 2 agents gives the same value and baselines in 2 slots as in 4 slots with 2 absent."""
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, _ = group_inputs(action_space)
    present = torch.zeros(BATCH, N_SLOTS, dtype=torch.bool)
    present[:, [1, 3]] = True
    value, baseline = outputs(critic, obs, actions, present)
    value_2, baseline_2 = outputs(critic, obs[:, [1, 3]], actions[:, [1, 3]], present[:, [1, 3]])
    assert close(value, value_2, head)
    assert close(baseline[:, [1, 3]], baseline_2, head)


@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_critic_one_agent_all_agents_and_empty_rows(case):
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    for mask in (
        torch.zeros_like(present).index_fill_(1, torch.tensor([2]), True),  # one agent (slot 2) everywhere
        torch.ones_like(present),  # everyone
    ):
        value, baseline = outputs(critic, obs, actions, mask)
        assert torch.isfinite(value).all() and torch.isfinite(baseline).all()
    # One agent alone: its value in a 1-slot group equals that in a padded group.
    one = torch.zeros_like(present)
    one[:, 2] = True
    v_padded, b_padded = outputs(critic, obs, actions, one)
    v_alone, b_alone = outputs(critic, obs[:, 2:3], actions[:, 2:3], one[:, 2:3])
    assert close(v_padded, v_alone, head)
    assert close(b_padded[:, 2:3], b_alone, head)

    # A row with nobody present: finite, and the other rows are unaffected by it.
    with_empty = present.clone()
    with_empty[4] = False
    value, baseline = outputs(critic, obs, actions, with_empty)
    assert torch.isfinite(value).all() and torch.isfinite(baseline).all()
    keep = torch.arange(BATCH) != 4
    v_rest, b_rest = outputs(critic, obs[keep], actions[keep], with_empty[keep])
    assert close(value[keep], v_rest, head)
    assert close(baseline[keep], b_rest, head)
    # ... also with grad enabled (the slow attention path) and in training mode.
    critic.train()
    value_t = critic.value(obs, with_empty)
    baseline_t = critic.baseline(obs, actions, with_empty)
    assert torch.isfinite(value_t).all() and torch.isfinite(baseline_t).all()
    (value_t.sum() + baseline_t.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in critic.parameters() if p.grad is not None)


@pytest.mark.parametrize("case", list(CRITIC_CASES))
def test_baseline_marginalizes_own_action_but_not_groupmates(case):
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    _, baseline = outputs(critic, obs, actions, present)
    for i in range(N_SLOTS):
        changed = actions.clone()
        changed[:, i] = other_action(action_space, actions[:, i])
        _, baseline_c = outputs(critic, obs, changed, present)
        rows = present[:, i]
        # Agent i's own action does not enter its baseline ...
        assert close(baseline_c[rows, i], baseline[rows, i], head), i
        # ... but it enters every groupmate's baseline (for some sample).
        for j in range(N_SLOTS):
            both = rows & present[:, j]
            if j != i and both.any():
                diff = (baseline_c[both, j] - baseline[both, j]).abs().max()
                assert diff > 1e-6, (i, j)
    # And the value does not depend on actions at all (it takes none).


def test_value_depends_on_every_present_agent():
    critic = make_critic(spaces.Discrete(3), "scalar")
    obs, actions, present = group_inputs(spaces.Discrete(3))
    value, _ = outputs(critic, obs, actions, present)
    for s in range(N_SLOTS):
        changed = obs.clone()
        changed[:, s] = -changed[:, s]
        value_c, _ = outputs(critic, changed, actions, present)
        assert (value_c - value)[present[:, s]].abs().max() > 1e-6
        assert close(value_c[~present[:, s]], value[~present[:, s]], "scalar")


@pytest.mark.parametrize("case", ["discrete-scalar", "box-twohot"])
def test_critic_sets_equal_the_attention_block_on_each_set(case):
    """The critic scores every pair of entities once and shares the scores between the value's set and every
    agent's baseline set; that equals running the attention block on each set alone (outputs and gradients)."""
    action_space, head = CRITIC_CASES[case]
    critic = make_critic(action_space, head)
    obs, actions, present = group_inputs(action_space)
    present[4] = False  # nobody: every set attends to its (zero) entities
    params = list(critic.parameters())
    results = []
    for pooled in (critic.pooled, critic.pooled_per_set):
        value, baseline = pooled(obs, actions, present)
        loss = (value * torch.linspace(-1, 1, value.shape[-1])).sum() + baseline[present].square().sum()
        results.append((value, baseline, torch.autograd.grad(loss, params, allow_unused=True)))
    (value, baseline, grad), (value_ref, baseline_ref, grad_ref) = results
    torch.testing.assert_close(value, value_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(baseline[present], baseline_ref[present], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(baseline).all()
    for g, g_ref in zip(grad, grad_ref):
        assert (g is None) == (g_ref is None)
        if g is not None:
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)


def _set_attention_inputs(dtype: torch.dtype = torch.float32):
    """Queries, keys and values of 2 x 3 entities in 5 groups, 2 heads, with the POCA sets' masks; group 4 has
    nobody present (its sets attend to all their members)."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(5, 6, 3 * 8, generator=g, dtype=dtype)
    present = torch.rand(5, 3, generator=g) > 0.3
    present[4] = False
    queries, members = _poca_sets(3, qkv.device)
    attend = members & present.repeat(1, 2)[:, None, :]
    attend = attend | (members & ~attend.any(dim=-1, keepdim=True))
    return qkv, queries, attend


def _set_attention_by_hand_and_autograd(qkv, queries, attend):
    """``(output, d(loss)/d(qkv))`` of :class:`_SetAttention` and then of :func:`set_attention` (2 heads), for one
    fixed linear loss of the output."""
    grad_out = torch.randn(qkv.shape[0], len(queries), 8, generator=torch.Generator().manual_seed(1))
    results = []
    for fn in (attention_module._SetAttention.apply, set_attention):
        x = qkv.clone().requires_grad_()
        out = fn(x, queries, attend, 2)
        (grad,) = torch.autograd.grad((out * grad_out).sum(), [x])
        results.append((out, grad))
    return results


def test_set_attention_by_hand_equals_autograd_and_passes_gradcheck():
    qkv, queries, attend = _set_attention_inputs()
    (out, grad), (out_ref, grad_ref) = _set_attention_by_hand_and_autograd(qkv, queries, attend)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-6)
    qkv64, queries, attend = _set_attention_inputs(torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: attention_module._SetAttention.apply(x, queries, attend, 2), (qkv64.requires_grad_(),)
    )


def test_set_attention_by_hand_floors_only_what_float32_cannot_see_and_zeroes_the_unattended():
    """The hand-written softmax exponentiates shifted scores floored at -30 (exp of -inf or of underflowing
    numbers is slow on some CPUs) and zeroes masked entries. With some rows' scores over 1,000 apart it still
    gives autograd's outputs and gradients, and an entity that no row attends to gets no gradient at all through
    its key or value."""
    qkv, queries, attend = _set_attention_inputs()
    qkv[:, 1, 8:16] *= 300.0  # entity 1's keys: its scores dwarf the others' (theirs underflow)
    attend = attend.clone()
    attend[..., 5] = False  # nobody attends to entity 5 ...
    attend[:, :, 0] |= ~attend.any(dim=-1)  # ... and every row still attends to someone
    (out, grad), (out_ref, grad_ref) = _set_attention_by_hand_and_autograd(qkv, queries, attend)
    assert out_ref.abs().max() > 0.1 and grad_ref.abs().max() > 0.1
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-6)
    assert (grad[:, 5, 8:] == 0).all()  # entity 5's keys and values: exactly zero
    assert grad[:, 5, :8].abs().max() > 0  # its queries (rows of sets it is in) still learn


def test_critic_raw_equals_the_head_on_each_sets_pooled_features():
    """``raw`` runs the trunk and head once on the value's and every baseline's pooled features together."""
    critic = make_critic(*CRITIC_CASES["discrete-twohot"])
    obs, actions, present = group_inputs(spaces.Discrete(3))
    with torch.no_grad():
        raw_value, raw_baseline = critic.raw(obs, actions, present)
        value, baseline = critic.pooled_per_set(obs, actions, present)
        torch.testing.assert_close(raw_value, critic.head(value), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(raw_baseline[present], critic.head(baseline)[present], rtol=1e-5, atol=1e-5)
    assert raw_value.shape == (BATCH, critic.value_head.proj.out_features)
    assert raw_baseline.shape == (BATCH, N_SLOTS, critic.value_head.proj.out_features)


def test_critic_trains_after_its_first_call_ran_in_inference_mode():
    """The POCA sets are built once and shared; built first under ``torch.inference_mode`` (acting, evaluating),
    they must still be usable in a training pass (autograd cannot save inference tensors for backward)."""
    attention_module._poca_sets.cache_clear()
    critic = make_critic(*CRITIC_CASES["discrete-scalar"])
    obs, actions, present = group_inputs(spaces.Discrete(3))
    with torch.inference_mode():
        critic.raw(obs, actions, present)
    raw_value, raw_baseline = critic.raw(obs, actions, present)
    (raw_value.sum() + raw_baseline[present].sum()).backward()
    assert critic.attention.attention.in_proj_weight.grad.abs().sum() > 0


def test_set_attention_takes_autograd_when_switched_off_or_under_autocast(monkeypatch):
    attention = ResidualSelfAttention(8, 2)
    qkv, queries, attend = _set_attention_inputs()
    x = qkv[..., :8].clone().requires_grad_()
    members = attend[0] | True  # every entity in every set
    present = torch.ones(5, 6, dtype=torch.bool)

    def backward_of_attention() -> str:
        out = attention.attend_sets(x, attention.project(x), queries, members, present)
        # every node of the graph; `seen` keeps the nodes' Python objects alive, so that no id is reused
        names, seen, stack = set(), {}, [out.grad_fn]
        while stack:
            fn = stack.pop()
            if fn is not None and id(fn) not in seen:
                seen[id(fn)] = fn
                names.add(type(fn).__name__)
                stack.extend(next_fn for next_fn, _ in fn.next_functions)
        return "by hand" if "_SetAttentionBackward" in names else "autograd"

    assert backward_of_attention() == "by hand"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert backward_of_attention() == "autograd"
    monkeypatch.setattr(attention_module, "SET_ATTENTION_BY_HAND", False)
    assert backward_of_attention() == "autograd"


def test_masked_mean_and_attention_ignore_absent_entities():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, 8, generator=g)
    present = torch.tensor([[True, False, True, False], [True, True, True, True], [False] * 4])
    mean = masked_mean(x, present)
    torch.testing.assert_close(mean[0], (x[0, 0] + x[0, 2]) / 2)
    torch.testing.assert_close(mean[1], x[1].mean(0))
    torch.testing.assert_close(mean[2], torch.zeros(8))  # nobody: zeros

    torch.manual_seed(0)
    attention = ResidualSelfAttention(8, 2).eval()
    garbage = x.clone()
    garbage[~present] = 1e4
    with torch.no_grad():
        out, out_g = attention(x, present), attention(garbage, present)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[present], out_g[present])
    with pytest.raises(ValueError, match="divisible"):
        ResidualSelfAttention(10, 4)


# ============================================================================================ 2. gradient isolation


@pytest.fixture(scope="module")
def rollout_model():
    torch.set_num_threads(1)
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0)
    _, cb = model._setup_learn(32, None, True, "t", False)
    assert model.collect_rollouts(model.env, cb, model.rollout_buffer, model.n_steps)
    return model


def grads(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor | None]:
    return list(torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True))


def no_gradient(gs) -> bool:
    return all(g is None or not g.any() for g in gs)


def some_gradient(gs) -> bool:
    return any(g is not None and bool(g.abs().sum() > 0) for g in gs)


def test_actor_and_critic_share_no_parameters(rollout_model):
    actor_ids = {id(p) for p in rollout_model.actor.parameters()}
    critic_ids = {id(p) for p in rollout_model.critic.parameters()}
    assert actor_ids and critic_ids and not actor_ids & critic_ids
    assert len(rollout_model._params) == len(actor_ids) + len(critic_ids)


def test_critic_losses_reach_only_the_critic(rollout_model):
    model = rollout_model
    actor, critic = model.actor, model.critic
    batch = next(model.rollout_buffer.minibatches(32))
    present = batch.present
    assert present.any()
    clip = model.clip_range(1.0)
    returns = batch.returns[present]
    raw_value = critic.raw_value(batch.observations, present)
    raw_value = raw_value[:, None].expand(-1, present.shape[1])[present]
    old_values = batch.old_values[:, None].expand_as(present)[present]
    v_loss = value_loss(raw_value, old_values, returns, clip)
    raw_baseline = critic.raw_baseline(batch.observations, batch.actions, present)[present]
    b_loss = value_loss(raw_baseline, batch.old_baselines[present], returns, clip)
    for loss in (v_loss, b_loss):
        assert no_gradient(grads(loss, list(actor.parameters())))
        assert some_gradient(grads(loss, list(critic.parameters())))


def test_policy_loss_reaches_only_the_actor(rollout_model):
    model = rollout_model
    actor, critic = model.actor, model.critic
    batch = next(model.rollout_buffer.minibatches(32))
    present = batch.present
    log_prob, entropy = actor.evaluate(batch.observations[present], batch.actions[present])
    advantages = batch.advantages[present]
    assert advantages.abs().sum() > 0
    policy_loss, _, _ = clipped_surrogate_loss(log_prob, batch.old_log_prob[present], advantages, 0.2)
    for loss in (policy_loss, entropy.mean()):
        assert no_gradient(grads(loss, list(critic.parameters())))
        assert some_gradient(grads(loss, list(actor.parameters())))


def test_poca_loss_without_critic_weight_leaves_the_critic_alone(rollout_model):
    model = rollout_model
    buf = model.rollout_buffer
    for t in (
        buf.advantages_tensor,
        buf.returns_tensor,
        buf.values_tensor,
        buf.baselines_tensor,
        buf.continuing_values,
        buf.log_probs_tensor,
    ):
        assert not t.requires_grad
    batch = next(buf.minibatches(32))
    assert not batch.advantages.requires_grad and not batch.returns.requires_grad
    critic_params, actor_params = list(model.critic.parameters()), list(model.actor.parameters())

    cfg0 = dataclasses.replace(model.config, vf_coef=0.0)
    loss0, stats0 = poca_loss(batch, model.actor, model.critic, 0.2, cfg0)
    assert no_gradient(grads(loss0, critic_params))
    assert some_gradient(grads(loss0, actor_params))
    assert all(not v.requires_grad for v in stats0.values())

    loss, stats = poca_loss(batch, model.actor, model.critic, 0.2, model.config)
    assert some_gradient(grads(loss, critic_params)) and some_gradient(grads(loss, actor_params))
    assert set(stats) >= {"policy_gradient_loss", "value_loss", "baseline_loss", "entropy", "approx_kl"}
    # First update of a rollout: the policy has not moved yet.
    assert stats["approx_kl"].abs() < 1e-5 and stats["clip_fraction"] == 0


def test_all_present_minibatch_takes_its_agent_steps_by_reshape_with_the_same_results(rollout_model, monkeypatch):
    """A minibatch whose every slot is present takes the present agent-steps as a reshape: the loss, statistics
    and gradients equal the boolean index's to the bit. A minibatch with an absent slot indexes."""
    model = rollout_model
    batch = next(model.rollout_buffer.minibatches(32))
    everyone = batch.present.all(1)
    assert everyone.any() and not everyone.all()  # EarlyExitEnv's agents leave
    full = GroupBatch(*(field[everyone] for field in batch))
    params = [*model.actor.parameters(), *model.critic.parameters()]
    for minibatch, reshaped in ((full, True), (batch, False)):
        x = minibatch.observations
        assert (poca_module._present_rows(minibatch.present)(x).data_ptr() == x.data_ptr()) is reshaped
        results = []
        for setting in (True, False):
            monkeypatch.setattr(poca_module, "RESHAPE_WHEN_ALL_PRESENT", setting)
            loss, stats = poca_loss(minibatch, model.actor, model.critic, 0.2, model.config)
            results.append((loss, stats, torch.autograd.grad(loss, params)))
        (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
        assert torch.equal(loss_a, loss_b)
        assert all(torch.equal(stats_a[key], stats_b[key]) for key in stats_b)
        assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def test_rollout_buffer_is_consistent_with_the_critic(rollout_model):
    """The stored values and baselines are the critic's outputs on the stored group-steps."""
    model = rollout_model
    buf = model.rollout_buffer
    with torch.no_grad():
        values = model.critic.value(buf.flat(buf.observations_tensor), buf.flat(buf.present_tensor))
        baselines = model.critic.baseline(
            buf.flat(buf.observations_tensor), buf.flat(buf.actions_tensor), buf.flat(buf.present_tensor)
        )
    torch.testing.assert_close(buf.flat(buf.values_tensor), values, rtol=1e-5, atol=1e-5)
    present = buf.flat(buf.present_tensor)
    torch.testing.assert_close(buf.flat(buf.baselines_tensor)[present], baselines[present], rtol=1e-5, atol=1e-5)
    assert (buf.advantages_tensor[~buf.present_tensor] == 0).all()
    torch.testing.assert_close(
        buf.advantages_tensor[buf.present_tensor], (buf.returns_tensor - buf.baselines_tensor)[buf.present_tensor]
    )


# ============================================================================================ 3. posthumous credit

GAMMA, LAM = 0.9, 0.8


def hand_built_buffer(group_terminal_at_end: bool) -> GroupRolloutBuffer:
    """One env, 3 slots, T=3: agent 0 presses and leaves at t=0; agents 1 and 2 stay until t=2, where the
    episode ends (a group terminal, or a time limit)."""
    obs_space = spaces.Box(0.0, 1.0, (5,), np.float32)
    buf = GroupRolloutBuffer(3, 1, 3, obs_space, spaces.Discrete(2))
    present = np.array([[True, True, True], [False, True, True], [False, True, True]])
    rewards = np.array([[0.5, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 3.0, 0.0]], np.float32)
    ended = np.array([[True, False, False], [False, False, False], [False, True, True]])
    terminal = [False, False, group_terminal_at_end]
    obs = torch.zeros(1, 3, 5)
    for t in range(3):
        buf.add(
            obs,
            torch.zeros(3, dtype=torch.long),
            present[t][None],
            rewards[t][None],
            ended[t][None],
            np.array([terminal[t]]),
            obs.numpy(),
            (present[t] | ended[t])[None],
        )
    buf.values_tensor = torch.tensor([[1.0], [2.0], [4.0]])
    buf.continuing_values = torch.tensor([[2.0], [5.0], [7.0]])
    buf.baselines_tensor = torch.tensor([[[0.1, 0.2, 0.3]], [[9.0, 0.4, 0.5]], [[9.0, 0.6, 0.7]]])
    buf.compute_returns(np.array([10.0]), GAMMA, LAM)
    return buf


def test_leaver_is_credited_with_the_group_it_leaves():
    buf = hand_built_buffer(group_terminal_at_end=True)
    ret = buf.returns_tensor[:, 0].numpy()
    # Agents 1, 2 end at t=2 with a group terminal: no bootstrap (r only), then lambda-returns backwards:
    # agent 1: G2 = 3; G1 = 2 + 0.9 * (0.8 * 3 + 0.2 * 4) = 4.88; G0 = 1 + 0.9 * (0.8 * 4.88 + 0.2 * 2) = 4.8736
    # agent 2: G2 = 0; G1 = 1 + 0.9 * (0 + 0.8) = 1.72;          G0 = 0 + 0.9 * (0.8 * 1.72 + 0.4) = 1.5984
    np.testing.assert_allclose(ret[:, 1], [4.8736, 4.88, 3.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 2], [1.5984, 1.72, 0.0], rtol=1e-6, atol=1e-7)
    # Agent 0 left at t=0 while the group went on: its return follows the group's, with V(continuing group) = 2
    # and the mean return of agents 1 and 2 at t=1, (4.88 + 1.72) / 2 = 3.3:
    # 0.5 + 0.9 * (0.8 * 3.3 + 0.2 * 2) = 0.5 + 0.9 * 3.04 = 3.236 (0.5 without credit, 2.3 from V alone)
    assert ret[0, 0] == pytest.approx(3.236)


def test_time_limit_bootstraps_from_the_final_group_state():
    buf = hand_built_buffer(group_terminal_at_end=False)
    ret = buf.returns_tensor[:, 0].numpy()
    # Truncation: r + gamma * continuing value 7: agent 1 3 + 6.3 = 9.3, agent 2 0 + 6.3 = 6.3.
    np.testing.assert_allclose(ret[2, 1:], [9.3, 6.3], rtol=1e-6)
    # G1 of agent 1 = 2 + 0.9 * (0.8 * 9.3 + 0.2 * 4) = 2 + 0.9 * 8.24 = 9.416
    # G1 of agent 2 = 1 + 0.9 * (0.8 * 6.3 + 0.2 * 4) = 1 + 0.9 * 5.84 = 6.256
    np.testing.assert_allclose(ret[1, 1:], [9.416, 6.256], rtol=1e-6)
    # The leaver: 0.5 + 0.9 * (0.8 * (9.416 + 6.256) / 2 + 0.2 * 2) = 0.5 + 0.9 * 6.6688 = 6.50192
    assert ret[0, 0] == pytest.approx(6.50192)


def test_group_terminal_at_the_leavers_step_cuts_its_bootstrap():
    buf = hand_built_buffer(group_terminal_at_end=True)
    buf.group_terminal[0, 0] = True
    buf.compute_returns(np.array([10.0]), GAMMA, LAM)
    assert buf.returns_tensor[0, 0, 0].item() == pytest.approx(0.5)


@pytest.mark.parametrize("terminal", [True, False])
def test_advantages_are_returns_minus_baselines_on_present_slots(terminal):
    buf = hand_built_buffer(group_terminal_at_end=terminal)
    present = buf.present_tensor
    torch.testing.assert_close(buf.advantages_tensor[present], (buf.returns_tensor - buf.baselines_tensor)[present])
    assert (buf.advantages_tensor[~present] == 0).all()  # agent 0 at t=1, 2 (baseline 9 there is ignored)
    leaver_return = 3.236 if terminal else 6.50192  # the two tests above
    assert buf.advantages_tensor[0, 0, 0].item() == pytest.approx(leaver_return - 0.1)
    assert not buf.advantages_tensor.requires_grad and buf.advantages_tensor.dtype == torch.float32


def test_posthumous_credit_in_a_collected_rollout():
    """A scripted policy: agent_0 presses at the first step of each episode, nobody else ever presses."""
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, gamma=0.9, seed=0)

    def scripted_act(obs, deterministic=False):
        return ((obs[:, 0] == 1.0) & (obs[:, -1] == 1.0)).long()  # agent_0 and time left = 1 (first step)

    model.actor.act = scripted_act
    _, cb = model._setup_learn(32, None, True, "t", False)
    assert model.collect_rollouts(model.env, cb, model.rollout_buffer, model.n_steps)
    buf = model.rollout_buffer
    t_left = np.arange(16) % 8 == 0  # episodes of 8 steps, agent_0 leaves at their first step
    tl = torch.as_tensor(t_left)
    assert buf.ended[t_left, :, 0].all() and not buf.ended[~t_left, :, 0].any()
    assert buf.present_tensor[tl, :, 0].all() and not buf.present_tensor[~tl, :, 0].any()
    assert not buf.group_terminal.any()  # the only other ends are time limits
    assert buf.continuing_present[tl].all()  # the leaver plus both stayers
    leaver_reward = buf.rewards[t_left, :, 0]
    assert (leaver_reward <= 0).all()  # pressing pays nothing (or a cost) to the presser itself
    assert (buf.rewards[~t_left][:, :, 1:] == 2).all()  # the stayers are paid 2 each step after the press
    with torch.no_grad():
        cont = model.critic.value(buf.continuing_obs[tl].reshape(-1, 3, 5), buf.continuing_present[tl].reshape(-1, 3))
    torch.testing.assert_close(buf.continuing_values[tl].reshape(-1), cont, rtol=1e-5, atol=1e-5)
    # The leaver's return follows its groupmates' (both present at the next step) on, with the value of the group
    # it left in the value's place: r + gamma * (lambda * their mean return + (1 - lambda) * V_cont).
    after = torch.as_tensor(np.roll(t_left, 1))  # the steps after the presses (inside the same episodes)
    stayers_next = buf.returns_tensor[after][:, :, 1:].mean(dim=-1).numpy()
    lam = model.gae_lambda
    expected = buf.rewards[t_left, :, 0] + 0.9 * (lam * stayers_next + (1 - lam) * buf.continuing_values[tl].numpy())
    np.testing.assert_allclose(buf.returns_tensor[tl, :, 0].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert (np.abs(buf.returns_tensor[tl, :, 0].numpy() - leaver_reward) > 1e-4).all()  # a bootstrap, not just r
    # The stayers end at the time limit (t = 7, 15) and bootstrap from their final group state.
    t_end = np.arange(16) % 8 == 7
    te = torch.as_tensor(t_end)
    assert buf.ended[t_end, :, 1:].all()
    expected_end = buf.rewards[t_end][:, :, 1:] + 0.9 * buf.continuing_values[te].numpy()[:, :, None]
    np.testing.assert_allclose(buf.returns_tensor[te][:, :, 1:].numpy(), expected_end, rtol=1e-5, atol=1e-6)


# ============================================================================================ 4. the agent's API


@pytest.fixture(scope="module")
def learned():
    torch.set_num_threads(1)
    return POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(64)


def test_learn_returns_self_and_counts_env_and_agent_steps():
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0)
    assert model.learn(64) is model
    assert model.num_timesteps == 64
    assert model.num_timesteps < model.agent_steps <= 3 * model.num_timesteps
    assert model.agent_ids == ["agent_0", "agent_1", "agent_2"]
    # One rollout: agent_steps is exactly the number of present slots it stored.
    model.learn(32)
    assert model.num_timesteps == 32
    assert model.agent_steps == int(model.rollout_buffer.present.sum())
    # A learn that fails its checks changes neither count.
    counts = model.num_timesteps, model.agent_steps
    with pytest.raises(ValueError, match="total_timesteps"):
        model.learn(-1)
    assert (model.num_timesteps, model.agent_steps) == counts


def test_predict_dict_subset_and_array(learned):
    env = EarlyExitEnv()
    obs, _ = env.reset(seed=0)
    actions, state = learned.predict(obs)
    assert state is None
    assert set(actions) == set(obs)
    assert all(env.action_space(a).contains(int(act)) for a, act in actions.items())
    subset = {"agent_2": obs["agent_2"], "agent_0": obs["agent_0"]}
    sub_actions, _ = learned.predict(subset, deterministic=True)
    assert list(sub_actions) == ["agent_2", "agent_0"]
    full, _ = learned.predict(obs, deterministic=True)
    assert all(sub_actions[a] == full[a] for a in subset)
    one, _ = learned.predict({"agent_1": obs["agent_1"]}, deterministic=True)
    assert list(one) == ["agent_1"] and one["agent_1"] == full["agent_1"]
    with pytest.raises(ValueError, match="agent_9"):
        learned.predict({"agent_0": obs["agent_0"], "agent_9": obs["agent_0"]})
    stacked = np.stack([obs[a] for a in learned.agent_ids])
    arr, _ = learned.predict(stacked, deterministic=True)
    assert arr.shape == (3,)
    assert [int(a) for a in arr] == [int(full[a]) for a in learned.agent_ids]


def test_predict_names_what_is_wrong_with_its_input(learned):
    env = EarlyExitEnv()
    reset = env.reset(seed=0)
    with pytest.raises(ValueError, match=r"reset\(\) returns \(observations, infos\).*obs, infos = env.reset\(\)"):
        learned.predict(reset)
    short = {a: o[:4] for a, o in reset[0].items()}
    short["agent_1"] = reset[0]["agent_1"]
    with pytest.raises(ValueError, match=r"wrong shape: 'agent_0' \(4,\), 'agent_2' \(4,\); .*shape \(5,\)"):
        learned.predict(short)
    # one dict per env copy: the array form is the way to give several copies
    with pytest.raises(ValueError, match=r"got a list of dicts; .*\(n_envs, n_slots, \*obs_shape\).*'agent_0'"):
        learned.predict([reset[0], reset[0]])
    # a batch under each agent's key (the form SB3's VecEnvs give): the dict holds one observation per agent
    batched = {a: np.stack([o, o, o]) for a, o in reset[0].items()}
    with pytest.raises(ValueError, match=r"under an agent's key: 'agent_0' \(3, 5\).*array \(n_envs, n_slots, 5\)"):
        learned.predict(batched)
    # the array it names gives each copy's actions
    actions, _ = learned.predict(np.stack([np.stack([o[i] for o in batched.values()]) for i in range(3)]))
    assert actions.shape == (3, 3)
    # SB3's loop on model.get_env(): its reset gives (observations, mask), its step a GroupStep (NumPy's
    # "inhomogeneous shape" error before)
    venv = learned.get_env()
    first = venv.reset()
    with pytest.raises(ValueError, match=r"tuple of \(observations, mask\).*obs, mask = env.reset\(\)"):
        learned.predict(first)
    actions, _ = learned.predict(first[0])
    step = venv.step(actions)
    with pytest.raises(ValueError, match=r"got a GroupStep.*model.predict\(step.observations\)"):
        learned.predict(step)
    assert learned.predict(step.observations)[0].shape == actions.shape


def test_predict_array_of_env_copies(learned):
    obs, _ = EarlyExitEnv().reset(seed=0)
    stacked = np.stack([obs[a] for a in learned.agent_ids])
    actions, _ = learned.predict(np.stack([stacked, stacked]), deterministic=True)
    assert actions.shape == (2, 3)
    with pytest.raises(
        ValueError, match=r"array of shape \(2, 3, 4\).*observations have shape \(4,\).*\(n_envs, n_slots, 5\)"
    ):
        learned.predict(np.zeros((2, 3, 4), np.float32))


def test_predict_array_of_env_copies_refuses_observations_laid_out_otherwise():
    """Observations of shape (5, 1) given as (1, 5) have as many numbers: they are refused, not read in the
    wrong order."""
    model = POCA("MlpPolicy", lambda: supersuit.reshape_v0(EarlyExitEnv(), (5, 1)), n_steps=8, batch_size=8, seed=0)
    assert model.observation_space.shape == (5, 1)
    assert model.predict(np.zeros((2, 3, 5, 1), np.float32))[0].shape == (2, 3)
    with pytest.raises(ValueError, match=r"observations have shape \(1, 5\).*\(n_envs, n_slots, 5, 1\)"):
        model.predict(np.zeros((2, 3, 1, 5), np.float32))


def test_save_load_round_trip(learned, tmp_path):
    path = tmp_path / "poca.zip"
    learned.save(path)
    loaded = POCA.load(path)
    assert loaded.agent_ids == learned.agent_ids
    assert loaded.num_timesteps == learned.num_timesteps
    env = EarlyExitEnv()
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        a1, _ = learned.predict(obs, deterministic=True)
        a2, _ = loaded.predict(obs, deterministic=True)
        assert a1 == a2
        obs = {a: np.clip(o + rng.normal(0, 0.3, o.shape), 0, 1).astype(np.float32) for a, o in obs.items()}
    for name, module in learned._networks().items():
        for (k, v1), v2 in zip(module.state_dict().items(), loaded._networks()[name].state_dict().values()):
            torch.testing.assert_close(v1, v2, msg=f"{name}.{k}")
    with pytest.raises(ValueError, match="agent_7"):
        loaded.predict({"agent_7": obs["agent_0"]})


def test_attention_width_is_saved_and_old_files_load_with_128(tmp_path, monkeypatch):
    """The critic's width travels in the model file; a file from before it did (no width saved, built with
    the default of the time, 128) loads into a 128-wide critic whatever the default is now."""
    assert POCA("MlpPolicy", EarlyExitEnv, seed=0).critic.attention.norm.normalized_shape == (128,)
    model = POCA("MlpPolicy", EarlyExitEnv, seed=0, policy_kwargs=dict(attention_width=32, attention_heads=2))
    model.save(tmp_path / "narrow.zip")
    loaded = POCA.load(tmp_path / "narrow.zip")
    assert (loaded.attention_width, loaded.attention_heads) == (32, 2)
    assert loaded.critic.attention.n_heads == 2

    wide = POCA("MlpPolicy", EarlyExitEnv, seed=0)
    wide.save(tmp_path / "wide.zip")
    with zipfile.ZipFile(tmp_path / "wide.zip") as zf:
        entries = {name: zf.read(name) for name in zf.namelist()}
    settings = json.loads(entries[SETTINGS_ENTRY])
    for key in ("attention_width", "attention_heads"):
        del settings[key]
    entries[SETTINGS_ENTRY] = json.dumps(settings).encode()
    with zipfile.ZipFile(tmp_path / "old.zip", "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    monkeypatch.setattr("covey.agents.poca.DEFAULT_ATTENTION_WIDTH", 64)  # a later default
    assert POCA("MlpPolicy", EarlyExitEnv, seed=0).attention_width == 64
    old = POCA.load(tmp_path / "old.zip")
    assert old.attention_width == 128
    for (key, v1), v2 in zip(wide.critic.state_dict().items(), old.critic.state_dict().values()):
        torch.testing.assert_close(v1, v2, msg=key)


def test_load_with_env_continues_training(learned, tmp_path):
    path = tmp_path / "poca.zip"
    learned.save(path)
    loaded = POCA.load(path, env=EarlyExitEnv)
    assert loaded.n_envs == 2 and loaded.agent_ids == learned.agent_ids
    assert loaded.learn(32, reset_num_timesteps=False) is loaded
    assert loaded.num_timesteps == learned.num_timesteps + 32
    for p in loaded._params:
        assert torch.isfinite(p).all()


def test_load_with_an_env_instance_runs_one_copy(learned, tmp_path):
    # The file was trained with 2 copies; an instance is one copy, as SB3 models take the env's number of envs.
    learned.save(tmp_path / "poca.zip")
    loaded = POCA.load(tmp_path / "poca.zip", env=EarlyExitEnv())
    assert loaded.n_envs == 1 and loaded.learn(16).num_timesteps == 16
    with pytest.raises(ValueError, match=r"n_envs=2 copies need a function.*\(n_envs=1\)"):
        POCA.load(tmp_path / "poca.zip", env=EarlyExitEnv(), n_envs=2)  # unless asked for more


def test_agent_steps_survive_save_and_load(learned, tmp_path):
    path = tmp_path / "poca.zip"
    learned.save(path)
    loaded = POCA.load(path, env=EarlyExitEnv)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.agent_steps >= learned.agent_steps + 32
    assert loaded.num_timesteps <= loaded.agent_steps <= 3 * loaded.num_timesteps


def test_same_seed_same_parameters():
    def run():
        return POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=3).learn(64)

    a, b = run(), run()
    for p, q in zip(a._params, b._params, strict=True):
        assert torch.equal(p, q)
    c = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=4).learn(64)
    assert any(not torch.equal(p, q) for p, q in zip(a._params, c._params, strict=True))


def test_logger_keys(tmp_path):
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=32, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(96)  # three rollouts: the train/ keys of the first two updates are written
    with open(tmp_path / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    keys = [
        "rollout/ep_rew_mean",
        "rollout/ep_rew_agent_mean",
        "time/agent_steps",
        "train/policy_gradient_loss",
        "train/value_loss",
        "train/baseline_loss",
        "train/value_estimate",
        "train/baseline_estimate",
        "train/entropy",
        "train/approx_kl",
        "train/clip_fraction",
        "train/explained_variance",
    ]
    last = rows[-1]
    missing = [k for k in keys if k not in last]
    assert not missing
    for k in keys:
        assert np.isfinite(float(last[k])), k
    assert int(last["time/agent_steps"]) == model.agent_steps
    assert int(last["time/total_timesteps"]) == 96
    # under PPO's names too: its entropy term, and no std for Discrete actions
    assert float(last["train/entropy_loss"]) == pytest.approx(-float(last["train/entropy"]))
    assert "train/std" not in last


def test_a_box_action_teams_policy_std_is_logged_under_ppos_key():
    from mpe2 import simple_spread_v3

    make = lambda: simple_spread_v3.parallel_env(N=2, max_cycles=10, continuous_actions=True)  # noqa: E731
    model = POCA("MlpPolicy", make, n_steps=32, batch_size=32, seed=0)
    with torch.no_grad():
        model.actor.head.log_std.copy_(torch.log(torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0])))
    model.learn(32)
    logged = model.logger.name_to_value
    std = model.actor.head.log_std.detach().exp().mean().item()
    assert logged["train/std"] == pytest.approx(std, rel=1e-6) and abs(std - 1.6) < 0.05  # after one update


def test_update_statistics_are_reduced_as_sb3s_ppo_logs_them(monkeypatch):
    """Each statistic is its mean over the update's minibatches, but ``approx_kl`` is over the last epoch's and
    ``loss`` is the last minibatch's, as SB3's PPO logs them (a team's logs read as the baseline's)."""
    seen = []
    objective = poca_module.poca_objective

    def recording(*args, **kwargs):
        loss, stats = objective(*args, **kwargs)
        seen.append({key: float(value) for key, value in stats.items()})
        return loss, stats

    monkeypatch.setattr(poca_module, "poca_objective", recording)
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=16, batch_size=8, n_epochs=3, seed=0)
    model.learn(32)  # one update: 3 epochs of 4 minibatches
    assert len(seen) == 12
    logged = model.logger.name_to_value
    kl = [stats["approx_kl"] for stats in seen]
    assert logged["train/approx_kl"] == pytest.approx(np.mean(kl[8:]), rel=1e-6)
    assert logged["train/approx_kl"] != pytest.approx(np.mean(kl), rel=1e-3)
    assert logged["train/loss"] == pytest.approx(seen[-1]["loss"], rel=1e-6)
    for key in ("policy_gradient_loss", "value_loss", "baseline_loss", "clip_fraction"):
        assert logged[f"train/{key}"] == pytest.approx(np.mean([stats[key] for stats in seen]), rel=1e-6), key


@pytest.mark.parametrize("recurrent", [False, True], ids=["feed-forward", "recurrent"])
def test_advantages_are_normalized_once_over_the_update_buffer_as_ma_pocas(monkeypatch, recurrent):
    """ALGORITHMS.md (and ML-Agents' POCA): the advantages are normalized over the update buffer, before the
    epochs. Each minibatch used to be normalized to its own mean 0 and std 1, so an agent-step's sign depended on
    the steps shuffled in with it. The buffer keeps the rollout's advantages (callbacks read them)."""
    seen = []
    surrogate = poca_module.clipped_surrogate_loss

    def recording(log_prob, old_log_prob, advantages, clip_range):
        seen.append(advantages.detach().clone())
        return surrogate(log_prob, old_log_prob, advantages, clip_range)

    monkeypatch.setattr(poca_module, "clipped_surrogate_loss", recording)
    policy = "MlpLstmPolicy" if recurrent else "MlpPolicy"
    model = POCA(policy, EarlyExitEnv, n_envs=2, n_steps=16, batch_size=8, n_epochs=1, seed=0)
    model.learn(32)  # one update of 4 minibatches
    buf = model.rollout_buffer
    raw = buf.advantages_tensor[buf.present_tensor]
    expected = (raw - raw.mean()) / (raw.std() + 1e-8)
    used = torch.cat(seen)
    assert len(seen) >= 2 and used.numel() == raw.numel()
    torch.testing.assert_close(used.sort().values, expected.sort().values, rtol=1e-5, atol=1e-5)
    assert any(abs(float(batch.mean())) > 0.05 for batch in seen)  # no minibatch is centred on its own
    assert abs(float(raw.std()) - 1.0) > 0.05  # the buffer's advantages are the rollout's


def test_a_minibatch_of_one_group_step_is_taken_as_the_advantages_are_normalized_over_the_update():
    """PPO refuses batch_size=1 with normalize_advantage (SB3's rule: one advantage cannot be normalized within
    its minibatch); POCA normalizes over the update, so a minibatch of one group-step trains, on normalized
    advantages."""
    with pytest.raises(ValueError, match="batch_size=1 is invalid.*normalize_advantage=True"):
        PPO("MlpPolicy", "CartPole-v1", n_steps=8, batch_size=1)
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=1, n_steps=8, batch_size=1, n_epochs=1, seed=0).learn(8)
    assert model._n_updates == 1 and np.isfinite(model.logger.name_to_value["train/policy_gradient_loss"])


# ============================================================================================ 5. bad input


class HeterogeneousEnv(ParallelEnv):
    metadata = {"name": "heterogeneous_v0"}

    def __init__(self):
        self.possible_agents = ["a", "b"]
        self.agents = []

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (3 if agent == "a" else 4,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: self.observation_space(a).sample() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        raise AssertionError("never stepped")


class NoAgentsEnv(ParallelEnv):
    metadata = {"name": "no_agents_v0"}

    def __init__(self):
        self.possible_agents = ["a", "b"]
        self.agents = []

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = []
        return {}, {}

    def step(self, actions):
        raise AssertionError("never stepped")


def test_env_instance_with_several_copies_asks_for_a_function():
    with pytest.raises(ValueError, match="function"):
        POCA("MlpPolicy", EarlyExitEnv(), n_envs=2)
    model = POCA("MlpPolicy", EarlyExitEnv(), n_envs=1, n_steps=8, batch_size=8, seed=0)  # one copy is fine
    assert model.n_envs == 1


def test_batch_size_larger_than_the_rollout_warns_as_ppo_does():
    with pytest.warns(UserWarning, match=r"batch_size=64 is larger than the rollout \(n_steps \* n_envs = 16\)"):
        model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=8, batch_size=64, n_epochs=1, seed=0)
    assert model.learn(16).num_timesteps == 16  # and trains on the whole rollout as one minibatch


def test_heterogeneous_group_points_to_padding():
    with pytest.raises(
        ValueError,
        match=r"one cooperative group.*pad_observations_v0.*one_side.*lists that side's agents and acts for the others",
    ):
        POCA("MlpPolicy", HeterogeneousEnv, n_envs=2)
    with pytest.raises(ValueError, match="pad_observations_v0"):
        POCA("MlpPolicy", HeterogeneousEnv())
    # opposing sides (the README's example): adversaries and prey observe different vectors; the error names the
    # sides by their ids and the wrapper that trains one of them
    with pytest.raises(ValueError, match=r"'adversary_0' has Box.*'agent_0' has Box.*") as info:
        POCA("MlpPolicy", simple_tag_v3.parallel_env())
    assert "(by their ids: 'adversary' (3), 'agent' (1))" in str(info.value)
    assert "covey.wrappers.one_side(env, 'adversary') lists that side's agents" in str(info.value)
    assert info.value.side == "adversary"


def test_env_without_agents_after_reset():
    with pytest.raises(ValueError, match="no agents after reset"):
        POCA("MlpPolicy", NoAgentsEnv, n_steps=8, batch_size=8).learn(8)


def test_not_a_pettingzoo_env():
    with pytest.raises(TypeError, match="ParallelEnv"):
        POCA("MlpPolicy", object())
    for n_envs in (1, 8):  # a name, as a config file writes it, is not an env
        with pytest.raises(TypeError, match=r"not a name \('mpe2:simple_spread_v3'\).*parallel_env"):
            POCA("MlpPolicy", "mpe2:simple_spread_v3", n_envs=n_envs)
    with pytest.raises(ValueError, match="POCA needs a PettingZoo env.*ParallelEnv"):
        POCA("MlpPolicy", None)
    # An SB3 + SuperSuit script's vector env: the agents' ids are gone, so the message says what to pass.
    vec = supersuit.concat_vec_envs_v1(
        supersuit.pettingzoo_env_to_vec_env_v1(simple_spread_v3.parallel_env()), 2, base_class="stable_baselines3"
    )
    with pytest.raises(TypeError, match=r"not a vector env \(SB3VecEnvWrapper\).*n_envs=8\)"):
        POCA("MlpPolicy", vec)


# ============================================================================================ 6. MPE simple_spread


@pytest.mark.parametrize(
    "make",
    [
        lambda: simple_spread_v3.parallel_env(N=3, max_cycles=25),
        lambda: simple_spread_v3.env(N=3, max_cycles=25),
    ],
    ids=["parallel", "aec"],
)
def test_simple_spread(make):
    model = POCA("MlpPolicy", make, n_envs=2, n_steps=32, seed=0).learn(128)
    assert model.num_timesteps == 128
    assert model.agent_steps == 3 * 128  # nobody leaves simple_spread early
    assert model.agent_ids == ["agent_0", "agent_1", "agent_2"]
    assert len(model.ep_info_buffer) > 0  # 25-step episodes ended and were recorded
    env = simple_spread_v3.parallel_env(N=3, max_cycles=25)
    obs, _ = env.reset(seed=1)
    actions, _ = model.predict(obs, deterministic=True)
    assert set(actions) == set(obs)
    env.step(actions)
    for p in model._params:
        assert torch.isfinite(p).all()


class _RenamedGroup:
    """simple_spread's spaces under other agent names: another group (it never needs to step)."""

    def __init__(self):
        self.inner = simple_spread_v3.parallel_env(N=3)
        self.possible_agents = [f"robot_{i}" for i in range(3)]

    def observation_space(self, agent):
        return self.inner.observation_space("agent_0")

    def action_space(self, agent):
        return self.inner.action_space("agent_0")

    def reset(self, seed=None, options=None):
        raise AssertionError("not reached")

    def step(self, actions):
        raise AssertionError("not reached")


def test_load_with_another_group_is_refused(tmp_path):
    POCA("MlpPolicy", lambda: simple_spread_v3.parallel_env(N=3), n_steps=8, seed=0).save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match=r"robot_0.*not this model's group.*agent_0"):
        POCA.load(tmp_path / "m.zip", env=_RenamedGroup)


def test_n_envs_beside_a_group_vec_env_must_match_its_copies(tmp_path):
    """The env's copies are what POCA steps: an n_envs that says otherwise is refused, not ignored (load's too,
    which went on with the env's copies)."""
    with pytest.raises(ValueError, match=r"n_envs=8, but the env given is a GroupVecEnv of 2 copies"):
        POCA("MlpPolicy", GroupVecEnv([EarlyExitEnv] * 2), n_envs=8)
    assert POCA("MlpPolicy", GroupVecEnv([EarlyExitEnv] * 2), n_envs=2).n_envs == 2
    assert POCA("MlpPolicy", GroupVecEnv([EarlyExitEnv] * 2)).n_envs == 2
    model = POCA("MlpPolicy", EarlyExitEnv)
    assert model.n_envs == 1
    model.save(tmp_path / "m.zip")
    with pytest.raises(ValueError, match=r"n_envs=3, but the env given is a GroupVecEnv of 2 copies"):
        POCA.load(tmp_path / "m.zip", env=GroupVecEnv([EarlyExitEnv] * 2), n_envs=3)
    assert POCA.load(tmp_path / "m.zip", env=GroupVecEnv([EarlyExitEnv] * 2), n_envs=2).n_envs == 2
    assert POCA.load(tmp_path / "m.zip", env=GroupVecEnv([EarlyExitEnv] * 2)).n_envs == 2


def test_set_env_with_another_number_of_copies_is_refused():
    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=8, seed=0)
    with pytest.raises(ValueError, match="2 copies"):
        model.set_env(GroupVecEnv([EarlyExitEnv] * 3))
    # one instance is one copy: the error names the ways that fit, and load's way to one copy
    with pytest.raises(
        ValueError,
        match=r"one env instance, which is one copy, but this model steps 2 env copies.*"
        r"set_env\(lambda: \.\.\.\) makes 2 copies.*POCA.load\(path, env=env\)",
    ):
        model.set_env(EarlyExitEnv())
    # a function makes the model's copies, also for a model whose copies came as a GroupVecEnv
    model.set_env(lambda: EarlyExitEnv())
    assert model.env.n_envs == 2 and model.learn(16).num_timesteps == 16
    from_group = POCA("MlpPolicy", GroupVecEnv([EarlyExitEnv] * 3), n_steps=8, seed=0)
    from_group.set_env(EarlyExitEnv)
    assert from_group.env.n_envs == 3
    single = POCA("MlpPolicy", EarlyExitEnv(), n_steps=8, seed=0)
    single.set_env(EarlyExitEnv())
    assert single.env.n_envs == 1


def test_a_callback_reads_the_group_buffer_and_the_steps_by_sb3s_names():
    """SB3's callback habits on a team: self.locals["rollout_buffer"], its fields as NumPy arrays (so
    np.mean(buffer.returns) works), per-step locals by SB3's names, and an in-place edit of the advantages in
    _on_rollout_end reaching the update (zeroed: the policy does not move, the critic does)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class ZeroAdvantages(BaseCallback):
        def _on_training_start(self) -> None:
            self.steps, self.fields = [], {}

        def _on_step(self) -> bool:
            self.steps.append(
                (
                    self.locals["n_steps"],
                    self.locals["new_obs"].shape,
                    self.locals["rewards"].shape,
                    len(self.locals["dones"]),
                    self.locals["actions"].shape,
                    self.locals["clipped_actions"].shape,
                )
            )
            return True

        def _on_rollout_end(self) -> None:
            buffer = self.locals["rollout_buffer"]
            assert buffer is self.model.rollout_buffer
            self.end_n_steps = self.locals["n_steps"]  # SB3's count at the end: the rollout's steps
            for name in (
                "observations",
                "actions",
                "present",
                "values",
                "baselines",
                "log_probs",
                "returns",
                "advantages",
            ):
                value = getattr(buffer, name)
                self.fields[name] = (type(value), value.shape, value.dtype)
            self.mean_return = float(np.mean(buffer.returns[buffer.present]))
            np.testing.assert_array_equal(buffer.advantages, buffer.advantages_tensor.numpy())
            buffer.advantages[:] = 0.0  # in place, as SB3's callbacks edit its buffer

    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=2, n_steps=8, batch_size=16, n_epochs=2, ent_coef=0.0, seed=0)
    actor, critic = ([p.detach().clone() for p in net.parameters()] for net in (model.actor, model.critic))
    callback = ZeroAdvantages()
    model.learn(16, callback=callback)
    n_slots = model.rollout_buffer.n_slots
    obs_shape = model.observation_space.shape
    lead = (2, n_slots)  # per copy and slot, as the observations and rewards
    assert callback.steps == [(t, (*lead, *obs_shape), lead, 2, lead, lead) for t in range(8)]
    assert callback.end_n_steps == 8
    lead = (8, 2, n_slots)
    assert callback.fields == {
        "observations": (np.ndarray, (*lead, *obs_shape), np.float32),
        "actions": (np.ndarray, lead, np.int64),
        "present": (np.ndarray, lead, np.bool_),
        "values": (np.ndarray, (8, 2), np.float32),
        "baselines": (np.ndarray, lead, np.float32),
        "log_probs": (np.ndarray, lead, np.float32),
        "returns": (np.ndarray, lead, np.float32),
        "advantages": (np.ndarray, lead, np.float32),
    }
    buffer = model.rollout_buffer
    assert callback.mean_return == pytest.approx(float(buffer.returns_tensor[buffer.present_tensor].mean()))
    assert (model.rollout_buffer.buffer_size, buffer.gamma, buffer.gae_lambda) == (8, model.gamma, model.gae_lambda)
    assert all(torch.equal(a, b) for a, b in zip(actor, model.actor.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(critic, model.critic.parameters(), strict=True))


@pytest.mark.parametrize("how", ["in place", "vector_to_parameters"])
def test_a_callbacks_weight_change_inside_a_rollout_leaves_earlier_steps_evaluated_with_the_weights_they_acted_with(
    how,
):
    """A callback that changes actor and critic at step 6 of a rollout (in place, or by replacing every
    parameter's .data as vector_to_parameters does): steps 0-5 keep the old networks' values, baselines and old
    log-probs, the later ones the new networks'; a step's continuing state (leavers' and time limits' bootstrap) is
    valued after its callbacks, as SB3 values a truncation (the old critic before step 5, the new from step 5)."""
    from stable_baselines3.common.callbacks import BaseCallback

    switch = 6
    nets = ("actor", "critic")

    class Change(BaseCallback):
        def _on_step(self) -> bool:
            if self.n_calls == switch:
                for net in nets:
                    params = list(getattr(self.model, net).parameters())
                    vector = torch.nn.utils.parameters_to_vector(params).detach()
                    noise = 0.3 * torch.randn(vector.shape, generator=torch.Generator().manual_seed(1))
                    if how == "in place":
                        with torch.no_grad():
                            for p in params:
                                p.add_(noise[: p.numel()].view_as(p))
                                noise = noise[p.numel() :]
                    else:
                        torch.nn.utils.vector_to_parameters(vector + noise, params)
            return True

    env = lambda: EarlyExitEnv(episode_length=3)  # noqa: E731 - leavers and time limits in every rollout
    model = POCA("MlpPolicy", env, n_envs=2, n_steps=16, batch_size=32, n_epochs=1, learning_rate=0.0, seed=0)
    old = {net: copy.deepcopy(getattr(model, net)) for net in nets}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn of: every step is evaluated as it acted
        model.learn(16, callback=Change())
    new = {net: getattr(model, net) for net in nets}
    assert not torch.equal(next(old["actor"].parameters()), next(new["actor"].parameters()))
    buf = model.rollout_buffer
    obs, actions, present = (buf.flat(x) for x in (buf.observations_tensor, buf.actions_tensor, buf.present_tensor))
    cont_obs, cont_present = buf.flat(buf.continuing_obs), buf.flat(buf.continuing_present)
    needs_bootstrap = (buf.ended.any(axis=-1) & ~buf.group_terminal).reshape(-1)
    assert needs_bootstrap[: (switch - 1) * 2].any() and needs_bootstrap[(switch - 1) * 2 :].any()

    def evaluate(networks):
        actor, critic = networks["actor"], networks["critic"]
        with torch.no_grad():
            raw, raw_baseline = critic.raw(obs, actions, present)
            log_probs, _ = actor.evaluate(obs.reshape(-1, *obs.shape[2:]), actions.reshape(-1))
            continuing = critic.value(cont_obs, cont_present)
        head = critic.value_head
        return {
            "values": head.value(raw).reshape(16, 2),
            "baselines": head.value(raw_baseline).reshape(16, 2, -1),
            "log_probs": log_probs.reshape(16, 2, -1),
            "continuing": torch.where(torch.as_tensor(needs_bootstrap), continuing, 0.0).reshape(16, 2),
        }

    before, after = evaluate(old), evaluate(new)
    stored = {
        "values": buf.values_tensor,
        "baselines": buf.baselines_tensor,
        "log_probs": buf.log_probs_tensor,
        "continuing": torch.as_tensor(buf.continuing_values),
    }
    for name in ("values", "baselines", "log_probs"):
        torch.testing.assert_close(stored[name][:switch], before[name][:switch], msg=name)
        torch.testing.assert_close(stored[name][switch:], after[name][switch:], msg=name)
        assert not torch.allclose(before[name][:switch], after[name][:switch])
    torch.testing.assert_close(stored["continuing"][: switch - 1], before["continuing"][: switch - 1])
    torch.testing.assert_close(stored["continuing"][switch - 1 :], after["continuing"][switch - 1 :])


class InfoTeam(EarlyExitEnv):
    """EarlyExitEnv whose step infos carry custom metrics: the step of the episode and the agent's index."""

    def reset(self, seed=None, options=None):
        self.step_of_episode = 0
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        self.step_of_episode += 1
        *out, infos = super().step(actions)
        return (*out, {a: {"t": self.step_of_episode, "index": self.possible_agents.index(a)} for a in infos})


def test_a_callback_reads_the_envs_own_infos_per_copy_and_agent():
    """A custom metric an env reports in its step infos reaches callbacks as SB3's do: self.locals["infos"][e],
    the env's dict keyed by agent under "agents", beside the episode statistics."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Collect(BaseCallback):
        def _on_training_start(self) -> None:
            self.seen = []

        def _on_step(self) -> bool:
            infos, dones = self.locals["infos"], self.locals["dones"]
            self.seen.append(([dict(info["agents"]) for info in infos], ["episode" in i for i in infos], list(dones)))
            return True

    callback = Collect()
    POCA("MlpPolicy", InfoTeam, n_envs=2, n_steps=16, batch_size=32, n_epochs=1, seed=0).learn(32, callback=callback)
    assert len(callback.seen) == 16
    t = [0, 0]  # each copy's step of its episode
    for per_copy, episode_ends, dones in callback.seen:
        assert episode_ends == dones
        for e, agents in enumerate(per_copy):
            t[e] += 1
            assert agents and all(info == {"t": t[e], "index": int(a[-1])} for a, info in agents.items())
            if dones[e]:
                t[e] = 0
    assert any(ends for _, ends, _ in callback.seen if any(ends))  # episodes ended within the rollout


# ---------------------------------------------------------------------------- Dict observations
def test_flat_dict_round_trip_is_exact_for_every_kind_of_key():
    from covey.networks.encoders import FlatDict

    space = spaces.Dict(
        {
            "vec": spaces.Box(-1, 1, (2, 3), np.float32),
            "image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "id": spaces.Discrete(5, start=2),
            "md": spaces.MultiDiscrete([3, 4]),
            "mb": spaces.MultiBinary(3),
        }
    )
    space.seed(0)
    flat = FlatDict(space)
    samples = [space.sample() for _ in range(4)]
    rows = np.stack([flat.flatten(obs) for obs in samples])
    assert rows.dtype == np.float32 and rows.shape == (4, flat.flat_space.shape[0]) == (4, 6 + 48 + 1 + 2 + 3)
    back = flat.unflatten(torch.as_tensor(rows))
    for key, sub in space.spaces.items():
        expected = np.stack([np.asarray(obs[key]) for obs in samples])
        assert back[key].dtype == obs_dtype(sub)
        np.testing.assert_array_equal(back[key].numpy(), expected.reshape(4, *sub.shape))
    with pytest.raises(ValueError, match=r"lacks the key 'md'"):
        flat.flatten({k: v for k, v in samples[0].items() if k != "md"}, "'agent_0'")
    with pytest.raises(ValueError, match=r"of 'agent_0' has shape \(3,\) for key 'vec'; the space expects \(2, 3\)"):
        flat.flatten({**samples[0], "vec": np.zeros(3)}, "'agent_0'")


@pytest.mark.parametrize(
    "space", [spaces.Discrete(4, start=2**25 + 1), spaces.MultiDiscrete([3, 2], start=[0, -(2**25)])]
)
def test_dict_keys_whose_whole_numbers_float32_cannot_hold_are_refused_at_the_constructor(space):
    """A team's Dict observation is one float32 vector: Discrete values beyond 2**24 would be stored as their
    neighbours (2**25 + 1 and 2**25 + 2 as one). Up to 2**24 they are exact, and taken."""

    class BigIds(DictTeam):
        def __init__(self, key_space):
            super().__init__(slot=False)
            self.space = spaces.Dict({**self.space.spaces, "id": key_space})

    with pytest.raises(ValueError, match=r"Observation key 'id' is .* whose values reach 33,554,4\d\d: .* \(2\*\*24\)"):
        POCA("MultiInputPolicy", lambda: BigIds(space), n_steps=8)
    from covey.networks.encoders import FlatDict

    exact = spaces.Dict({"id": spaces.Discrete(3, start=2**24 - 2)})
    rows = np.stack([FlatDict(exact).flatten({"id": value}) for value in range(2**24 - 2, 2**24 + 1)])
    assert FlatDict(exact).unflatten(torch.as_tensor(rows))["id"].tolist() == list(range(2**24 - 2, 2**24 + 1))


@pytest.mark.parametrize("policy", ["MlpPolicy", "MlpLstmPolicy"])
def test_a_team_observing_a_one_key_dict_trains_exactly_as_on_the_vector(policy):
    """A Dict of one Box key travels flat and is encoded as the Box itself: same seed, bit-identical networks
    after training (feed-forward and recurrent), so the Dict path adds nothing to what POCA computes."""
    settings = dict(n_envs=2, n_steps=16, batch_size=16, n_epochs=2, seed=0)
    plain = POCA(policy, EarlyExitEnv, **settings).learn(64)
    wrapped = POCA(policy, lambda: DictTeam(slot=False), **settings).learn(64)
    assert isinstance(wrapped.observation_space, spaces.Dict)
    for net in ("actor", "critic"):
        a, b = getattr(plain, net).state_dict(), getattr(wrapped, net).state_dict()
        assert [k.replace("encoder.encoder.encoders.obs.", "encoder.") for k in b] == list(a)
        for x, y in zip(a.values(), b.values(), strict=True):
            assert torch.equal(x, y)


def test_a_team_with_dict_observations_learns_predicts_saves_and_evaluates(tmp_path):
    model = POCA("MlpPolicy", DictTeam, n_envs=2, n_steps=16, batch_size=32, seed=0).learn(64)
    observations, _ = DictTeam().reset(seed=1)
    actions, _ = model.predict(observations, deterministic=True)
    assert sorted(actions) == sorted(observations)
    model.save(tmp_path / "team")
    loaded = POCA.load(tmp_path / "team")
    assert loaded.observation_space == DictTeam().space
    assert loaded.predict(observations, deterministic=True)[0] == actions
    result = evaluate_group(loaded, DictTeam, n_eval_episodes=2, seed=0)
    assert result == evaluate_group(model, DictTeam, n_eval_episodes=2, seed=0)
    # The slot key reaches the networks: changing it changes the policy's output.
    first = {"agent_0": observations["agent_0"]}
    moved = {"agent_0": {**observations["agent_0"], "slot": 3}}
    with torch.no_grad():
        logits = [
            model.actor.distribution_params(torch.as_tensor(model.env.flat_dict.flatten(o["agent_0"]))[None])
            for o in (first, moved)
        ]
    assert not torch.equal(*logits)
    with pytest.raises(ValueError, match=r"one agent's Dict observation .* \{agent: observation\}"):
        model.predict(observations["agent_0"])
    with pytest.raises(ValueError, match=r"observation of 'agent_1' lacks the key 'slot'"):
        model.predict({"agent_1": {"obs": observations["agent_1"]["obs"]}})


def test_a_team_with_image_keys_gets_a_cnn_per_image_key():
    model = POCA("MultiInputPolicy", lambda: DictTeam(view=True), n_envs=2, n_steps=8, batch_size=16, seed=0)
    for net in (model.actor, model.critic):
        assert isinstance(net.encoder.encoder.encoders["view"], NatureCNN)
    before = [p.detach().clone() for p in model.actor.encoder.parameters()]
    model.learn(16)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.actor.encoder.parameters()))


class ImageTeam(EarlyExitEnv):
    """EarlyExitEnv whose agents see a 36x36 RGB image (channel-last) whose rows show their features."""

    def observation_space(self, agent):
        return spaces.Box(0, 255, (36, 36, 3), np.uint8)

    def _obs(self, agent):
        image = np.zeros((36, 36, 3), np.uint8)
        image[: self.n_agents + 2] = (255 * super()._obs(agent))[:, None, None].astype(np.uint8)
        return image


def test_predict_takes_images_in_the_other_channel_order_as_ppos_predict_does():
    """An image given channel-first to a model whose agents see channel-last (HWC) is moved to HWC, as PPO's and
    SB3's predict move it: in an {agent: observation} dict, the (n_envs, n_slots, ...) array and a Dict's image key."""
    model = POCA("CnnPolicy", ImageTeam, n_steps=8, batch_size=8, seed=0)
    observations, _ = ImageTeam().reset(seed=0)
    chw = {agent: np.moveaxis(obs, -1, 0) for agent, obs in observations.items()}
    expected = model.predict(observations, deterministic=True)[0]
    assert model.predict(chw, deterministic=True)[0] == expected
    group = np.stack([chw[agent] for agent in model.agent_ids])[None]  # (1, n_slots, 3, 36, 36)
    actions = model.predict(group, deterministic=True)[0]
    assert actions[0].tolist() == [expected[agent] for agent in model.agent_ids]

    team = POCA("MultiInputPolicy", lambda: DictTeam(view=True), n_steps=8, batch_size=8, seed=0)
    observations, _ = DictTeam(view=True).reset(seed=0)
    chw = {agent: {**obs, "view": np.moveaxis(obs["view"], -1, 0)} for agent, obs in observations.items()}
    assert team.predict(chw, deterministic=True)[0] == team.predict(observations, deterministic=True)[0]


def test_poca_rollouts_run_both_networks_in_evaluation_mode_and_updates_in_training_mode():
    """As PPO's: the actor acts and the critic values the rollout in evaluation mode (a features extractor's
    batch norm and dropout, here), and the update trains both."""
    model = POCA(
        "MlpPolicy",
        lambda: simple_spread_v3.parallel_env(N=3, max_cycles=25),
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(features_extractor_class=NormExtractor),
    )
    extractors = {
        name: m for name in ("actor", "critic") for m in getattr(model, name).modules() if isinstance(m, NormExtractor)
    }
    assert set(extractors) == {"actor", "critic"}
    model.learn(16)  # one rollout, then one update of one minibatch (16 group steps x 3 agents)
    for name, extractor in extractors.items():
        first_update = [training for _, training in extractor.calls].index(True)
        rollout, update = extractor.calls[:first_update], extractor.calls[first_update:]
        assert rollout and not any(training for _, training in rollout), name
        assert update and all(training and rows == 48 for rows, training in update), name
        if name == "actor":
            assert len(rollout) >= 16  # an action per step


class _ShapedActions(ParallelEnv):
    """EarlyExitEnv whose agents act in ``space`` (a Box or MultiBinary): an agent presses when its action's first
    number is above 0.5."""

    metadata = {"name": "shaped_actions_v0", "render_modes": []}

    def __init__(self, space: spaces.Space) -> None:
        self.env, self.space = EarlyExitEnv(), space
        self.possible_agents = self.env.possible_agents

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.space

    @property
    def agents(self):
        return self.env.agents

    def reset(self, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        return self.env.step({a: int(np.asarray(act).reshape(-1)[0] > 0.5) for a, act in actions.items()})


@pytest.mark.parametrize(
    "shaped, flat",
    [
        (spaces.Box(-1, 1, (2, 2), np.float32), spaces.Box(-1, 1, (4,), np.float32)),
        (spaces.MultiBinary([2, 2]), spaces.MultiBinary(4)),
    ],
    ids=["box", "multibinary"],
)
def test_actions_of_several_dimensions_train_as_their_flat_rows(shaped, flat):
    """The critic reads the groupmates' actions as the buffer keeps them, one flat row each: a team acting in a
    (2, 2) space trains exactly as one acting in the flat (4,) space, and acts in the space's shape."""
    settings = dict(n_envs=2, n_steps=16, batch_size=16, n_epochs=2, seed=0)
    models = [
        POCA("MlpPolicy", lambda space=space: _ShapedActions(space), **settings).learn(64) for space in (shaped, flat)
    ]
    for a, b in zip(models[0].critic.parameters(), models[1].critic.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    np.testing.assert_array_equal(models[0].rollout_buffer.actions, models[1].rollout_buffer.actions)
    obs = {agent: np.zeros(models[0].observation_space.shape, np.float32) for agent in models[0].agent_ids}
    assert all(action.shape == (2, 2) for action in models[0].predict(obs)[0].values())


def test_sac_only_policy_kwargs_are_refused():
    with pytest.raises(ValueError, match=r"policy_kwargs n_critics is SAC's number of Q networks"):
        POCA("MlpPolicy", EarlyExitEnv, policy_kwargs=dict(n_critics=2))


@pytest.mark.parametrize(
    "policy_kwargs, message",
    [
        ({"attention_heads": 0}, r"attention_heads=0 is invalid: it must be an int >= 1"),
        ({"attention_width": -8}, r"attention_width=-8 is invalid"),
        ({"attention_width": 16.7}, r"attention_width=16.7 is invalid"),
        ({"attention_width": 30, "attention_heads": 4}, r"attention_width=30 must be a multiple of attention_heads=4"),
    ],
)
def test_the_critics_attention_settings_are_checked_by_name(policy_kwargs, message):
    with pytest.raises(ValueError, match=message):
        POCA("MlpPolicy", EarlyExitEnv, policy_kwargs=policy_kwargs)


def test_a_rollout_of_one_group_step_logs_a_value_std_of_zero(recwarn):
    """One env copy and n_steps=1 hold one value: its std was NaN, with torch's degrees-of-freedom warning."""
    from stable_baselines3.common.logger import configure

    model = POCA("MlpPolicy", EarlyExitEnv, n_envs=1, n_steps=1, batch_size=2, seed=0)
    model.set_logger(configure(None, []))
    recwarn.clear()
    model.learn(1)
    assert model.logger.name_to_value["train/value_std"] == 0.0
    assert not [w for w in recwarn if "degrees of freedom" in str(w.message)]


class Relabeled(ParallelEnv):
    """EarlyExitEnv with agent ids ``names`` (its agents' in order), and each observation passed through ``look``
    into ``space`` where given."""

    metadata = {"name": "relabeled_v0", "render_modes": []}

    def __init__(self, names, space=None, look=None) -> None:
        self.env = EarlyExitEnv()
        self.name = dict(zip(self.env.possible_agents, names, strict=True))
        self.possible_agents = list(names)
        self.space, self.look = space, look

    def observation_space(self, agent):
        return self.space or self.env.observation_space(self.env.possible_agents[0])

    def action_space(self, agent):
        return self.env.action_space(self.env.possible_agents[0])

    @property
    def agents(self):
        return [self.name[a] for a in self.env.agents]

    def _named(self, values: dict, observations: bool = False) -> dict:
        return {self.name[a]: self.look(v) if observations and self.look else v for a, v in values.items()}

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._named(observations, True), self._named(infos)

    def step(self, actions):
        back = {original: actions[name] for original, name in self.name.items() if name in actions}
        observations, *rest = self.env.step(back)
        return self._named(observations, True), *(self._named(part) for part in rest)


def test_tuple_agent_ids_come_back_from_a_file(tmp_path):
    """PettingZoo's agent ids may be any hashable: a tuple id came back from JSON as a list, so the loaded model
    refused its own env's agents."""
    names = [("red", 0), ("red", 1), ("blue", 0)]
    model = POCA("MlpPolicy", lambda: Relabeled(names), n_steps=8, batch_size=8, seed=0).learn(8)
    model.save(tmp_path / "team.zip")
    loaded = POCA.load(tmp_path / "team.zip", env=lambda: Relabeled(names))
    assert loaded.agent_ids == names
    obs, _ = Relabeled(names).reset(seed=0)
    assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]
    assert loaded.learn(8, reset_num_timesteps=False).num_timesteps == 16


def test_the_same_agents_in_another_order_are_named_as_such(tmp_path):
    """A file's group and an env listing the same agents in another order (a set's order, which changes between
    processes): the error says it is the order, and what to do."""
    names = ["a", "b", "c"]
    POCA("MlpPolicy", lambda: Relabeled(names), n_steps=8, batch_size=8).save(tmp_path / "team.zip")
    with pytest.raises(ValueError, match=r"the same agents in another order: list possible_agents in a fixed order"):
        POCA.load(tmp_path / "team.zip", env=lambda: Relabeled(["c", "a", "b"]))
    with pytest.raises(ValueError, match=r"use an env with the same possible_agents"):
        POCA.load(tmp_path / "team.zip", env=lambda: Relabeled(["a", "b", "d"]))


def test_an_action_mask_in_the_observations_is_warned_about():
    """PettingZoo's {"observation", "action_mask"} layout: covey's policies do not mask, so the model says so
    (illegal actions were drawn without a word); PPO on a Gymnasium env too."""
    from envs import SpaceEnv

    inner = EarlyExitEnv().observation_space("agent_0")
    space = spaces.Dict({"observation": inner, "action_mask": spaces.MultiBinary(2)})
    masked = lambda: Relabeled(["a", "b", "c"], space, lambda o: {"observation": o, "action_mask": np.ones(2, np.int8)})  # noqa: E731
    with pytest.warns(UserWarning, match=r"'action_mask', but covey's policies do not mask actions.*MaskablePPO"):
        POCA("MultiInputPolicy", masked, n_steps=8, batch_size=8)
    with pytest.warns(UserWarning, match=r"'action_mask', but covey's policies do not mask actions"):
        PPO("MultiInputPolicy", SpaceEnv(space, spaces.Discrete(2)), n_steps=8, batch_size=8)


def test_a_tuple_observation_gets_advice_that_works_for_a_pettingzoo_env():
    """The Tuple-space error named Gymnasium's FlattenObservation only, which cannot wrap a PettingZoo env: the
    SuperSuit line it gives now trains, as written."""
    space = spaces.Tuple((spaces.Box(0.0, 1.0, (5,), np.float32), spaces.Discrete(2)))
    team = lambda: Relabeled(["a", "b", "c"], space, lambda o: (o, 1))  # noqa: E731
    with pytest.raises(ValueError, match="Unsupported observation space") as info:
        POCA("MlpPolicy", team)
    advice = re.search(
        r"supersuit\.observation_lambda_v0\(env, (.*), gymnasium\.spaces\.flatten_space\)", str(info.value)
    )
    import gymnasium

    flatten = eval(advice.group(1), {"gymnasium": gymnasium})  # noqa: S307 - the message's own code
    fixed = lambda: supersuit.observation_lambda_v0(team(), flatten, gymnasium.spaces.flatten_space)  # noqa: E731
    assert POCA("MlpPolicy", fixed, n_steps=8, batch_size=8, seed=0).learn(8).num_timesteps == 8


def test_use_sde_in_policy_kwargs_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="POCA has no state-dependent exploration.*Remove use_sde"):
        POCA("MlpPolicy", EarlyExitEnv(), n_envs=1, n_steps=8, batch_size=8, policy_kwargs=dict(use_sde=True))
    model = POCA("MlpPolicy", EarlyExitEnv(), n_envs=1, n_steps=8, batch_size=8, policy_kwargs=dict(use_sde=False))
    assert model.policy_config.use_sde is False  # use_sde=False is taken, as it changes nothing


def test_parameters_a_user_froze_stay_put_and_the_rest_trains():
    """requires_grad=False leaves a parameter out of POCA's update, as an optimizer over the parameters does: not
    moved by the momentum Adam built for it before it was frozen; the others train on."""
    model = POCA("MlpPolicy", EarlyExitEnv, n_steps=16, batch_size=16, n_epochs=2, seed=0)
    model.learn(32)  # Adam's moments exist for every parameter
    nets = {"actor": model.actor, "critic": model.critic}
    frozen = {"actor.trunk.0.weight", "critic.attention.attention.in_proj_weight"}
    params = {f"{key}.{name}": p for key, net in nets.items() for name, p in net.named_parameters()}
    for name in frozen:
        params[name].requires_grad_(False)
    before = {name: p.detach().clone() for name, p in params.items()}
    model.learn(32, reset_num_timesteps=False)
    for name, p in params.items():
        assert torch.equal(p, before[name]) == (name in frozen), name
        assert p.requires_grad == (name not in frozen), name


def test_target_kl_stops_the_update_as_in_sb3s_ppo(monkeypatch, capsys):
    """SB3 PPO's target_kl: once a minibatch's approximate KL exceeds 1.5 * target_kl, that minibatch is not
    stepped and the update ends (verbose=1 says so as SB3 does). The first minibatch of an update, from the
    rollout's own policy, has a KL of 0, so a tiny target_kl leaves exactly one step per update."""
    steps = []

    def counted(self, loss, max_grad_norm):
        steps.append(self._n_updates)
        return original(self, loss, max_grad_norm)

    original = POCA._optimizer_step
    monkeypatch.setattr(POCA, "_optimizer_step", counted)
    kwargs = dict(n_envs=2, n_steps=32, batch_size=16, n_epochs=3, learning_rate=1e-2, seed=0)
    POCA("MlpPolicy", EarlyExitEnv, **kwargs).learn(64)
    assert len(steps) == 3 * 4  # 3 epochs of 4 minibatches
    steps.clear()
    model = POCA("MlpPolicy", EarlyExitEnv, target_kl=1e-9, verbose=1, **kwargs).learn(64)
    assert len(steps) == 1 and model._n_updates == 1
    assert re.search(r"Early stopping at step 0 due to reaching max kl: \d", capsys.readouterr().out)
    assert model.target_kl == 1e-9
    with pytest.raises(ValueError, match=r"target_kl=-1.0 is invalid: it must be None or > 0"):
        POCA("MlpPolicy", EarlyExitEnv, target_kl=-1.0)


@pytest.mark.parametrize(
    "setting",
    [
        dict(clip_range_vf=0.2),
        dict(use_sde=True),
        dict(sde_sample_freq=4),
        dict(rollout_buffer_class=object),
        dict(rollout_buffer_kwargs=dict(gamma=0.9)),
    ],
    ids=lambda setting: next(iter(setting)),
)
def test_sb3_ppo_settings_that_poca_lacks_are_named(setting):
    """A PPO script moved to POCA with one of SB3 PPO's settings POCA has no counterpart for gets an error that
    names it and why, not a bare TypeError."""
    (name,) = setting
    with pytest.raises(ValueError, match=rf"POCA does not take {name}, SB3 PPO's setting: .*Remove {name}\."):
        POCA("MlpPolicy", EarlyExitEnv, **setting)


def test_the_group_env_renders_as_sb3s_vec_envs():
    """``model.get_env().render()`` (SB3's VecEnv call, which PPO scripts use for videos) gives the copies' frames
    tiled into one image, each copy's own ``render()``; copies made without a render mode give None and a warning
    that says how to get frames."""
    make = lambda: simple_spread_v3.parallel_env(N=3, max_cycles=10, render_mode="rgb_array")  # noqa: E731
    model = POCA("MlpPolicy", make, n_envs=2, n_steps=8, batch_size=16, seed=0).learn(16)
    venv = model.get_env()
    frames = venv.get_images()
    assert len(frames) == 2 and frames[0].ndim == 3 and frames[0].dtype == np.uint8
    for frame, env in zip(frames, venv.envs, strict=True):
        np.testing.assert_array_equal(frame, env.render())
    image = venv.render()
    height, width = frames[0].shape[:2]
    assert image.shape[0] >= height and image.shape[1] >= width and image.size >= 2 * frames[0].size
    np.testing.assert_array_equal(image[:height, :width], frames[0])
    quiet = POCA("MlpPolicy", lambda: simple_spread_v3.parallel_env(N=3, max_cycles=10), n_steps=8, batch_size=8)
    quiet.learn(8)
    with pytest.warns(UserWarning, match="render_mode='rgb_array'"):
        assert quiet.get_env().render() is None
    with pytest.raises(ValueError, match="render\\(mode='human'\\)"):
        venv.render("human")


def test_poca_policy_has_sb3s_vector_scaling_and_distribution_methods():
    """POCA's ``model.policy`` (the shared actor) answers the calls SB3 scripts make on any policy: the
    parameters as one vector (read and written in place, so training goes on from the written values), action
    scaling to and from [-1, 1], batch checks and the action distribution."""
    env = simple_spread_v3.parallel_env(N=2, max_cycles=5, continuous_actions=True)
    model = POCA("MlpPolicy", env, n_steps=8, batch_size=8, seed=0)
    policy = model.policy
    space = policy.action_space
    obs = np.random.default_rng(0).standard_normal((4, *policy.observation_space.shape)).astype(np.float32)

    vector = policy.parameters_to_vector()
    assert vector.shape == (sum(p.numel() for p in model.actor.parameters()),)
    before = policy.predict(obs, deterministic=True)[0]
    policy.load_from_vector(vector * 0.5)
    np.testing.assert_allclose(policy.parameters_to_vector(), vector * 0.5)
    assert not np.allclose(policy.predict(obs, deterministic=True)[0], before)
    with pytest.raises(ValueError, match=f"this policy has {vector.size} parameters"):
        policy.load_from_vector(vector[:-1])
    model.learn(16)  # the optimizer holds the parameters written, and moves them
    assert not np.allclose(policy.parameters_to_vector(), vector * 0.5)

    actions = np.random.default_rng(1).uniform(space.low, space.high, (4, *space.shape)).astype(np.float32)
    np.testing.assert_allclose(policy.scale_action(space.high), np.ones(space.shape))
    np.testing.assert_allclose(policy.scale_action(space.low), -np.ones(space.shape))
    np.testing.assert_allclose(policy.unscale_action(policy.scale_action(actions)), actions, rtol=1e-6, atol=1e-6)
    assert policy.is_vectorized_observation(obs) and not policy.is_vectorized_observation(obs[0])
    assert policy.squash_output is False

    obs_tensor = policy.obs_to_tensor(obs)[0]
    dist = policy.get_distribution(obs_tensor)
    with torch.no_grad():
        mode = dist.mode().numpy()
        log_prob = dist.log_prob(torch.as_tensor(actions)).numpy()
        by_head = model.actor.evaluate(obs_tensor, torch.as_tensor(actions))[0].numpy()
    np.testing.assert_allclose(np.clip(mode, space.low, space.high), policy.predict(obs, deterministic=True)[0])
    np.testing.assert_allclose(log_prob, by_head, rtol=1e-6)
    with pytest.raises(TypeError, match="obs_to_tensor"):
        policy.get_distribution(obs)


def test_pocas_arguments_follow_sb3_ppos_order_and_its_load_takes_sb3s(tmp_path):
    """SB3 PPO's arguments keep their positions in POCA (n_envs stood third: POCA("MlpPolicy", env, 1e-3) set
    n_envs=0.001), POCA's own come after device, and load takes SB3's arguments by position too."""
    import inspect

    import stable_baselines3

    ours = list(inspect.signature(POCA.__init__).parameters)
    theirs = list(inspect.signature(stable_baselines3.PPO.__init__).parameters)
    shared = [name for name in theirs if name in ours]
    assert ours[: ours.index("device") + 1] == shared[: shared.index("device") + 1]
    assert ours[ours.index("device") + 1 :] == ["n_envs", "baseline_coef", "groupmate_rewards", "_init_setup_model"]
    model = POCA("MlpPolicy", EarlyExitEnv, 1e-3, 8, 8, seed=0)
    assert (model.learning_rate, model.n_steps, model.batch_size, model.n_envs) == (1e-3, 8, 8, 1)
    model.save(tmp_path / "m")
    assert (
        list(inspect.signature(POCA.load).parameters)[:7]
        == list(inspect.signature(stable_baselines3.PPO.load).parameters)[:7]
    )
    loaded = POCA.load(tmp_path / "m", EarlyExitEnv, "cpu", None, False, True)
    assert loaded.device.type == "cpu" and loaded.n_steps == 8


class LayoutTeam(ParallelEnv):
    """Two agents observing 36x36x3 uint8 images (channels first with ``chw=True``), episodes of 4 steps."""

    metadata = {"name": "layout_team_v0"}

    def __init__(self, chw: bool = False):
        self.possible_agents = ["a", "b"]
        self.shape = (3, 36, 36) if chw else (36, 36, 3)

    def observation_space(self, agent):
        return spaces.Box(0, 255, self.shape, np.uint8)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: np.full(self.shape, 7 * self.t, np.uint8) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        obs = {a: np.full(self.shape, 7 * self.t, np.uint8) for a in self.agents}
        done = {a: self.t >= 4 for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        if self.t >= 4:
            self.agents = []
        return obs, rewards, done, {a: False for a in done}, {a: {} for a in done}


def test_a_team_loaded_with_images_in_the_other_layout_is_told_how_to_move_them(tmp_path):
    model = POCA("CnnPolicy", LayoutTeam, n_steps=8, batch_size=8, seed=0)
    model.save(tmp_path / "team")
    with pytest.raises(ValueError, match=r"keep their channels on the other side \(\(3, 36, 36\)\)") as info:
        POCA.load(tmp_path / "team.zip", env=lambda: LayoutTeam(chw=True))
    assert "np.moveaxis(obs, 0, -1)" in str(info.value)

    def moved():  # as the error says
        return supersuit.observation_lambda_v0(
            LayoutTeam(chw=True),
            lambda obs, space: np.moveaxis(obs, 0, -1),
            lambda space: spaces.Box(0, 255, (36, 36, 3), np.uint8),
        )

    loaded = POCA.load(tmp_path / "team.zip", env=moved)
    loaded.learn(8)
    assert loaded.num_timesteps == 8


def test_whole_floats_are_taken_for_the_copies_and_the_critics_width():
    """``n_envs=8.0`` or ``attention_width=64.0``, as a YAML file or ``1e1`` writes them, are the ints, as PPO's
    whole-number settings are; a fraction is named."""
    model = POCA(
        "MlpPolicy",
        EarlyExitEnv,
        n_envs=2.0,
        n_steps=16,
        batch_size=32,
        seed=0,
        policy_kwargs=dict(attention_width=16.0, attention_heads=2.0),
    )
    assert (model.n_envs, model.attention_width, model.attention_heads) == (2, 16, 2)
    assert type(model.attention_width) is int and model.critic.attention.n_heads == 2
    assert model.learn(32).num_timesteps == 32
    with pytest.raises(ValueError, match=r"n_envs=2.5 is invalid: it must be an int >= 1"):
        POCA("MlpPolicy", EarlyExitEnv, n_envs=2.5)
    with pytest.raises(ValueError, match=r"policy_kwargs attention_width=16.5 is invalid"):
        POCA("MlpPolicy", EarlyExitEnv, policy_kwargs=dict(attention_width=16.5))
