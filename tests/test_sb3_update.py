"""One update of covey is one update of SB3's, on the hand-written path and through autograd: PPO from the same
weights and the same rollout (SB3's, copied into covey's buffer) with the same minibatch orders, SAC from the
same weights (targets and temperature included) on the same sampled batch with the same noise; every
parameter changes alike and the logged statistics are the same."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import stable_baselines3
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.type_aliases import ReplayBufferSamples

import covey
from covey.buffers.replay import ReplayBatch
from covey.networks.sb3_names import from_sb3

N_STEPS, N_ENVS = 64, 2
LOGGED = ("policy_gradient_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction", "loss", "std")


class SameOrders:
    """Both libraries draw the same minibatch orders: SB3 shuffles its env-major rollout with
    ``np.random.permutation``, covey its step-major one with ``torch.randperm``; each epoch's draw is mapped
    onto the other's layout."""

    def __init__(self, monkeypatch, seed: int = 123) -> None:
        n = N_STEPS * N_ENVS
        rng = np.random.default_rng(seed)
        sb3_orders = [rng.permutation(n) for _ in range(64)]
        j = np.arange(n)
        covey_index = (j % N_STEPS) * N_ENVS + j // N_STEPS  # SB3's row of (env, step) -> covey's row
        sb3_iter = iter(sb3_orders)
        covey_iter = iter([torch.as_tensor(covey_index[order]) for order in sb3_orders])
        np_permutation, randperm = np.random.permutation, torch.randperm

        def permutation(x, *args, **kwargs):
            return next(sb3_iter).copy() if isinstance(x, (int, np.integer)) and x == n else np_permutation(x)

        def covey_randperm(size, *args, **kwargs):
            return next(covey_iter).clone() if size == n else randperm(size, *args, **kwargs)

        monkeypatch.setattr(np.random, "permutation", permutation)
        monkeypatch.setattr(torch, "randperm", covey_randperm)


def copy_rollout(source, target) -> None:
    """SB3's collected rollout (env-major after its flattening, ``(n_steps, n_envs)`` before) into covey's."""
    src, dst = source.rollout_buffer, target.rollout_buffer
    dst.observations_tensor.copy_(torch.as_tensor(src.observations).reshape(dst.observations_tensor.shape))
    dst.actions_tensor.copy_(
        torch.as_tensor(src.actions).reshape(dst.actions_tensor.shape).to(dst.actions_tensor.dtype)
    )
    dst.rewards[:] = src.rewards
    dst.episode_starts[:] = src.episode_starts
    dst.values_tensor = torch.as_tensor(src.values.copy())
    dst.log_probs_tensor = torch.as_tensor(src.log_probs.copy())
    dst.advantages_tensor = torch.as_tensor(src.advantages.copy())
    dst.returns_tensor = torch.as_tensor(src.returns.copy())
    dst.pos = dst.n_steps


def weights(model, sb3: bool) -> dict[str, torch.Tensor]:
    """The model's parameters by covey's names (SB3's renamed), with SAC's learned log-temperature."""
    state = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
    state = from_sb3(type(model).__name__, state) if sb3 else state
    if getattr(model, "log_ent_coef", None) is not None:
        state["log_ent_coef"] = model.log_ent_coef.detach().clone().reshape(-1)
    return state


def assert_same_changes(before, after_theirs, after_ours, tolerance: float) -> None:
    """Each parameter tensor moved alike: the largest difference of the two changes is under ``tolerance`` times
    the largest change."""
    for name in before:
        their_change, our_change = after_theirs[name] - before[name], after_ours[name] - before[name]
        scale = their_change.abs().max().item()
        assert scale > 0, name
        assert (our_change - their_change).abs().max().item() < tolerance * scale, name


def freeze(model, names) -> None:
    """``requires_grad=False`` on the model's parameters of those names (SB3's or covey's)."""
    params = dict(model.policy.named_parameters())
    for name in names:
        params[name].requires_grad_(False)


