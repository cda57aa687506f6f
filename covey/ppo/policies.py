"""``stable_baselines3.ppo.policies``' names for PPO's policy.

``PPO(MlpPolicy, env)`` builds the ``"MlpPolicy"`` networks (likewise ``CnnPolicy`` and ``MultiInputPolicy``),
and ``MlpPolicy.load(path)`` reads a file written by ``model.policy.save(path)`` (any of the three classes
reads any PPO policy; the file says which networks to build).
"""

from covey.networks.policies import ActorCriticPolicy

MlpPolicy = ActorCriticPolicy


class CnnPolicy(ActorCriticPolicy):
    """``PPO(CnnPolicy, env)`` builds the ``"CnnPolicy"`` networks; ``load`` is :meth:`ActorCriticPolicy.load`."""


class MultiInputPolicy(ActorCriticPolicy):
    """``PPO(MultiInputPolicy, env)`` builds the ``"MultiInputPolicy"`` networks; ``load`` is
    :meth:`ActorCriticPolicy.load`."""


__all__ = ["ActorCriticPolicy", "MlpPolicy", "CnnPolicy", "MultiInputPolicy"]
