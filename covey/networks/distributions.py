"""Action heads: a linear layer to distribution parameters, plus sampling, log-probabilities and entropy.

Written as plain tensor maths (no ``torch.distributions`` objects) because these run every step.
Every head maps latent features ``(B, in_dim)`` to parameters with ``forward``, and ``sample`` takes those
parameters. The heads PPO and POCA train also take them in ``log_prob`` and ``entropy``, which return ``(B,)``;
a squashed head has no closed-form entropy, so the caller asks ``log_prob_entropy`` of it (the entropy
``SquashedStateDependentHead`` inherits is its Gaussian's before tanh). SAC's heads draw differentiable
actions and their log-probabilities with ``rsample``; ``SquashedGaussianHead`` has no ``log_prob``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from covey.networks.linear import Linear

_LOG_2PI = math.log(2 * math.pi)


def _categorical_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    log_p = logits.log_softmax(-1)
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def _categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = logits.log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def _categorical_sample(logits: torch.Tensor, deterministic: bool) -> torch.Tensor:
    if deterministic:
        return logits.argmax(-1)
    # Gumbel-max: argmax(logits + Gumbel noise) is a sample from softmax(logits); -log(E) with E ~ Exp(1)
    # is Gumbel noise (one operation fewer than -log(-log(U)) with U uniform). E is kept above 0: log(0).
    noise = torch.empty_like(logits).exponential_().clamp_(min=1e-20).log_()
    return (logits - noise).argmax(-1)


class CategoricalHead(nn.Module):
    """Discrete(n, start) actions: logits ``(B, n)``; actions are ``start + index``."""

    def __init__(self, in_dim: int, n: int, start: int = 0) -> None:
        super().__init__()
        self.proj = Linear(in_dim, n)
        self.start = int(start)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj(latent)

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return _categorical_sample(logits, deterministic) + self.start

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return _categorical_log_prob(logits, actions - self.start)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return _categorical_entropy(logits)

    def log_prob_entropy(self, logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both at once, sharing one log-softmax (the training hot path)."""
        log_p = logits.log_softmax(-1)
        log_prob = log_p.gather(-1, (actions.long() - self.start).unsqueeze(-1)).squeeze(-1)
        return log_prob, -(log_p.exp() * log_p).sum(-1)

    # -- hand-differentiated training (see covey.networks.mlp.ManualMLP)
    def manual_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Stored actions ``(N,)`` in the form :meth:`manual_terms` takes: one-hot rows ``(N, n)``."""
        return F.one_hot(actions.long() - self.start, self.proj.out_features).float()

    def manual_terms(self, logits: torch.Tensor, onehot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Log-probabilities and entropies ``(B,)``, and what :meth:`manual_grad` needs."""
        log_p = logits.log_softmax(-1)
        p = log_p.exp()
        entropy = (p * log_p).sum(-1).neg_()
        return (log_p * onehot).sum(-1), entropy, (log_p, p, onehot, entropy)

    def manual_grad(self, terms: tuple, grad_log_prob: torch.Tensor, grad_entropy: float) -> torch.Tensor:
        """d(loss)/d(logits) ``(B, n)`` from d(loss)/d(log-probability) ``(B,)`` and the same
        d(loss)/d(entropy) for every sample."""
        log_p, p, onehot, entropy = terms
        # d log p(a) / d logits = onehot(a) - p;  d entropy / d logits = -p * (log p + entropy)
        grad = (onehot - p).mul_(grad_log_prob.unsqueeze(-1))
        if grad_entropy != 0.0:
            grad.addcmul_(p, log_p + entropy.unsqueeze(-1), value=-grad_entropy)
        return grad


class MultiCategoricalHead(nn.Module):
    """MultiDiscrete(nvec) actions: independent categoricals, logits concatenated ``(B, sum(nvec))``."""

    def __init__(self, in_dim: int, nvec: list[int], start: list[int] | None = None) -> None:
        super().__init__()
        self.nvec = [int(n) for n in nvec]
        self.start = [int(s) for s in start] if start is not None else [0] * len(self.nvec)
        self.proj = Linear(in_dim, sum(self.nvec))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj(latent)

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        parts = logits.split(self.nvec, dim=-1)
        samples = [_categorical_sample(p, deterministic) + s for p, s in zip(parts, self.start)]
        return torch.stack(samples, dim=-1)  # (B, k)

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        parts = logits.split(self.nvec, dim=-1)
        return sum(_categorical_log_prob(p, actions[..., i] - s) for i, (p, s) in enumerate(zip(parts, self.start)))

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return sum(_categorical_entropy(p) for p in logits.split(self.nvec, dim=-1))


