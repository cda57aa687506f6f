"""Train PPO on CartPole-v1 with the RL-Zoo settings, evaluate it, save it.

    python examples/ppo_cartpole.py                 # 100k steps, about 15 s on 2 cores
    python examples/ppo_cartpole.py --timesteps 2000

The script is what an SB3 user writes, with ``from covey import PPO`` as the only change.
"""

import argparse
import time

import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from covey import PPO


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small MLPs)")
    parser.add_argument("--save", default="ppo_cartpole.zip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    env = make_vec_env("CartPole-v1", n_envs=8, seed=args.seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=lambda progress: 1e-3 * progress,
        clip_range=lambda progress: 0.2 * progress,
        verbose=0,
        seed=args.seed,
        device="cpu",  # an MLP's PPO trains faster on the CPU than on a GPU (README, "Devices")
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, progress_bar=True)
    elapsed = time.perf_counter() - start

    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=20, deterministic=True)
    model.save(args.save)
    print(
        f"PPO CartPole-v1: {model.num_timesteps} steps in {elapsed:.1f} s ({model.num_timesteps / elapsed:.0f} steps/s)"
    )
    print(f"evaluation over 20 episodes: {mean:.1f} +/- {std:.1f} (the maximum is 500)")
    print(f"saved to {args.save}; reload with PPO.load({args.save!r})")


if __name__ == "__main__":
    main()
