"""Small environments shipped with covey for tests, examples and demonstrations."""

from covey.envs.early_exit import EarlyExitEnv

__all__ = ["EarlyExitEnv"]
