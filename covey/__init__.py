"""covey: PyTorch agents for Gymnasium and PettingZoo with the Stable-Baselines3 API.

>>> from covey import PPO
>>> model = PPO("MlpPolicy", "CartPole-v1", seed=0)  # doctest: +SKIP

Importing ``covey`` is cheap: the agents (and torch) load on first use.
"""

from covey.version import __version__

__all__ = ["PPO", "POCA", "SAC", "__version__"]


def __getattr__(name: str):
    if name == "PPO":
        from covey.agents.ppo import PPO

        return PPO
    if name == "POCA":
        from covey.agents.poca import POCA

        return POCA
    if name == "SAC":
        from covey.agents.sac import SAC

        return SAC
    raise AttributeError(f"module 'covey' has no attribute {name!r}")