def assert_frozen_and_the_rest_same(before, after, frozen, tolerance: float) -> None:
    """The frozen parameters (covey's names) did not move in either library; the others moved alike."""
    for name in frozen:
        assert torch.equal(after[0][name], before[name]) and torch.equal(after[1][name], before[name]), name
    rest = {name: value for name, value in before.items() if name not in frozen}
    assert_same_changes(rest, *after, tolerance=tolerance)


def one_update_each(
    monkeypatch, manual: bool, env_id: str, moments: str = "none yet", frozen: dict[str, str] | None = None, **kwargs
):
    """The parameters before, after one ``train()`` of each (SB3's, covey's), both logs and update counts.

    ``moments``: "none yet" (both start), "SB3's" (SB3 trains one rollout first; covey takes its weights and
    Adam's moments) or "fresh" (the same, then covey's moments are dropped). ``frozen``: covey's names of
    parameters to freeze in both (``requires_grad=False``) before the update, with SB3's names."""
    monkeypatch.setattr(covey.PPO, "manual_gradients", manual)
    kwargs = dict(n_steps=N_STEPS, **kwargs)
    theirs = stable_baselines3.PPO("MlpPolicy", make_vec_env(env_id, N_ENVS, seed=0), seed=0, **kwargs)
    ours = covey.PPO("MlpPolicy", make_vec_env(env_id, N_ENVS, seed=0), seed=1, **kwargs)
    assert (ours._manual is not None) == manual
    if moments != "none yet":
        theirs.learn(N_STEPS * N_ENVS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the optimizer's state is copied too
        ours.set_parameters(theirs.get_parameters())
    if moments == "fresh":
        ours.optimizer.state.clear()
    freeze(ours, frozen or {})
    freeze(theirs, (frozen or {}).values())
    before = weights(theirs, sb3=True)
    _, callback = theirs._setup_learn(N_STEPS * N_ENVS, None)
    theirs.collect_rollouts(theirs.env, callback, theirs.rollout_buffer, n_rollout_steps=N_STEPS)
    ours._setup_learn(N_STEPS * N_ENVS, None, True, "test", False)
    copy_rollout(theirs, ours)
    ours._value_entropy = None  # a diagnostic of covey's own evaluation of a rollout, which this one skipped
    ours._current_progress_remaining = theirs._current_progress_remaining = 1.0
    SameOrders(monkeypatch)
    theirs.train()
    ours.train()
    after = weights(theirs, sb3=True), weights(ours, sb3=False)
    logs = [{k: model.logger.name_to_value.get(f"train/{k}") for k in LOGGED} for model in (theirs, ours)]
    return before, after, logs, (theirs._n_updates, ours._n_updates)


CASES = {
    "discrete, 4 epochs of 8 minibatches": ("CartPole-v1", dict(batch_size=16, n_epochs=4, learning_rate=3e-3)),
    "box, entropy bonus, tight clipping": (
        "Pendulum-v1",
        dict(batch_size=32, n_epochs=3, learning_rate=3e-3, ent_coef=0.01, clip_range=0.1),
    ),
    "early stop on target_kl": ("CartPole-v1", dict(batch_size=16, n_epochs=4, learning_rate=0.01, target_kl=0.002)),
    "plain gradients: raw advantages, clipped norm": (
        "CartPole-v1",
        dict(
            batch_size=32,
            n_epochs=2,
            learning_rate=0.05,
            normalize_advantage=False,
            max_grad_norm=0.1,
            vf_coef=1.3,
            policy_kwargs=dict(optimizer_class=torch.optim.SGD),
        ),
    ),
}


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_ppo_update_is_sb3s(monkeypatch, case, manual):
    env_id, kwargs = CASES[case]
    before, after, (theirs, ours), n_updates = one_update_each(monkeypatch, manual, env_id, **kwargs)
    assert n_updates[0] == n_updates[1]
    if case == "early stop on target_kl":
        assert n_updates[0] < kwargs["n_epochs"]
    # Adam's first steps are about lr * sign(gradient), so a rounding difference in a gradient near zero shows as
    # a step of a few 1e-4 of the largest
    assert_same_changes(before, *after, tolerance=2e-3)
    for key in LOGGED:
        if key == "std" and env_id == "CartPole-v1":
            assert theirs[key] is None and ours[key] is None
            continue
        assert ours[key] == pytest.approx(theirs[key], rel=1e-3, abs=1e-6), key


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
@pytest.mark.parametrize("moments", ["SB3's", "fresh"])
def test_a_ppo_update_goes_on_from_sb3s_adam_moments(monkeypatch, moments, manual):
    """SB3 trains a rollout; covey takes its weights and its optimizer's state (Adam's moments and step count,
    moved to covey's parameter order), and the next update moves every parameter as SB3's next one does. The
    same with covey's moments dropped moves them otherwise: the moments are what the first case carries over."""
    env_id, kwargs = CASES["discrete, 4 epochs of 8 minibatches"]
    before, after, _, n_updates = one_update_each(monkeypatch, manual, env_id, moments=moments, **kwargs)
    assert n_updates[0] == 2 * kwargs["n_epochs"] and n_updates[1] == kwargs["n_epochs"]
    if moments == "SB3's":
        assert_same_changes(before, *after, tolerance=1e-4)
    else:
        with pytest.raises(AssertionError):
            assert_same_changes(before, *after, tolerance=0.1)


def sac_steps_each(
    monkeypatch, manual: bool, gradient_steps: int, moments: str = "none yet", frozen: dict | None = None, **kwargs
):
    """Parameters (targets and log-temperature included) before and after ``train(gradient_steps)`` of SB3's SAC
    and covey's, from the same weights, on one fixed batch, with the same noise; and both logs. ``moments`` and
    ``frozen`` as in :func:`one_update_each` (SB3 takes 3 gradient steps on the batch first)."""
    monkeypatch.setattr(covey.SAC, "manual_gradients", manual)
    theirs = stable_baselines3.SAC("MlpPolicy", "Pendulum-v1", seed=0, learning_starts=0, **kwargs)
    ours = covey.SAC("MlpPolicy", "Pendulum-v1", seed=1, learning_starts=0, **kwargs)
    assert (ours._manual is not None) == manual
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # targets apart from the critics, and a temperature other than its start
        for p in theirs.critic_target.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
        if theirs.log_ent_coef is not None:
            theirs.log_ent_coef.sub_(0.3)
    n = 64
    obs, next_obs = (torch.rand(n, 3, generator=generator) * 2 - 1 for _ in range(2))
    actions = torch.rand(n, 1, generator=generator) * 2 - 1
    rewards = torch.randn(n, generator=generator)
    terminated = torch.rand(n, generator=generator) < 0.2
    samples = ReplayBufferSamples(obs, actions, next_obs, terminated.float()[:, None], rewards[:, None], None)
    batch = ReplayBatch(obs, actions, next_obs, rewards, terminated.float())  # as the buffer stores it
    monkeypatch.setattr(theirs.replay_buffer, "sample", lambda *args, **kw: samples)
    monkeypatch.setattr(ours.replay_buffer, "sample_batch", lambda *args, **kw: batch)
    theirs._setup_learn(1000, None)
    if moments != "none yet":
        torch.manual_seed(5)
        theirs.train(gradient_steps=3, batch_size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the optimizers' states are copied too
        ours.set_parameters(theirs.get_parameters())
    if theirs.log_ent_coef is not None:
        with torch.no_grad():
            ours.log_ent_coef.copy_(theirs.log_ent_coef.reshape(ours.log_ent_coef.shape))
    if moments == "fresh":
        for optimizer in (ours.actor_optimizer, ours.critic_optimizer, ours.ent_coef_optimizer):
            if optimizer is not None:
                optimizer.state.clear()
    freeze(ours, frozen or {})
    freeze(theirs, (frozen or {}).values())
    before = weights(theirs, sb3=True)
    assert all(torch.equal(value, before[name]) for name, value in weights(ours, sb3=False).items())
    ours._setup_learn(1000, None, True, "test", False)
    for model in (theirs, ours):
        torch.manual_seed(7)  # the actor's noise: both draw it in the same order
        model.train(gradient_steps=gradient_steps, batch_size=n)
    keys = ("actor_loss", "critic_loss", "ent_coef", "ent_coef_loss")
    logs = [{k: model.logger.name_to_value.get(f"train/{k}") for k in keys} for model in (theirs, ours)]
    return before, (weights(theirs, sb3=True), weights(ours, sb3=False)), logs


SAC_CASES = {  # settings, and the tolerance on the changes
    "plain gradients, learned temperature, 3 steps": (
        dict(
            gradient_steps=3,
            tau=0.3,
            gamma=0.9,
            learning_rate=0.01,
            policy_kwargs=dict(optimizer_class=torch.optim.SGD),
        ),
        2e-4,  # SGD's steps are the gradients: float rounding only
    ),
    # Adam's first steps divide each gradient by its own size, so a rounding difference in a gradient near zero
    # shows as a step of up to a few 1e-3 of the largest
    "Adam, fixed temperature": (dict(gradient_steps=2, ent_coef=0.2, learning_rate=3e-3), 1e-2),
}


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
@pytest.mark.parametrize("case", list(SAC_CASES))
def test_sac_gradient_steps_are_sb3s(monkeypatch, case, manual):
    """Actor, critics, targets and the temperature (stepped by Adam in both, whatever optimizer the networks
    take) move alike, tanh's correction being SB3's ``log(1 - a^2 + 1e-6)``."""
    kwargs, tolerance = SAC_CASES[case]
    before, after, (theirs, ours) = sac_steps_each(monkeypatch, manual, **kwargs)
    assert ("log_ent_coef" in before) == ("learned" in case)
    assert_same_changes(before, *after, tolerance=tolerance)
    for key, value in theirs.items():
        assert (ours[key] is None) == (value is None), key
        if value is not None:
            assert ours[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
@pytest.mark.parametrize("moments", ["SB3's", "fresh"])
def test_sac_gradient_steps_go_on_from_sb3s_adam_moments(monkeypatch, moments, manual):
    """SB3's SAC takes three gradient steps; covey takes its weights and the states of its three Adams (actor,
    critics, temperature), and the next two steps move every parameter as SB3's do; with covey's moments dropped
    they move otherwise."""
    before, after, _ = sac_steps_each(monkeypatch, manual, gradient_steps=2, moments=moments, learning_rate=3e-3)
    assert "log_ent_coef" in before
    if moments == "SB3's":
        assert_same_changes(before, *after, tolerance=1e-3)
    else:
        with pytest.raises(AssertionError):
            assert_same_changes(before, *after, tolerance=0.1)


FROZEN_PPO = {
    # the hand-written backward writes the frozen layer's gradient: it must count in no clipped norm
    "plain gradients, clipped norm": ("plain gradients: raw advantages, clipped norm", "none yet"),
    # Adam's moments from SB3's first rollout would move a frozen parameter, and its exploration std
    "Adam going on from SB3's moments": ("box, entropy bonus, tight clipping", "SB3's"),
}


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
@pytest.mark.parametrize("case", list(FROZEN_PPO))
def test_parameters_a_user_froze_stay_as_sb3_leaves_them_in_ppo(monkeypatch, case, manual):
    """A parameter with ``requires_grad=False`` (a fixed exploration std, a frozen layer) is left out of the
    update as SB3's optimizer leaves it out: it does not move, its gradient counts in no clipping, and every
    other parameter moves as SB3's do."""
    setting, moments = FROZEN_PPO[case]
    env_id, kwargs = CASES[setting]
    frozen = {
        "actor.trunk.0.weight": "mlp_extractor.policy_net.0.weight",
        "critic.trunk.2.bias": "mlp_extractor.value_net.2.bias",
    }
    if env_id == "Pendulum-v1":
        frozen["actor.head.log_std"] = "log_std"
    before, after, (theirs, ours), _ = one_update_each(
        monkeypatch, manual, env_id, moments=moments, frozen=frozen, **kwargs
    )
    assert_frozen_and_the_rest_same(before, after, frozen, tolerance=2e-3)
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-3, abs=1e-6)


@pytest.mark.parametrize("manual", [True, False], ids=["hand-written", "autograd"])
def test_parameters_a_user_froze_stay_as_sb3_leaves_them_in_sac(monkeypatch, manual):
    """As in PPO: a frozen actor layer and a frozen critic layer keep their values through SAC's gradient steps
    (Adam's moments from SB3's steps before the freezing included), the actor's loss leaves the critic's frozen
    layer frozen after it, and every other parameter, the targets included, moves as SB3's do."""
    frozen = {"actor.trunk.0.weight": "actor.latent_pi.0.weight", "critic.qs.0.trunk.2.weight": "critic.qf0.2.weight"}
    before, after, _ = sac_steps_each(
        monkeypatch, manual, gradient_steps=2, moments="SB3's", frozen=frozen, learning_rate=3e-3
    )
    assert_frozen_and_the_rest_same(before, after, frozen, tolerance=1e-3)


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_a_script_that_wraps_the_optimizers_step_has_it_called_at_every_update_as_in_sb3(name):
    """``optimizer.step`` replaced on the optimizer (a wrapper that logs or edits the gradients, an LR scheduler's
    counter) runs at every gradient step, as SB3 calls it: covey's direct fused step, which skips the optimizer's
    step() once Adam's state exists, stands aside while one is there."""
    import stable_baselines3

    import covey

    def count_steps(lib):
        if name == "PPO":
            model = lib.PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0)
            optimizer = model.policy.optimizer
        else:
            model = lib.SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, seed=0)
            optimizer = model.critic.optimizer
        calls = []
        step = optimizer.step

        def counted(*args, **kwargs):
            calls.append(1)
            return step(*args, **kwargs)

        optimizer.step = counted
        model.learn(128)
        return len(calls)

    expected = 2 * 2 * 2 if name == "PPO" else 128 - 16  # PPO: 2 updates of 2 epochs of 2 minibatches
    assert count_steps(covey) == count_steps(stable_baselines3) == expected


