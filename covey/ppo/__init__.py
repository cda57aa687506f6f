"""``stable_baselines3.ppo``'s names: ``from covey.ppo import PPO, MlpPolicy``."""

from covey.agents.ppo import PPO
from covey.ppo.policies import (
    CnnLstmPolicy,
    CnnPolicy,
    MlpLstmPolicy,
    MlpPolicy,
    MultiInputLstmPolicy,
    MultiInputPolicy,
)

__all__ = [
    "PPO",
    "MlpPolicy",
    "CnnPolicy",
    "MultiInputPolicy",
    "MlpLstmPolicy",
    "CnnLstmPolicy",
    "MultiInputLstmPolicy",
]
