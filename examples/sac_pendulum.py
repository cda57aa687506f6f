"""Train SAC on Pendulum-v1 (RL-Zoo settings), evaluate it, save it.

    python examples/sac_pendulum.py                  # 20k steps, a few minutes on 2 cores
    python examples/sac_pendulum.py --timesteps 500  # smoke run

The script is what an SB3 user writes, with ``from covey import SAC`` as the only change.
"""

import argparse
import time

import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from covey import SAC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--save", default="sac_pendulum.zip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed)
    model = SAC("MlpPolicy", env, learning_rate=1e-3, learning_starts=min(100, args.timesteps // 2), seed=args.seed)
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, progress_bar=True)
    elapsed = time.perf_counter() - start

    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=args.seed + 1000)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    model.save(args.save)
    print(
        f"SAC Pendulum-v1: {model.num_timesteps} steps in {elapsed:.1f} s ({model.num_timesteps / elapsed:.0f} steps/s)"
    )
    print(f"evaluation over 10 episodes: {mean:.1f} +/- {std:.1f} (around -150 is good; random is about -1200)")


if __name__ == "__main__":
    main()
