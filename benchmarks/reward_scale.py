"""Reward scale against the critic's value head: scalar regression vs the two-hot symlog head.

    python -m benchmarks.reward_scale                    # 2 scales x 2 heads x 3 seeds, 100k steps: ~10 min
    python -m benchmarks.reward_scale --seeds 1 --timesteps 20000   # smoke run

PPO on CartPole-v1 (8 envs, RL-Zoo-like settings with gae_lambda=0.95), rewards multiplied by 1 and by
1000, no reward normalization. Prints the final deterministic evaluation return (unscaled, max 500) per
head and scale: a scale-free critic learns the same at both scales.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys

import gymnasium as gym
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from covey import PPO

HEADS = ("scalar", "twohot")
SCALES = (1.0, 1000.0)


def scaled_env(scale: float, seed: int):
    """8 CartPole copies whose rewards are multiplied by ``scale``."""
    return make_vec_env(
        "CartPole-v1",
        n_envs=8,
        seed=seed,
        wrapper_class=lambda env: gym.wrappers.TransformReward(env, lambda r: r * scale),
    )


def final_return(head: str, scale: float, seed: int, timesteps: int) -> float:
    model = PPO(
        "MlpPolicy",
        scaled_env(scale, seed),
        n_steps=32,
        batch_size=256,
        gae_lambda=0.95,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=lambda p: 1e-3 * p,
        clip_range=lambda p: 0.2 * p,
        policy_kwargs=dict(value_head=head),
        seed=seed,
    )
    model.learn(timesteps)
    mean, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=10_000 + seed), n_eval_episodes=20)
    return float(mean)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    rows = []
    for scale in SCALES:
        for head in HEADS:
            returns = [final_return(head, scale, seed, args.timesteps) for seed in range(args.seeds)]
            print(f"  {head} x{scale:g}: {returns}", file=sys.stderr, flush=True)
            rows.append((head, scale, returns))
    print(f"command: python -m benchmarks.reward_scale {shlex.join(argv if argv is not None else sys.argv[1:])}")
    print(f"PPO CartPole-v1, {args.timesteps} steps, {args.seeds} seeds, final return (max 500), no reward scaling")
    print()
    print("| value head | reward x1 | reward x1000 |")
    print("|---|---:|---:|")
    for head in HEADS:
        cells = []
        for scale in SCALES:
            returns = next(r for h, s, r in rows if h == head and s == scale)
            cells.append(f"{statistics.median(returns):.1f} [{min(returns):.0f}, {max(returns):.0f}]")
        print(f"| {head} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
