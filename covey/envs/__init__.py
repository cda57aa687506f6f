"""Small environments shipped with covey for tests, examples and demonstrations."""

from covey.envs.early_exit import EarlyExitEnv
from covey.envs.memory import RememberCueEnv

__all__ = ["EarlyExitEnv", "RememberCueEnv"]