def script_steps(model, name: str, zero: str, steps: range) -> None:
    """A script's own gradient steps with the model's optimizer, as SB3's ``train()`` and behaviour-cloning loops
    write them: the first loss (step 0) reaches every parameter (Adam's moments exist after it). PPO's next ones
    reach the actor only (its log-probabilities), so the critic has no gradient; SAC's reach both Q-networks, which
    covey runs in one pass (one unreached would get zeros from it, where SB3's gets None)."""
    gen = torch.Generator().manual_seed(7)
    if name == "PPO":
        obs, actions = torch.randn(32, 4, generator=gen), torch.randint(0, 2, (32,), generator=gen)
        optimizer, module = model.policy.optimizer, model.policy
    else:
        obs, actions = torch.randn(32, 3, generator=gen), torch.rand(32, 1, generator=gen) * 2 - 1
        target = torch.randn(32, 1, generator=gen)
        optimizer, module = model.critic.optimizer, model.critic
    for i in steps:
        if name == "PPO":
            values, log_prob, _ = model.policy.evaluate_actions(obs, actions)
            loss = -log_prob.mean() + (values.pow(2).mean() if i == 0 else 0.0)
        else:
            q_values = model.critic(obs, actions)
            loss = sum((q - target * (i + 1)).pow(2).mean() for q in q_values)
        if zero == "optimizer":
            optimizer.zero_grad()
        elif zero == "module":
            module.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 0.5)
        optimizer.step()


