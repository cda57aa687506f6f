"""``stable_baselines3.sac``'s names: ``from covey.sac import SAC, MlpPolicy``."""

from covey.agents.sac import SAC
from covey.sac.policies import CnnPolicy, MlpPolicy, MultiInputPolicy

__all__ = ["SAC", "MlpPolicy", "CnnPolicy", "MultiInputPolicy"]
