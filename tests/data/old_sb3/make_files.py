"""Writes this folder's model files with an older Stable-Baselines3, whose files covey's load must read.

Run it in a virtual environment of that SB3 (the files here came from SB3 2.2.1 with gymnasium 0.29.1, and from
SB3 1.8.0 with gym 0.21.0, both with NumPy 1.26.4 and torch 2.13.0 on Python 3.11):

    python make_files.py

Each model is tiny (one hidden layer of 4 units) and trained for a few hundred steps; beside each file, an
``.npz`` holds 16 observations and the deterministic actions SB3 took for them.
"""

import numpy as np
import stable_baselines3 as sb3
import torch

try:
    import gymnasium as gym

    GYMNASIUM = True
except ImportError:  # SB3 1.x ran on gym
    import gym

    GYMNASIUM = False

from stable_baselines3 import PPO, SAC
from stable_baselines3.common.utils import get_linear_fn

torch.set_num_threads(1)
SMALL = dict(net_arch=[4])


class DictEnv(gym.Env):
    """A Dict observation (which gymnasium before 1.0 and gym wrote as an OrderedDict) and two actions."""

    observation_space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (3,), np.float32), "flag": gym.spaces.Discrete(3)}
    )
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.rng, self.t = np.random.default_rng(0), 0

    def _obs(self):
        return {"pos": self.rng.uniform(-1, 1, 3).astype(np.float32), "flag": int(self.rng.integers(3))}

    def reset(self, seed=None, options=None):
        self.t = 0
        return (self._obs(), {}) if GYMNASIUM else self._obs()

    def step(self, action):
        self.t += 1
        if GYMNASIUM:
            return self._obs(), float(action == 1), False, self.t >= 20, {}
        return self._obs(), float(action == 1), self.t >= 20, {}


def save(name, model, env):
    prefix = f"sb3_{sb3.__version__}_{name}"
    model.learn(256)
    model.save(prefix + ".zip")
    space = env.observation_space
    space.seed(5)
    samples = [space.sample() for _ in range(16)]
    if isinstance(space, gym.spaces.Dict):
        obs = {key: np.stack([s[key] for s in samples]) for key in space.spaces}
        arrays = {f"obs_{key}": value for key, value in obs.items()}
    else:
        obs = np.stack(samples).astype(np.float32)
        arrays = {"obs": obs}
    actions, _ = model.predict(obs, deterministic=True)
    np.savez(prefix, actions=actions, **arrays)


if __name__ == "__main__":
    ppo = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu", policy_kwargs=SMALL)
    if GYMNASIUM:
        cartpole = gym.make("CartPole-v1")
        lr = get_linear_fn(1e-3, 1e-4, 0.5)
        save("ppo_cartpole", PPO("MlpPolicy", cartpole, clip_range=0.15, learning_rate=lr, **ppo), cartpole)
        dict_env = DictEnv()
        save("ppo_dict", PPO("MultiInputPolicy", dict_env, clip_range=0.25, **ppo), dict_env)
    else:
        pendulum = gym.make("Pendulum-v1")
        sac = dict(learning_starts=64, batch_size=32, buffer_size=1000, seed=0, device="cpu", policy_kwargs=SMALL)
        save("sac_pendulum", SAC("MlpPolicy", pendulum, **sac), pendulum)
