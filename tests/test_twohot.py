"""The scale-free critic: symlog/two-hot maths by hand, gradient isolation, the EMA regularizer."""

import math
import warnings

import numpy as np
import pytest
import torch

from covey import PPO, SAC
from covey.agents.ppo import ppo_loss
from covey.networks.ema import CriticEMA
from covey.networks.twohot import TwoHotHead, symexp, symlog, twohot


def test_symlog_symexp_are_inverse_over_a_wide_range():
    x = torch.tensor([-1e8, -12345.6, -3.0, -1e-6, 0.0, 1e-6, 0.5, 7.0, 1e4, 1e8], dtype=torch.float64)
    torch.testing.assert_close(symexp(symlog(x)), x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(symlog(symexp(x / 1e7)), x / 1e7, rtol=1e-12, atol=1e-12)
    # by hand: symlog(e - 1) = log(e) = 1, symlog(-(e^2 - 1)) = -2
    assert symlog(torch.tensor(math.e - 1)).item() == pytest.approx(1.0)
    assert symlog(torch.tensor(-(math.e**2 - 1))).item() == pytest.approx(-2.0)


BINS = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])


@pytest.mark.parametrize(
    "x, expected",
    [
        (1.0, [0, 0, 0, 1, 0]),  # on a bucket: all weight there
        (0.25, [0, 0, 0.75, 0.25, 0]),  # a quarter of the way from 0 to 1
        (-1.5, [0.5, 0.5, 0, 0, 0]),  # halfway between -2 and -1
        (1.9, [0, 0, 0, 0.1, 0.9]),
        (7.0, [0, 0, 0, 0, 1]),  # above the range: clipped to the last bucket
        (-3.0, [1, 0, 0, 0, 0]),  # below the range: clipped to the first bucket
        (2.0, [0, 0, 0, 0, 1]),  # the upper edge itself
    ],
)
def test_twohot_by_hand(x, expected):
    out = twohot(torch.tensor([x]), BINS)
    torch.testing.assert_close(out, torch.tensor([expected], dtype=torch.float32))


def test_expectation_of_twohot_recovers_the_value():
    bins = torch.linspace(-20, 20, 255)
    x = torch.linspace(-19.9, 19.9, 1001)
    torch.testing.assert_close(twohot(x, bins) @ bins, x, rtol=0, atol=1e-5)


def test_head_reads_out_symexp_of_the_expectation_and_learns_any_scale():
    """A head whose logits put all mass on two-hot(symlog(v)) reads out v; cross-entropy fits 1e5 as well as 1."""
    head = TwoHotHead(4, num_buckets=255)
    assert torch.all(head(torch.randn(3, 4)) == 0)  # zero-initialized: uniform, reads out 0
    target = torch.tensor([3.0, -250.0, 1e5])
    logits = torch.log(twohot(symlog(target), head.bins) + 1e-30)
    torch.testing.assert_close(head.value(logits), target, rtol=1e-4, atol=1e-4)
    loss = head.loss(logits, target)
    entropy_of_target = -(
        twohot(symlog(target), head.bins).clamp_min(1e-30).log() * twohot(symlog(target), head.bins)
    ).sum(-1)
    torch.testing.assert_close(loss, entropy_of_target, rtol=1e-4, atol=1e-4)  # CE = H(target) at the optimum


def test_value_clipping_is_refused_with_the_twohot_head():
    with pytest.raises(ValueError, match="clip_range_vf does not apply"):
        PPO("MlpPolicy", "CartPole-v1", clip_range_vf=0.2, policy_kwargs=dict(value_head="twohot"))


def _collected(model):
    _, callback = model._setup_learn(model.n_steps, None, True, "test", False)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    return model


def _grads(module, loss):
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    return any(g is not None and bool(g.abs().sum() > 0) for g in grads)


def test_gradient_isolation_holds_with_the_twohot_head():
    model = _collected(
        PPO(
            "MlpPolicy",
            "CartPole-v1",
            n_steps=64,
            batch_size=64,
            seed=0,
            policy_kwargs=dict(value_head="twohot", critic_ema_decay=0.9),
        )
    )
    batch = next(model.rollout_buffer.minibatches(64))
    # Policy part only (vf_coef=0): nothing reaches the critic or its EMA.
    loss, _ = ppo_loss(batch, model.actor, model.critic, 0.2, None, 0.01, 0.0, True, model.critic_ema.model)
    assert _grads(model.actor, loss) and not _grads(model.critic, loss)
    # Value part only: the two-hot cross-entropy (+ EMA regularizer) reaches the critic, not the actor.
    raw = model.critic.raw(batch.observations)
    value_loss = model.critic.value_head.loss(raw, batch.returns + 5.0).mean()
    assert _grads(model.critic, value_loss) and not _grads(model.actor, value_loss)
    assert all(not p.requires_grad for p in model.critic_ema.model.parameters())


