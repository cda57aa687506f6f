"""One update of covey's PPO is one update of SB3's: from the same weights and the same rollout (SB3's, copied
into covey's buffer), with the same minibatch orders, both change every parameter alike and log the same
statistics, on the hand-written path and through autograd."""

from __future__ import annotations

import numpy as np
import pytest
import stable_baselines3
import torch
from stable_baselines3.common.env_util import make_vec_env

import covey
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
    state = {k: v.detach().clone() for k, v in model.policy.state_dict().items()}
    return from_sb3("PPO", state) if sb3 else state


def one_update_each(monkeypatch, manual: bool, env_id: str, **kwargs):
    """(SB3's change, covey's change) of every parameter and both logs after one ``train()`` each."""
    monkeypatch.setattr(covey.PPO, "manual_gradients", manual)
    kwargs = dict(n_steps=N_STEPS, **kwargs)
    theirs = stable_baselines3.PPO("MlpPolicy", make_vec_env(env_id, N_ENVS, seed=0), seed=0, **kwargs)
    ours = covey.PPO("MlpPolicy", make_vec_env(env_id, N_ENVS, seed=0), seed=1, **kwargs)
    assert (ours._manual is not None) == manual
    with pytest.warns(UserWarning, match="not copied"):
        ours.set_parameters(theirs.get_parameters())
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
    after_theirs, after_ours = weights(theirs, sb3=True), weights(ours, sb3=False)
    changes = {k: (after_theirs[k] - before[k], after_ours[k] - before[k]) for k in before}
    logs = [{k: model.logger.name_to_value.get(f"train/{k}") for k in LOGGED} for model in (theirs, ours)]
    return changes, logs, (theirs._n_updates, ours._n_updates)


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
    changes, (theirs, ours), n_updates = one_update_each(monkeypatch, manual, env_id, **kwargs)
    assert n_updates[0] == n_updates[1]
    if case == "early stop on target_kl":
        assert n_updates[0] < kwargs["n_epochs"]
    for name, (their_change, our_change) in changes.items():
        scale = their_change.abs().max().item()
        assert scale > 0, name
        # Adam's first steps are about lr * sign(gradient), so a rounding difference in a gradient near zero
        # shows as a step of a few 1e-4 of the largest
        assert (our_change - their_change).abs().max().item() < 2e-3 * scale, name
    for key in LOGGED:
        if key == "std" and env_id == "CartPole-v1":
            assert theirs[key] is None and ours[key] is None
            continue
        assert ours[key] == pytest.approx(theirs[key], rel=1e-3, abs=1e-6), key
