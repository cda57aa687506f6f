"""A scale-free value head: a categorical distribution over symlog-spaced buckets (Hafner et al. 2023,
DreamerV3, https://arxiv.org/abs/2301.04104), trained with cross-entropy against two-hot targets.

``symlog(x) = sign(x) * log(1 + |x|)`` compresses large returns, so one set of buckets in ``[-20, 20]``
covers values up to about ``±5e8`` and the regression gradient no longer grows with the reward scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from covey.networks.linear import Linear


def symlog(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def symexp(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.expm1(x.abs())


def twohot(x: torch.Tensor, bins: torch.Tensor) -> torch.Tensor:
    """Encode values ``x`` ``(B,)`` on sorted ``bins`` ``(K,)`` as ``(B, K)`` weights on the two nearest bins.

    The weights are linear in the distance, so ``twohot(x) @ bins == x`` inside the range; values outside
    are clipped to the end bins.

    >>> twohot(torch.tensor([0.25]), torch.tensor([0.0, 1.0, 2.0]))
    tensor([[0.7500, 0.2500, 0.0000]])
    """
    x = x.clamp(bins[0], bins[-1])
    upper = torch.searchsorted(bins, x.contiguous(), right=True).clamp(1, len(bins) - 1)  # (B,)
    lower = upper - 1
    low_v, high_v = bins[lower], bins[upper]
    w_high = ((x - low_v) / (high_v - low_v)).clamp(0.0, 1.0)
    out = torch.zeros(*x.shape, len(bins), dtype=x.dtype, device=x.device)
    out.scatter_(-1, lower.unsqueeze(-1), (1.0 - w_high).unsqueeze(-1))
    out.scatter_add_(-1, upper.unsqueeze(-1), w_high.unsqueeze(-1))
    return out


class TwoHotHead(nn.Module):
    """``n_outputs`` value distributions over ``num_buckets`` symlog-spaced buckets.

    ``forward`` gives logits ``(..., n_outputs, num_buckets)`` (``(..., num_buckets)`` when
    ``n_outputs == 1``); :meth:`value` reads out
    ``symexp(sum_k p_k b_k)`` and :meth:`loss` is the cross-entropy against ``twohot(symlog(target))``.
    The output layer starts at zero, so every initial prediction is the uniform distribution's mean: 0 for a
    ``bucket_range`` symmetric about 0, as the default.
    """

    def __init__(
        self, in_dim: int, n_outputs: int = 1, num_buckets: int = 255, bucket_range: tuple[float, float] = (-20, 20)
    ) -> None:
        super().__init__()
        if num_buckets < 2 or not bucket_range[0] < bucket_range[1]:
            raise ValueError(
                f"Two-hot value head needs num_buckets >= 2 and bucket_range (low, high) with low < high, "
                f"got num_buckets={num_buckets}, bucket_range={bucket_range}."
            )
        self.n_outputs, self.num_buckets = n_outputs, num_buckets
        self.proj = Linear(in_dim, n_outputs * num_buckets)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        self.register_buffer("bins", torch.linspace(bucket_range[0], bucket_range[1], num_buckets))

    distributional = True

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        logits = self.proj(latent)
        if self.n_outputs == 1:
            return logits  # (..., K)
        return logits.reshape(*latent.shape[:-1], self.n_outputs, self.num_buckets)  # (..., n_outputs, K)

    def value(self, logits: torch.Tensor) -> torch.Tensor:
        """Expected value in real units from :meth:`forward`'s logits: ``(...)`` for one output, else
        ``(..., n_outputs)``."""
        return symexp((logits.softmax(-1) * self.bins).sum(-1))

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against two-hot(symlog(target)), per element ``(...,)`` (target detached)."""
        target_probs = twohot(symlog(target.detach()).reshape(-1), self.bins).reshape(*target.shape, -1)
        return -(target_probs * logits.log_softmax(-1)).sum(-1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        log_p = logits.log_softmax(-1)
        return -(log_p.exp() * log_p).sum(-1)


class ScalarHead(nn.Module):
    """The usual value head: ``n_outputs`` real numbers; ``value`` is the identity."""

    distributional = False

    def __init__(self, in_dim: int, n_outputs: int = 1) -> None:
        super().__init__()
        self.n_outputs = n_outputs
        self.proj = Linear(in_dim, n_outputs)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        out = self.proj(latent)  # (..., n_outputs)
        return out.squeeze(-1) if self.n_outputs == 1 else out

    def value(self, raw: torch.Tensor) -> torch.Tensor:
        return raw


def make_value_head(
    in_dim: int, n_outputs: int, kind: str = "scalar", num_buckets: int = 255, bucket_range=(-20.0, 20.0)
) -> nn.Module:
    """``"scalar"`` or ``"twohot"``; raw outputs drop the output axis when ``n_outputs == 1``."""
    if kind == "scalar":
        return ScalarHead(in_dim, n_outputs)
    if kind == "twohot":
        return TwoHotHead(in_dim, n_outputs, num_buckets, tuple(bucket_range))
    raise ValueError(f"Unknown value_head {kind!r}; use 'scalar' or 'twohot'.")


def distribution_ce(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``logits`` against the (detached) distribution of ``target_logits``, per element."""
    return -(F.softmax(target_logits.detach(), -1) * logits.log_softmax(-1)).sum(-1)
