"""PPO's final returns over many seeds, with hand-written gradients and with autograd.

    python -m benchmarks.ppo_seeds                       # CartPole, 8 envs, quick-suite settings, seeds 0-19
    python -m benchmarks.ppo_seeds --first 20 --seeds 60

The two update paths compute the same gradients to float rounding (tests/test_fast_paths.py), but an RL run
amplifies rounding differences, so single seeds land differently. This compares the two as distributions:
the benchmark task's settings and budget, its evaluation (10 deterministic episodes on an env seeded
10000 + seed), many seeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import torch
from stable_baselines3.common.evaluation import evaluate_policy

from benchmarks.compare import EVAL_SEED_OFFSET, N_EVAL_EPISODES, TASKS_BY_NAME, make_env
from covey import PPO


def final_return(task_name: str, manual: bool, seed: int) -> float:
    task = TASKS_BY_NAME[task_name]
    previous = PPO.manual_gradients
    PPO.manual_gradients = manual
    try:
        env = make_env(task, task.n_envs, seed)
        model = PPO("MlpPolicy", env, seed=seed, **task.kwargs("quick"))
    finally:
        PPO.manual_gradients = previous
    model.learn(task.timesteps("quick", 1.0))
    eval_env = make_env(task, 1, EVAL_SEED_OFFSET + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=N_EVAL_EPISODES, deterministic=True)
    return float(mean)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ppo_seeds", description=__doc__.splitlines()[0])
    ppo_tasks = [name for name in TASKS_BY_NAME if name.startswith("ppo")]
    parser.add_argument("--task", default="ppo_cartpole_8env", choices=ppo_tasks)
    parser.add_argument("--first", type=int, default=0, help="first seed")
    parser.add_argument("--seeds", type=int, default=20, help="number of seeds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = range(args.first, args.first + args.seeds)
    print(f"{args.task}, quick-suite budget, seeds {seeds.start}-{seeds.stop - 1}\n")
    print("| update | median return | mean return | seeds at the maximum | lowest returns |")
    print("|---|---:|---:|---:|---|")
    for manual in (True, False):
        returns = [final_return(args.task, manual, seed) for seed in seeds]
        best = max(returns)
        lowest = ", ".join(f"{r:.1f} (seed {s})" for r, s in sorted(zip(returns, seeds))[:3])
        name = "hand-written gradients" if manual else "autograd"
        at_best = sum(r == best for r in returns)
        print(
            f"| {name} | {statistics.median(returns):.1f} | {statistics.mean(returns):.1f} | "
            f"{at_best}/{len(returns)} | {lowest} |",
            flush=True,
        )
    print(f"\ncommand: python -m benchmarks.ppo_seeds {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
