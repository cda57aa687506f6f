"""``stable_baselines3.ppo.policies``' names for PPO's policy.

``PPO(MlpPolicy, env)`` builds the ``"MlpPolicy"`` networks (likewise ``CnnPolicy`` and ``MultiInputPolicy``),
and ``MlpPolicy.load(path)`` reads a file written by ``model.policy.save(path)`` (any of the three classes
reads any PPO policy; the file says which networks to build). sb3-contrib's ``MlpLstmPolicy``,
``CnnLstmPolicy`` and ``MultiInputLstmPolicy`` name PPO's networks with recurrent memory the same way.
"""

from covey.networks.policies import ActorCriticPolicy

MlpPolicy = ActorCriticPolicy


class CnnPolicy(ActorCriticPolicy):
    """``PPO(CnnPolicy, env)`` builds the ``"CnnPolicy"`` networks; ``load`` is :meth:`ActorCriticPolicy.load`."""


class MultiInputPolicy(ActorCriticPolicy):
    """``PPO(MultiInputPolicy, env)`` builds the ``"MultiInputPolicy"`` networks; ``load`` is
    :meth:`ActorCriticPolicy.load`."""


class MlpLstmPolicy(ActorCriticPolicy):
    """sb3-contrib's name (``sb3_contrib.ppo_recurrent``): ``PPO(MlpLstmPolicy, env)`` builds the
    ``"MlpLstmPolicy"`` networks, with recurrent memory; ``load`` is :meth:`ActorCriticPolicy.load`."""


class CnnLstmPolicy(ActorCriticPolicy):
    """sb3-contrib's name: ``PPO(CnnLstmPolicy, env)`` builds the ``"CnnLstmPolicy"`` networks."""


class MultiInputLstmPolicy(ActorCriticPolicy):
    """sb3-contrib's name: ``PPO(MultiInputLstmPolicy, env)`` builds the ``"MultiInputLstmPolicy"`` networks."""


__all__ = [
    "ActorCriticPolicy",
    "MlpPolicy",
    "CnnPolicy",
    "MultiInputPolicy",
    "MlpLstmPolicy",
    "CnnLstmPolicy",
    "MultiInputLstmPolicy",
]
