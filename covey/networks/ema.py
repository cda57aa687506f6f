"""Exponential moving averages of networks: SAC's target critics and the optional critic EMA regularizer."""

from __future__ import annotations

import copy

import torch
from torch import nn

from covey.networks.twohot import distribution_ce


def polyak_update(targets: list[torch.Tensor], sources: list[torch.Tensor], tau: float) -> None:
    """In place: ``target <- (1 - tau) * target + tau * source`` for every pair, in one foreach op."""
    with torch.no_grad():
        torch._foreach_lerp_(targets, sources, tau)


class CriticEMA:
    """A frozen copy of a critic that follows it with ``ema <- decay * ema + (1 - decay) * critic``.

    It only regularizes the critic (:func:`ema_regularizer`); it is never used for targets.

    >>> ema = CriticEMA(nn.Linear(2, 1), decay=0.98)
    >>> all(not p.requires_grad for p in ema.model.parameters())
    True
    """

    def __init__(self, critic: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"critic_ema_decay={decay} is invalid: it must lie in (0, 1), e.g. 0.98.")
        self.decay = decay
        self.model = copy.deepcopy(critic).requires_grad_(False)
        self._sources = list(critic.parameters())
        self._targets = list(self.model.parameters())

    def update(self) -> None:
        """Move the copy toward the critic; call after each optimizer step."""
        polyak_update(self._targets, self._sources, 1.0 - self.decay)


def ema_regularizer(raw: torch.Tensor, ema_raw: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """Pulls the critic's outputs toward the EMA's: squared error for scalar heads, cross-entropy against
    the EMA's distribution for two-hot heads. The EMA side carries no gradient."""
    if head.distributional:
        return distribution_ce(raw, ema_raw).mean()
    return (raw - ema_raw.detach()).pow(2).mean()
