"""Environment adapters: everything a user passes becomes an SB3 VecEnv."""

from covey.wrappers.one_side import OneSideEnv, one_side
from covey.wrappers.vec_env import FastVecEnv, GymnasiumVecEnv, as_vec_env

__all__ = ["FastVecEnv", "GymnasiumVecEnv", "OneSideEnv", "as_vec_env", "one_side"]
