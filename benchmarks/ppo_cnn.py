"""PPO with ``CnnPolicy`` against SB3, side by side in one process: the speed of the image path.

    python -m benchmarks.ppo_cnn                             # 8192 steps, 3 repeats, about 2 min
    python -m benchmarks.ppo_cnn --timesteps 1024 --repeats 1   # smoke run

The env draws random 64x64 RGB frames (the env itself costs next to nothing; its returns mean nothing),
4 copies in SB3's ``make_vec_env``; both learners get SB3's ``NatureCNN`` defaults with one shared encoder,
n_steps=128, batch_size=256, 4 epochs. A third row is covey evaluating the rollout in one batched pass
after it (its choice for weight-free encoders) instead of with each action. Each learner first trains one
rollout untimed (the first convolutions of a process set up their kernels); then learners alternate order
per repeat, and only ``learn`` is timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env

import covey

N_ENVS = 4
SETTINGS = dict(n_steps=128, batch_size=256, n_epochs=4)


class RandomFrames(gym.Env):
    """64x64 RGB frames of uniform noise, 4 actions, episodes of 100 steps."""

    observation_space = spaces.Box(0, 255, (64, 64, 3), np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        return self._frame(), float(action == 0), False, self._t >= 100, {}

    def _frame(self) -> np.ndarray:
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)


def train_seconds(learner: str, timesteps: int, seed: int) -> float:
    """Seconds of ``learn`` for one learner: "covey", "covey, batched evaluation" or "SB3"."""
    env = make_vec_env(RandomFrames, N_ENVS, seed=seed)
    library = stable_baselines3 if learner == "SB3" else covey
    model = library.PPO("CnnPolicy", env, seed=seed, **SETTINGS)
    if learner == "covey, batched evaluation":
        model._evaluate_while_acting = False
    start = time.perf_counter()
    model.learn(timesteps)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ppo_cnn", description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    learners = ["covey", "SB3", "covey, batched evaluation"]
    for name in learners:  # warm-up, untimed: the first convolutions of a process set up their kernels
        train_seconds(name, SETTINGS["n_steps"] * N_ENVS, seed=0)
    seconds: dict[str, list[float]] = {name: [] for name in learners}
    for repeat in range(args.repeats):
        for name in learners if repeat % 2 == 0 else learners[::-1]:
            seconds[name].append(train_seconds(name, args.timesteps, seed=repeat))
            print(f"  repeat {repeat} {name}: {seconds[name][-1]:.2f} s", file=sys.stderr)
    threads = f"{args.threads} torch thread" + ("s" if args.threads != 1 else "")
    setting = f"{N_ENVS} envs, {args.timesteps} steps, {args.repeats} repeats, {threads}"
    print(f"PPO CnnPolicy, 64x64x3 random frames, {setting}")
    print()
    print("| learner | seconds (median) | steps/s | time / SB3's (median [min, max] per repeat) |")
    print("|---|---:|---:|---:|")
    for name in learners:
        ratios = [s / b for s, b in zip(seconds[name], seconds["SB3"])]
        median = statistics.median(seconds[name])
        spread = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        print(f"| {name} | {median:.2f} | {args.timesteps / median:,.0f} | {spread} |")
    print(f"\ncommand: python -m benchmarks.ppo_cnn {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