@pytest.mark.parametrize("zero", ["optimizer", "module", "optimizer, set_to_none=False"])
@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_a_scripts_own_steps_with_the_models_optimizer_move_the_parameters_as_sb3s_do(name, zero):
    """``optimizer.zero_grad()`` sets the gradients to None (torch's default), so a backward writes new tensors
    outside covey's flat gradient buffer: the step takes them in, where it used to step the zeroed buffer and
    change nothing. Parameters no loss reached keep their values with ``set_to_none`` (SB3's optimizer skips
    them) and move by Adam's momentum without it, as in SB3."""
    import covey

    env = "CartPole-v1" if name == "PPO" else "Pendulum-v1"
    theirs = getattr(stable_baselines3, name)("MlpPolicy", env, seed=0)
    ours = getattr(covey, name)("MlpPolicy", env, seed=1)
    ours.policy.load_state_dict(theirs.policy.state_dict())
    for model in (theirs, ours):
        script_steps(model, name, zero, range(1))
    middle, middle_ours = weights(theirs, sb3=True), weights(ours, sb3=False)
    torch.testing.assert_close(middle_ours, middle, rtol=1e-4, atol=1e-6)
    for model in (theirs, ours):
        script_steps(model, name, zero, range(1, 3))
    after_theirs, after_ours = weights(theirs, sb3=True), weights(ours, sb3=False)
    unreached = [k for k in middle if name == "PPO" and k.startswith("critic.")]
    assert unreached or name == "SAC"
    for k in unreached:  # SB3 skips them with set_to_none, and Adam's momentum moves them without it
        assert torch.equal(after_theirs[k], middle[k]) == (zero != "optimizer, set_to_none=False"), k
    for k in middle:
        torch.testing.assert_close(after_ours[k], after_theirs[k], rtol=1e-4, atol=1e-6)
        assert torch.equal(after_ours[k], middle_ours[k]) == torch.equal(after_theirs[k], middle[k]), k


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_a_subclass_whose_train_is_sb3s_trains_and_logs_the_learning_rate(name):
    """SB3's own ``train()`` on covey's model (the usual start of an auxiliary loss): it steps
    ``policy.optimizer`` (SAC: the actor's and critic's) after ``zero_grad()``, reads SAC's
    ``batch_norm_stats``, and finds ``train/learning_rate`` logged by ``_update_learning_rate``."""
    import covey

    base = getattr(covey, name)
    subclass = type("Mine", (base,), {"train": getattr(stable_baselines3, name).train})
    if name == "PPO":
        model = subclass("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0)
        parts = {"policy": model.policy}
    else:
        model = subclass("MlpPolicy", "Pendulum-v1", learning_starts=20, batch_size=16, seed=0)
        parts = {"actor": model.actor, "critic": model.critic}
    before = {k: torch.nn.utils.parameters_to_vector(m.parameters()).clone() for k, m in parts.items()}
    model.learn(128 if name == "PPO" else 40)
    assert model._n_updates > 0
    for k, m in parts.items():
        assert not torch.equal(torch.nn.utils.parameters_to_vector(m.parameters()), before[k]), k
    assert model.logger.name_to_value["train/learning_rate"] == pytest.approx(3e-4)


def test_a_subclass_whose_collect_rollouts_is_sb3s_fills_the_buffer_as_sb3s_does():
    """SB3's own ``collect_rollouts`` in a subclass (the start of an intrinsic bonus, say) passes the step's
    values and log-probs to ``rollout_buffer.add`` in SB3's order and folds time limits' bootstraps into the
    rewards: covey's buffer takes that form, and its advantages and returns are SB3's, time limits included.
    The values went where covey keeps episode starts, and the rollout failed at its end."""
    import gymnasium as gym
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    import covey

    class Mine(covey.PPO):
        collect_rollouts = OnPolicyAlgorithm.collect_rollouts

    class Keep(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            self.kept = {k: np.array(getattr(buffer, k), dtype=np.float64).reshape(64, 2) for k in fields}

    fields = ("actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")
    models = []
    for cls in (stable_baselines3.PPO, Mine):
        env = make_vec_env(lambda: gym.make("CartPole-v1", max_episode_steps=20), n_envs=2, seed=3)
        models.append(cls("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, gamma=0.9, gae_lambda=0.8, seed=0))
    theirs, ours = models
    ours.policy.load_state_dict(theirs.policy.state_dict())
    rollouts = []
    for model in models:
        torch.manual_seed(5)
        callback = Keep()
        model.learn(64, callback=callback)
        rollouts.append(callback.kept)
    their_rollout, our_rollout = rollouts
    assert their_rollout["episode_starts"][1:].sum() >= 4  # time limits inside the rollout
    for k in fields:
        np.testing.assert_allclose(our_rollout[k], their_rollout[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert ours._n_updates == theirs._n_updates == 1


def test_a_subclass_whose_sac_collect_rollouts_is_sb3s_trains_as_covey_collects():
    """SB3's own off-policy ``collect_rollouts`` in a SAC subclass calls SB3's helpers by SB3's signatures
    (``_sample_action``, ``_store_transition(replay_buffer, ...)``, ``_on_step``, ``_dump_logs()``,
    ``_update_current_progress_remaining(num_timesteps, total)``): the run is the one covey's own collection
    makes, step for step, where it failed at the first step."""
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    import covey

    class Mine(covey.SAC):
        collect_rollouts = OffPolicyAlgorithm.collect_rollouts

    runs = []
    for cls in (covey.SAC, Mine):
        noise = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
        model = cls("MlpPolicy", "Pendulum-v1", learning_starts=20, batch_size=16, action_noise=noise, seed=0)
        model.learn(260, log_interval=1)
        runs.append(model)
    ours, mine = runs
    assert mine._episode_num == ours._episode_num == 1
    np.testing.assert_array_equal(mine.replay_buffer.actions[:260], ours.replay_buffer.actions[:260])
    for name, value in weights(ours, sb3=False).items():
        torch.testing.assert_close(weights(mine, sb3=False)[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("name", ["PPO", "SAC"])
def test_a_script_clipping_the_optimizers_own_parameters_clips_as_sb3s_does(name):
    """A script that clips (or reads) the gradients of optimizer.param_groups' parameters between its backward and
    its step: covey's optimizer holds one flat buffer, whose gradient stayed None after zero_grad(), so the
    clipping saw no gradient (norm 0) and the step took them unclipped. The buffer's gradient now fills as the
    backward reaches each parameter: the same norm and the same step as SB3's, and parameters no loss reached
    still stay."""
    import covey

    env = "CartPole-v1" if name == "PPO" else "Pendulum-v1"
    theirs = getattr(stable_baselines3, name)("MlpPolicy", env, seed=0)
    ours = getattr(covey, name)("MlpPolicy", env, seed=1)
    ours.policy.load_state_dict(theirs.policy.state_dict())
    obs = torch.as_tensor(
        np.random.default_rng(0).normal(size=(64, *theirs.observation_space.shape)), dtype=torch.float32
    )
    norms = []
    for model in (theirs, ours):
        optimizer = model.policy.optimizer if name == "PPO" else model.critic.optimizer
        for _ in range(2):
            optimizer.zero_grad()
            if name == "PPO":  # the value branch alone: the actor's layers get no gradient
                loss = 1000 * model.policy.predict_values(obs).pow(2).mean()
            else:
                actions = torch.zeros(64, 1)
                loss = 1000 * sum(q.pow(2).mean() for q in model.critic(obs, actions))
            loss.backward()
            params = [p for group in optimizer.param_groups for p in group["params"]]
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, 0.5)))
            optimizer.step()
    assert norms[0] > 1.0 and norms[:2] == pytest.approx(norms[2:], rel=1e-4)
    after_theirs, after_ours = weights(theirs, sb3=True), weights(ours, sb3=False)
    for k in after_theirs:
        torch.testing.assert_close(after_ours[k], after_theirs[k], rtol=1e-4, atol=1e-6)
