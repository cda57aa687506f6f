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
    if name in _submodules():  # covey.agents.load(...) after a plain `import covey`, as covey's docs write it
        import importlib

        return importlib.import_module(f"covey.{name}")
    if name in _ELSEWHERE:
        raise ImportError(
            f"covey has no {name}: it trains PPO (recurrent too), SAC and POCA. {_ELSEWHERE[name]}", name=name
        )
    raise AttributeError(f"module 'covey' has no attribute {name!r}")


_SUBMODULES: set[str] = set()


def _submodules() -> set[str]:
    """The names of covey's public modules and packages (``agents``, ``export``, ...; not ``__main__``, which runs
    the command line)."""
    if not _SUBMODULES:
        import pkgutil

        _SUBMODULES.update(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return _SUBMODULES


# Stable-Baselines3's and sb3-contrib's other algorithms: where to import them from.
_ELSEWHERE = {
    **{name: f"Use `from stable_baselines3 import {name}`." for name in ("A2C", "DDPG", "DQN", "TD3")},
    **{
        name: f"Use `from sb3_contrib import {name}`."
        for name in ("ARS", "CrossQ", "MaskablePPO", "QRDQN", "TQC", "TRPO")
    },
    "RecurrentPPO": "sb3-contrib's RecurrentPPO is covey's PPO with its policy names: PPO('MlpLstmPolicy', ...) "
    "(or 'CnnLstmPolicy', 'MultiInputLstmPolicy'); PPO.load reads RecurrentPPO's files.",
}