class BernoulliHead(nn.Module):
    """MultiBinary(n) actions: one logit per bit ``(B, n)``."""

    def __init__(self, in_dim: int, n: int) -> None:
        super().__init__()
        self.proj = Linear(in_dim, n)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj(latent)

    def sample(self, logits: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return (logits > 0).float()
        return (torch.rand_like(logits) < torch.sigmoid(logits)).float()

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return -F.binary_cross_entropy_with_logits(logits, actions.float(), reduction="none").sum(-1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits)
        return F.binary_cross_entropy_with_logits(logits, p, reduction="none").sum(-1)


class DiagGaussianHead(nn.Module):
    """Box actions: a Gaussian with a state-independent log standard deviation per dimension.

    Parameters are the means ``(B, d)``; ``log_std`` is a learned vector. Samples are not clipped here:
    the agent clips what it sends to the env and trains on the unclipped sample.
    """

    def __init__(self, in_dim: int, action_dim: int, log_std_init: float = 0.0) -> None:
        super().__init__()
        self.proj = Linear(in_dim, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj(latent)

    def sample(self, mean: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            return mean
        return mean + self.log_std.exp() * torch.randn_like(mean)

    def log_prob(self, mean: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, mean: torch.Tensor) -> torch.Tensor:
        return (0.5 + 0.5 * _LOG_2PI + self.log_std).sum().expand(mean.shape[0])

    # -- hand-differentiated training (see covey.networks.mlp.ManualMLP)
    def manual_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Stored actions ``(N, d)`` in the form :meth:`manual_terms` takes (unchanged)."""
        return actions

    def manual_terms(self, mean: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Log-probabilities and entropies ``(B,)``, and what :meth:`manual_grad` needs."""
        log_std = self.log_std.detach()
        inv_std = log_std.neg().exp_()
        z = (actions - mean).mul_(inv_std)  # (B, d)
        zz = z * z
        log_prob = zz.sum(-1).mul_(-0.5).sub_(log_std.sum() + 0.5 * _LOG_2PI * z.shape[-1])
        entropy = (log_std.sum() + (0.5 + 0.5 * _LOG_2PI) * z.shape[-1]).expand(z.shape[0])
        return log_prob, entropy, (z, zz, inv_std)

    def manual_grad(self, terms: tuple, grad_log_prob: torch.Tensor, grad_entropy: float) -> torch.Tensor:
        """d(loss)/d(mean) ``(B, d)`` from d(loss)/d(log-probability) ``(B,)`` and the same d(loss)/d(entropy)
        for every sample; writes d(loss)/d(log_std) into ``log_std.grad``."""
        z, zz, inv_std = terms
        # d log p / d mean = z / std;  d log p / d log_std = z^2 - 1;  d entropy / d log_std = 1 (per sample)
        torch.mv((zz - 1.0).t(), grad_log_prob, out=self.log_std.grad).add_(grad_entropy * z.shape[0])
        return (z * inv_std).mul_(grad_log_prob.unsqueeze(-1))


class StateDependentGaussianHead(nn.Module):
    """Box actions with generalized state-dependent exploration (gSDE, Raffin et al. 2021,
    https://arxiv.org/abs/2005.05719): SB3's ``use_sde=True``.

    The exploration noise is a linear function of the latent features, ``latent @ E`` with ``E`` ``(in_dim,
    d)`` drawn from N(0, std^2) and kept for a while (:meth:`reset_noise`): the same state gives the same
    noise until ``E`` is drawn again, which makes for smoother exploration than fresh noise at every step.
    The action distribution is then N(mean, latent^2 @ std^2) per dimension. ``log_std`` is a learned
    ``(in_dim, d)`` matrix (``(in_dim, 1)`` shared by all actions with ``full_std=False``); ``use_expln``
    maps it to std with ``exp`` below 0 and ``log1p(x) + 1`` above, which grows slower. The latent enters
    the variance without a gradient (SB3's default, ``learn_features=False``).

    Parameters are ``(B, d + in_dim)``: the means, then the (detached) latent the variance needs.
    """

    epsilon = 1e-6
    """Added to the variance, as in SB3."""

    def __init__(
        self, in_dim: int, action_dim: int, log_std_init: float = 0.0, full_std: bool = True, use_expln: bool = False
    ) -> None:
        super().__init__()
        self.proj = Linear(in_dim, action_dim)
        self.in_dim, self.action_dim, self.use_expln = in_dim, action_dim, use_expln
        self.log_std = nn.Parameter(torch.full((in_dim, action_dim if full_std else 1), float(log_std_init)))
        self.exploration: torch.Tensor | None = None  # E for one observation (or a batch of another size)
        self.exploration_noise: torch.Tensor | None = None  # E / std of the last differentiable draw
        self.explorations: torch.Tensor | None = None  # one E per env, (n, in_dim, d)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.proj(latent), latent.detach()], dim=-1)

    def std(self) -> torch.Tensor:
        """The weights' standard deviations ``(in_dim, d)``."""
        log_std = self.log_std
        if self.use_expln:
            # Each branch reads log_std only where it is taken (0 elsewhere, so neither overflows); both have slope
            # 1 at 0. Not clamp_max/clamp_min, whose gradient at the bound itself is 0 from PyTorch 2.14 on: at
            # log_std_init=0 (SB3's default) log_std would never move.
            below, above = log_std <= 0, log_std > 0
            std = torch.where(below, log_std.where(below, 0.0).exp(), torch.log1p(log_std.where(above, 0.0)) + 1.0)
        else:
            std = log_std.exp()
        return std.expand(self.in_dim, self.action_dim)

    def reset_noise(self, n: int = 1, differentiable: bool = False) -> None:
        """Draw new exploration matrices: one for single observations and one per row of batches of ``n``.
        ``differentiable``: the single one as ``std * N(0, 1)``, through which a loss reaches ``log_std``
        (SAC's gradient steps, as SB3's ``rsample`` of the weights)."""
        with torch.no_grad():
            std = self.std()
            self.explorations = torch.normal(torch.zeros_like(std).expand(n, -1, -1), std.expand(n, -1, -1))
            self.exploration = torch.normal(torch.zeros_like(std), std)
        if differentiable:
            self.exploration_noise = torch.randn_like(std)  # kept for a hand-written gradient (SAC's manual step)
            self.exploration = self.std() * self.exploration_noise

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return params[..., : self.action_dim], params[..., self.action_dim :]

    def _scale(self, latent: torch.Tensor, std: torch.Tensor | None = None) -> torch.Tensor:
        """The action's standard deviation ``(B, d)`` for the latent ``(B, in_dim)`` (``std``: :meth:`std`, if the
        caller has it)."""
        std = self.std() if std is None else std
        return (latent.square() @ std.square() + self.epsilon).sqrt()

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        mean, latent = self._split(params)
        if deterministic:
            return mean
        if self.exploration is None:
            self.reset_noise()
        if self.explorations is not None and len(latent) == len(self.explorations) > 1:
            return mean + torch.bmm(latent.unsqueeze(1), self.explorations).squeeze(1)  # each row its own E
        return mean + latent @ self.exploration

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, latent = self._split(params)
        scale = self._scale(latent)
        return (-0.5 * ((actions - mean) / scale).square() - scale.log() - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return (0.5 + 0.5 * _LOG_2PI + self._scale(self._split(params)[1]).log()).sum(-1)

    # -- hand-differentiated training (see covey.agents.ppo.ManualPPOUpdate)
    def manual_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Stored actions ``(N, d)`` in the form :meth:`manual_terms` takes (unchanged)."""
        return actions

    def manual_terms(
        self, mean: torch.Tensor, actions: torch.Tensor, latent: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """Log-probabilities and entropies ``(B,)`` from the means ``(B, d)`` and the latent ``(B, in_dim)``
        (which enters the variance without a gradient), and what :meth:`manual_grad` needs."""
        std = self.std().detach()
        scale = self._scale(latent, std)
        z = (actions - mean).div_(scale)
        log_scale = scale.log()
        d = mean.shape[-1]
        log_prob = (-0.5 * z.square() - log_scale).sum(-1).sub_(0.5 * _LOG_2PI * d)
        entropy = log_scale.sum(-1).add_((0.5 + 0.5 * _LOG_2PI) * d)
        return log_prob, entropy, (latent, std, scale, z)

    def manual_grad(self, terms: tuple, grad_log_prob: torch.Tensor, grad_entropy: float) -> torch.Tensor:
        """d(loss)/d(mean) ``(B, d)`` from d(loss)/d(log-probability) ``(B,)`` and the same d(loss)/d(entropy)
        for every sample; writes d(loss)/d(log_std) (through the variance) into ``log_std.grad``."""
        latent, std, scale, z = terms
        grad_log_prob = grad_log_prob.unsqueeze(-1)
        # d log p / d mean = z / scale; d log p / d scale = (z^2 - 1) / scale; d entropy / d scale = 1 / scale
        grad_variance = (z * z - 1.0).mul_(grad_log_prob).add_(grad_entropy).div_(2.0 * scale * scale)
        self._write_log_std_grad(2.0 * std * (latent.square().t() @ grad_variance))
        return (z / scale).mul_(grad_log_prob)

    def _write_log_std_grad(self, grad_std: torch.Tensor) -> None:
        """``log_std.grad`` from d(loss)/d(std()) ``(in_dim, d)``."""
        log_std = self.log_std
        if log_std.shape[1] != grad_std.shape[1]:  # full_std=False: one std per latent feature, for every action
            grad_std = grad_std.sum(-1, keepdim=True)
        if self.use_expln:  # exp below 0, log1p(x) + 1 above
            d_std = torch.where(log_std <= 0, log_std.clamp_max(0.0).exp(), 1.0 / (1.0 + log_std.clamp_min(0.0)))
        else:
            d_std = log_std.exp()
        torch.mul(grad_std, d_std, out=log_std.grad)


class SquashedStateDependentHead(StateDependentGaussianHead):
    """Box actions with state-dependent exploration squashed by tanh into [-1, 1]: SAC's with ``use_sde=True``,
    and PPO's with ``use_sde=True`` and ``policy_kwargs=dict(squash_output=True)``.

    The Gaussian of :class:`StateDependentGaussianHead`, its mean kept in [-clip_mean, clip_mean] (SB3 SAC's
    Hardtanh; PPO's is not clipped, ``clip_mean=0``). With ``learn_features`` (SAC's, as in SB3) the latent
    takes gradients through the noise and the variance too; without (PPO's) only through the mean.
    ``rsample`` uses the single exploration matrix, which SAC draws anew, differentiably, at every gradient
    step. The squashed Gaussian's entropy has no closed form: :meth:`log_prob_entropy` gives PPO's estimate,
    minus the log-probability (SB3's)."""

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        log_std_init: float = -3.0,
        full_std: bool = True,
        use_expln: bool = False,
        clip_mean: float = 2.0,
        learn_features: bool = True,
    ) -> None:
        super().__init__(in_dim, action_dim, log_std_init, full_std, use_expln)
        self.clip_mean, self.learn_features = clip_mean, learn_features

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        mean = self.proj(latent)
        if self.clip_mean > 0:
            mean = F.hardtanh(mean, -self.clip_mean, self.clip_mean)
        return torch.cat([mean, latent if self.learn_features else latent.detach()], dim=-1)

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return torch.tanh(super().sample(params, deterministic))

    def rsample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A differentiable sample in [-1, 1] and its log-probability ``(B,)`` (with tanh's change of variables,
        ``log(1 - tanh(u)^2 + 1e-6)`` as in SB3)."""
        if self.exploration is None:
            self.reset_noise()
        mean, latent = self._split(params)
        u = mean + latent @ self.exploration
        scale = self._scale(latent)
        gauss = (-0.5 * ((u - mean) / scale).square() - scale.log() - 0.5 * _LOG_2PI).sum(-1)
        action = torch.tanh(u)
        return action, gauss - torch.log(1.0 - action.square() + self.epsilon).sum(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of actions in [-1, 1] (clipped just inside, to invert tanh)."""
        a = actions.clamp(-1.0 + 1e-6, 1.0 - 1e-6)
        u = torch.atanh(a)
        return super().log_prob(params, u) - torch.log(1.0 - a.square() + self.epsilon).sum(-1)

    def log_prob_entropy(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions`` and, for the entropy, its estimate from those actions: minus their
        log-probabilities (what SB3's PPO uses when the distribution has no closed-form entropy)."""
        log_prob = self.log_prob(params, actions)
        return log_prob, -log_prob

    # -- hand-differentiated training (see covey.agents.sac.ManualSACStep)
    def manual_rsample(self, raw_mean: torch.Tensor, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """:meth:`rsample` from the mean layer's output before the clip, ``raw_mean`` ``(B, d)``, and the latent
        ``(B, in_dim)``, with the exploration matrix of the last ``reset_noise(differentiable=True)``; and what
        :meth:`manual_grad` needs."""
        mean = F.hardtanh(raw_mean, -self.clip_mean, self.clip_mean) if self.clip_mean > 0 else raw_mean
        std = self.std()
        scale = self._scale(latent, std)
        u = mean + latent @ self.exploration
        z = (u - mean).div_(scale)
        gauss = (-0.5 * z.square() - scale.log() - 0.5 * _LOG_2PI).sum(-1)
        action = torch.tanh(u)
        squash = 1.0 - action.square() + self.epsilon
        log_prob = gauss - squash.log().sum(-1)
        return action, log_prob, (raw_mean, latent, std, scale, z, action, squash)

    def manual_grad(
        self, terms: tuple, grad_action: torch.Tensor, grad_log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """d(loss)/d(raw_mean) ``(B, d)`` and d(loss)/d(latent) ``(B, in_dim)`` from d(loss)/d(action) ``(B, d)``
        and d(loss)/d(log-probability) ``(B,)`` of a :meth:`manual_rsample`; d(loss)/d(log_std) is written into
        ``log_std.grad``. The latent is reached through the mean layer (by the caller), the noise ``latent @ E``
        and the variance ``latent^2 @ std^2``; ``log_std`` through ``E = std * N(0, 1)`` and the variance."""
        raw_mean, latent, std, scale, z, action, squash = terms
        grad_log_prob = grad_log_prob.unsqueeze(-1)
        z_over_scale = z / scale
        # u = mean + latent @ E: tanh's derivative for the action, and for the log-probability the Gaussian's
        # -z / scale and the correction's 2 a (1 - a^2) / (1 - a^2 + eps), where the correction is log(1 - a^2 + eps).
        # The mean moves u and the Gaussian's centre together, so its z / scale terms cancel (written out: exact).
        slope = 1.0 - action * action
        grad_mean = slope * grad_action + grad_log_prob * (2.0 * action * slope / squash)
        grad_u = grad_mean - grad_log_prob * z_over_scale
        # scale = sqrt(latent^2 @ std^2 + eps): d(-z^2 / 2 - log scale)/d scale = (z^2 - 1) / scale
        grad_variance = grad_log_prob * (z * z - 1.0) / (2.0 * scale * scale)
        variance_weights = std.square()
        grad_latent = grad_u @ self.exploration.t() + 2.0 * latent * (grad_variance @ variance_weights.t())
        grad_std = (latent.t() @ grad_u).mul_(self.exploration_noise)  # E = std * noise
        grad_std += 2.0 * std * (latent.square().t() @ grad_variance)
        self._write_log_std_grad(grad_std)
        if self.clip_mean > 0:  # the clip passes gradients strictly inside (-clip_mean, clip_mean), as hardtanh's
            grad_mean.mul_((raw_mean > -self.clip_mean) & (raw_mean < self.clip_mean))
        return grad_mean, grad_latent


def make_action_head(
    space: spaces.Space, in_dim: int, log_std_init: float = 0.0, sde: dict | None = None, squashed: bool = False
) -> nn.Module:
    """The head for ``space`` (Discrete, MultiDiscrete, MultiBinary or Box); ``sde`` (``full_std``,
    ``use_expln``, and ``clip_mean`` when squashed): Box actions with state-dependent exploration
    (:class:`StateDependentGaussianHead`). ``squashed`` Box actions go through tanh into [-1, 1]: SAC's
    (:class:`SquashedGaussianHead`, or :class:`SquashedStateDependentHead` with ``sde``), and PPO's with
    ``use_sde`` and ``squash_output``."""
    if squashed and isinstance(space, spaces.Box):
        if sde is not None:
            return SquashedStateDependentHead(in_dim, int(np.prod(space.shape)), log_std_init, **sde)
        return SquashedGaussianHead(in_dim, int(np.prod(space.shape)))
    if sde is not None:
        if not isinstance(space, spaces.Box):
            raise ValueError(f"use_sde=True applies to Box actions, not {space}: remove use_sde.")
        return StateDependentGaussianHead(in_dim, int(np.prod(space.shape)), log_std_init, **sde)
    if isinstance(space, spaces.Discrete):
        return CategoricalHead(in_dim, int(space.n), int(space.start))
    if isinstance(space, spaces.MultiDiscrete):
        return MultiCategoricalHead(in_dim, list(space.nvec.reshape(-1)), list(space.start.reshape(-1)))
    if isinstance(space, spaces.MultiBinary):
        return BernoulliHead(in_dim, int(np.prod(space.shape)))
    if isinstance(space, spaces.Box):
        return DiagGaussianHead(in_dim, int(np.prod(space.shape)), log_std_init)
    raise ValueError(f"Unsupported action space {space}: use Box, Discrete, MultiDiscrete or MultiBinary.")


class SquashedGaussianHead(nn.Module):
    """Box actions for SAC: a Gaussian with state-dependent std, squashed by tanh into [-1, 1].

    ``forward`` returns ``(mean, log_std)`` concatenated ``(B, 2d)``; ``rsample`` draws a
    reparameterized action in [-1, 1] with its log-probability, including the tanh change of variables as SB3
    writes it, ``log p(a) = log N(u) - sum log(1 - tanh(u)^2 + 1e-6)`` (the 1e-6 bounds the correction where
    tanh saturates).
    """

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
    epsilon = 1e-6

    def __init__(self, in_dim: int, action_dim: int) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.proj = Linear(in_dim, 2 * action_dim)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.proj(latent)

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Slices, not params.split(d): torch's ONNX exporter writes an equal split as a Split node with an
        # opset-18 attribute even at opset 17 (SB3's export recipe), which onnxruntime then refuses.
        d = self.action_dim
        mean, log_std = params[..., :d], params[..., d:]
        # hardtanh is torch.clamp in value; its gradient passes strictly inside the bounds on every PyTorch
        # (torch.clamp's passes at the bounds too before 2.14), as manual_grad's does.
        return mean, F.hardtanh(log_std, self.LOG_STD_MIN, self.LOG_STD_MAX)

    def sample(self, params: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        mean, log_std = self._split(params)
        if deterministic:
            return torch.tanh(mean)
        return torch.tanh(mean + log_std.exp() * torch.randn_like(mean))

    def rsample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A differentiable sample in [-1, 1] and its log-probability ``(B,)``."""
        action, log_prob, _ = self.manual_rsample(params)
        return action, log_prob

    # -- hand-differentiated training (see covey.agents.sac.ManualSACStep)
    def manual_rsample(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """:meth:`rsample` (differentiable where ``params`` is), and what :meth:`manual_grad` needs."""
        mean, log_std = self._split(params)
        noise = torch.randn_like(mean)
        std = log_std.exp()
        u = mean + std * noise
        gauss = (-0.5 * noise.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)
        action = torch.tanh(u)
        squash = 1.0 - action * action + self.epsilon
        return action, gauss - squash.log().sum(-1), (params, noise, std, action, squash)

    def manual_grad(self, terms: tuple, grad_action: torch.Tensor, grad_log_prob: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(params) ``(B, 2d)`` from d(loss)/d(action) ``(B, d)`` and d(loss)/d(log-probability)
        ``(B,)`` of a :meth:`manual_rsample`."""
        params, noise, std, action, squash = terms
        grad_log_prob = grad_log_prob.unsqueeze(-1)
        # u = mean + std * noise; d action / du = 1 - action^2; d log-probability / du = 2 a (1 - a^2) / (1 - a^2
        # + eps) (the correction's derivative) and d log-probability / d log_std = -1 at fixed noise.
        slope = 1.0 - action * action
        grad_u = slope * grad_action + grad_log_prob * (2.0 * action * slope / squash)
        grad_log_std = (grad_u * std).mul_(noise).sub_(grad_log_prob)
        log_std = params[..., self.action_dim :]  # the clip passes gradients strictly inside (min, max) only
        grad_log_std.mul_((log_std > self.LOG_STD_MIN) & (log_std < self.LOG_STD_MAX))
        return torch.cat([grad_u, grad_log_std], dim=-1)


class ActionDistribution:
    """The action distribution of a batch of observations, with the methods of SB3's ``Distribution``.

    ``log_prob``, ``entropy``, ``sample`` and ``mode`` are the head's own (what training uses);
    ``distribution`` is the matching ``torch.distributions`` object (a list of them for MultiDiscrete
    actions, as in SB3). ``params`` are the head's parameters (logits, or Gaussian means).
    """

    def __init__(self, head: nn.Module, params: torch.Tensor, action_space: spaces.Space) -> None:
        self.head, self.params, self.action_space = head, params, action_space

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``(B,)`` of ``actions`` (summed over action dimensions)."""
        return self.head.log_prob(self.params, _as_head_actions(actions, self.action_space, self.params))

    def entropy(self) -> torch.Tensor | None:
        """Entropies ``(B,)``; None for a squashed Gaussian (SAC's, or PPO's with ``squash_output``), which has no
        closed form (SB3's too)."""
        if isinstance(self.head, (SquashedGaussianHead, SquashedStateDependentHead)):
            return None
        return self.head.entropy(self.params)

    def sample(self) -> torch.Tensor:
        return self.get_actions(deterministic=False)

    def mode(self) -> torch.Tensor:
        return self.get_actions(deterministic=True)

    def get_actions(self, deterministic: bool = False) -> torch.Tensor:
        """Actions shaped as the action space, batched (in [-1, 1] where the actor squashes them)."""
        actions = self.head.sample(self.params, deterministic)
        return actions.reshape((-1, *self.action_space.shape))

    @property
    def action_dim(self) -> int:
        """SB3's ``action_dim`` of a Categorical (the number of actions) or Gaussian distribution (of action
        components); MultiCategorical and Bernoulli ones have :attr:`action_dims`, as in SB3."""
        if isinstance(self.head, CategoricalHead):
            return int(self.action_space.n)
        if isinstance(self.head, (MultiCategoricalHead, BernoulliHead)):
            raise AttributeError(
                "A MultiCategorical or Bernoulli distribution has action_dims, as in SB3, not action_dim"
            )
        return int(np.prod(self.action_space.shape))

    @property
    def action_dims(self) -> list[int] | int:
        """SB3's ``action_dims``: per component, the number of actions (MultiCategorical), or the number of
        binary components (Bernoulli)."""
        if isinstance(self.head, MultiCategoricalHead):
            return [int(n) for n in self.action_space.nvec.reshape(-1)]
        if isinstance(self.head, BernoulliHead):
            return int(np.prod(self.action_space.shape))
        raise AttributeError("A Categorical or Gaussian distribution has action_dim, as in SB3, not action_dims")

    @property
    def distribution(self):
        """The ``torch.distributions`` object (SB3's ``.distribution`` attribute)."""
        head, params = self.head, self.params
        dist = torch.distributions
        if isinstance(head, CategoricalHead):
            return dist.Categorical(logits=params)
        if isinstance(head, MultiCategoricalHead):
            return [dist.Categorical(logits=part) for part in params.split(head.nvec, dim=-1)]
        if isinstance(head, BernoulliHead):
            return dist.Bernoulli(logits=params)
        if isinstance(head, DiagGaussianHead):
            return dist.Normal(params, head.log_std.exp().expand_as(params))
        if isinstance(head, StateDependentGaussianHead):
            mean, latent = head._split(params)
            return dist.Normal(mean, head._scale(latent))
        if isinstance(head, SquashedGaussianHead):  # before the tanh, as SB3's
            mean, log_std = head._split(params)
            return dist.Normal(mean, log_std.exp())
        raise TypeError(f"No torch distribution for {type(head).__name__}.")


def _as_head_actions(actions: torch.Tensor, space: spaces.Space, params: torch.Tensor) -> torch.Tensor:
    """Actions as SB3 passes them (Discrete as ``(B,)`` or ``(B, 1)``, any float or int dtype) in the
    layout covey's heads take: ``(B,)`` for Discrete, ``(B, k)`` for the others."""
    if not isinstance(actions, torch.Tensor):
        raise TypeError(f"actions must be a torch.Tensor, got {type(actions).__name__}; use torch.as_tensor(actions).")
    batch = params.shape[0]
    actions = actions.to(params.device)
    return actions.reshape(batch) if isinstance(space, spaces.Discrete) else actions.reshape(batch, -1)
