"""Train PPO on LunarLander-v3 (discrete actions by default, --continuous for Box actions).

    python examples/ppo_lunarlander.py                      # 1M steps (RL-Zoo settings), 2-3 min on 2 cores
    python examples/ppo_lunarlander.py --timesteps 5000     # smoke run

Needs Box2D: ``pip install swig box2d`` (included in covey's ``[examples]`` extra).
A return of 200 counts as solved; the default run (seed 0) reached 276 on one CPU and 245 on another (their
matrix kernels round differently, so the runs differ).
"""

import argparse
import time

import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from covey import PPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--continuous", action="store_true", help="Box actions instead of 4 discrete ones")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", default="ppo_lunarlander.zip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    # render_mode=None: SB3's make_vec_env makes "rgb_array" envs, under which LunarLander simulates its
    # engines' particles, which pile up in episodes that are never rendered and slow every step down.
    env_kwargs = dict(continuous=args.continuous, render_mode=None)
    env = make_vec_env("LunarLander-v3", n_envs=16, seed=args.seed, env_kwargs=env_kwargs)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=1024,
        batch_size=64,
        n_epochs=4,
        gamma=0.999,
        gae_lambda=0.98,
        ent_coef=0.01,
        seed=args.seed,
        device="cpu",  # an MLP's PPO trains faster on the CPU than on a GPU (README, "Devices")
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, progress_bar=True)
    elapsed = time.perf_counter() - start

    eval_env = make_vec_env("LunarLander-v3", n_envs=1, seed=args.seed + 1000, env_kwargs=env_kwargs)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    model.save(args.save)
    kind = "continuous" if args.continuous else "discrete"
    speed = model.num_timesteps / elapsed
    print(f"PPO LunarLander-v3 ({kind}): {model.num_timesteps} steps in {elapsed:.1f} s ({speed:.0f} steps/s)")
    print(f"evaluation over 10 episodes: {mean:.1f} +/- {std:.1f} (200 = solved)")


if __name__ == "__main__":
    main()
