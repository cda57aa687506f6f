"""Users' own SB3 policy classes: an ``ActorCriticPolicy`` subclass whose ``_build_mlp_extractor`` builds separate
policy and value towers (as SB3's "Custom Policy Network" page writes one), and a ``SACPolicy`` subclass with
LayerNorm critics. ``benchmarks.compare``'s ``ppo_cartpole_8env_custom_policy`` and ``sac_pendulum_custom_policy``
tasks train them with SB3's algorithms and with covey's, which run such classes through SB3's policy calls
(:mod:`covey.agents.sb3_policy`).
"""

from __future__ import annotations

import torch
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.sac.policies import ContinuousCritic, SACPolicy
from torch import nn


class Towers(nn.Module):
    """Policy and value towers of one ReLU layer each over the features."""

    def __init__(self, feature_dim: int, width: int = 64) -> None:
        super().__init__()
        self.latent_dim_pi = self.latent_dim_vf = width
        self.policy_net = nn.Sequential(nn.Linear(feature_dim, width), nn.ReLU())
        self.value_net = nn.Sequential(nn.Linear(feature_dim, width), nn.ReLU())

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy_net(features), self.value_net(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value_net(features)


class TowerPolicy(ActorCriticPolicy):
    """SB3's actor-critic policy with :class:`Towers` as its ``mlp_extractor`` and no orthogonal initialization."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["ortho_init"] = False
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = Towers(self.features_dim)


class LayerNormCritic(ContinuousCritic):
    """SB3's SAC critics with LayerNorm before each hidden ReLU."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for q_net in self.q_networks:
            for i, module in enumerate(q_net):
                if isinstance(module, nn.ReLU):
                    q_net[i] = nn.Sequential(nn.LayerNorm(q_net[i - 1].out_features), nn.ReLU())


class LayerNormSACPolicy(SACPolicy):
    """SB3's SAC policy whose ``make_critic`` builds :class:`LayerNormCritic` (the target critics too)."""

    def make_critic(self, features_extractor=None) -> ContinuousCritic:
        kwargs = self._update_features_extractor(self.critic_kwargs, features_extractor)
        return LayerNormCritic(**kwargs).to(self.device)
