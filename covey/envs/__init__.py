"""Small environments shipped with covey for tests, examples and demonstrations."""

from covey.envs.early_exit import EarlyExitEnv
from covey.envs.memory import GroupCueEnv, RememberCueEnv

__all__ = ["EarlyExitEnv", "GroupCueEnv", "RememberCueEnv"]