def test_ema_has_no_gradients_and_moves_by_the_decay():
    critic = torch.nn.Linear(3, 1)
    ema = CriticEMA(critic, decay=0.9)
    before = [p.clone() for p in ema.model.parameters()]
    with torch.no_grad():
        for p in critic.parameters():
            p.add_(1.0)
    ema.update()
    for old, new, src in zip(before, ema.model.parameters(), critic.parameters()):
        # ema <- 0.9 * ema + 0.1 * critic, and critic = old + 1  =>  ema = old + 0.1
        torch.testing.assert_close(new, old + 0.1)
        assert new.grad is None and not new.requires_grad
        assert not torch.equal(new, src)


def test_ppo_trains_the_ema_and_saves_it(tmp_path):
    model = PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=64,
        batch_size=32,
        seed=0,
        policy_kwargs=dict(value_head="twohot", critic_ema_decay=0.98),
    )
    initial = [p.clone() for p in model.critic_ema.model.parameters()]
    model.learn(128)
    moved = [p for p, q in zip(model.critic_ema.model.parameters(), initial) if not torch.equal(p, q)]
    assert moved, "the EMA copy must follow the critic"
    model.save(tmp_path / "m.zip")
    loaded = PPO.load(tmp_path / "m.zip")
    for p, q in zip(loaded.critic_ema.model.parameters(), model.critic_ema.model.parameters()):
        torch.testing.assert_close(p, q)
    obs = np.zeros((2, 4), np.float32)
    t = torch.as_tensor(obs, device=model.device)
    torch.testing.assert_close(loaded.critic(t), model.critic(t))


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_sac_twohot_q_heads_train_and_isolate(env_id):
    model = SAC(
        "MlpPolicy",
        env_id,
        learning_starts=32,
        batch_size=32,
        seed=0,
        policy_kwargs=dict(net_arch=[32, 32], value_head="twohot", critic_ema_decay=0.98),
    )
    model.learn(100)
    b = model.replay_buffer.sample_batch(32)
    loss, stats, _ = model._critic_objective(b, model._ent_coef())
    assert _grads(model.critic, loss) and not _grads(model.actor, loss)
    assert {"q_entropy", "critic_ema_loss"} <= set(stats)
    q = model.critic.values(b.observations) if model.discrete else model.critic.values(b.observations, b.actions)
    assert q.shape[:2] == (2, 32) and torch.isfinite(q).all()


def test_diagnostics_are_logged(tmp_path):
    from stable_baselines3.common.logger import configure

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=64, seed=0, policy_kwargs=dict(value_head="twohot"))
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(64 * 3)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in (
        "train/explained_variance",
        "train/td_error_abs",
        "train/value_mean",
        "train/value_std",
        "train/value_entropy",
    ):
        assert key in header


def test_poca_uses_the_twohot_head_and_the_ema(tmp_path):
    """POCA: the two-hot head serves value and baselines, and the EMA copy follows the critic and is saved."""
    from covey import POCA
    from covey.envs import EarlyExitEnv

    model = POCA(
        "MlpPolicy",
        EarlyExitEnv,
        n_envs=2,
        n_steps=16,
        batch_size=32,
        seed=0,
        policy_kwargs=dict(value_head="twohot", critic_ema_decay=0.9),
    )
    assert model.critic.value_head.distributional
    before = [p.clone() for p in model.critic_ema.model.parameters()]
    model.learn(64)
    assert any(not torch.equal(p, q) for p, q in zip(model.critic_ema.model.parameters(), before))
    assert all(not p.requires_grad for p in model.critic_ema.model.parameters())
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(64)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in ("train/explained_variance", "train/td_error_abs", "train/value_std", "train/value_entropy"):
        assert key in header
    model.save(tmp_path / "poca.zip")
    loaded = POCA.load(tmp_path / "poca.zip")
    for p, q in zip(loaded.critic_ema.model.parameters(), model.critic_ema.model.parameters()):
        torch.testing.assert_close(p, q)


def test_two_hot_settings_without_the_two_hot_head_are_warned_of():
    """num_buckets and bucket_range were taken without value_head='twohot' and ignored silently, where
    observation_clip without normalize_observations is refused."""
    from covey import POCA
    from covey.envs import EarlyExitEnv

    makers = [
        lambda kw: PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, policy_kwargs=kw),
        lambda kw: SAC("MlpPolicy", "Pendulum-v1", buffer_size=100, policy_kwargs=kw),
        lambda kw: POCA("MlpPolicy", EarlyExitEnv, n_steps=8, batch_size=8, policy_kwargs=kw),
    ]
    for make in makers:
        with pytest.warns(UserWarning, match=r"num_buckets and bucket_range shape the two-hot critic, but value_head="):
            make(dict(num_buckets=11, bucket_range=(-5, 5)))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            model = make(dict(value_head="twohot", num_buckets=11))
        assert any(getattr(m, "num_buckets", None) == 11 for m in model.critic.modules())
