"""``stable_baselines3.sac.policies``' names for SAC's policy.

``SAC(MlpPolicy, env)`` builds the ``"MlpPolicy"`` networks (likewise ``CnnPolicy`` and ``MultiInputPolicy``),
and ``MlpPolicy.load(path)`` reads a file written by ``model.policy.save(path)`` (any of the three classes
reads any SAC policy; the file says which networks to build).
"""

from covey.networks.policies import SACPolicy

MlpPolicy = SACPolicy


class CnnPolicy(SACPolicy):
    """``SAC(CnnPolicy, env)`` builds the ``"CnnPolicy"`` networks; ``load`` is :meth:`SACPolicy.load`."""


class MultiInputPolicy(SACPolicy):
    """``SAC(MultiInputPolicy, env)`` builds the ``"MultiInputPolicy"`` networks; ``load`` is :meth:`SACPolicy.load`."""


__all__ = ["SACPolicy", "MlpPolicy", "CnnPolicy", "MultiInputPolicy"]
