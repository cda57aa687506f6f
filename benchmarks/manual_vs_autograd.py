"""covey's hand-written gradient steps against its autograd ones, in whole training runs side by side.

    python -m benchmarks.manual_vs_autograd                                  # both tasks, 2 seeds, ~10 min
    python -m benchmarks.manual_vs_autograd --tasks ppo_pendulum_sde --seeds 3
    python -m benchmarks.manual_vs_autograd --scale 0.05 --seeds 1           # smoke run

Each task is a task of :mod:`benchmarks.compare` (same env, settings and seeds), trained by covey twice per
seed: with the hand-written gradients (``PPO.manual_gradients`` / ``SAC.manual_gradients``, the default) and
with autograd, alternating which goes first. Only ``learn`` is timed. The per-step ablations of
``python -m benchmarks.fast_paths`` time one update in isolation; this is what a whole run gains, acting, env
and bookkeeping included.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from benchmarks.common import cpu_description, median_range
from benchmarks.compare import FRAMEWORKS, TASKS_BY_NAME, make_env, measure_return

DEFAULT_TASKS = ("ppo_pendulum_sde", "sac_pendulum_sde")
BUDGETS = {"ppo_pendulum_sde": 100_000, "sac_pendulum_sde": 10_000}
"""Timesteps per run at ``--scale 1`` (SAC's the half of the full suite's, to keep its four runs per seed short)."""


def run(task_name: str, manual: bool, timesteps: int, seed: int) -> tuple[float, float]:
    """Seconds of ``learn`` and the mean deterministic return (as :mod:`benchmarks.compare` evaluates)."""
    task = TASKS_BY_NAME[task_name]
    cls = FRAMEWORKS["covey"][task.agent]
    previous = cls.manual_gradients
    cls.manual_gradients = manual
    try:
        model = cls("MlpPolicy", make_env(task, task.n_envs, seed), seed=seed, **task.kwargs("full", "covey"))
    finally:
        cls.manual_gradients = previous
    if (model._manual is not None) != manual:
        raise RuntimeError(f"{task_name}: the hand-written gradients do not apply to this task's networks.")
    start = time.perf_counter()
    model.learn(timesteps)
    seconds = time.perf_counter() - start
    model.get_env().close()
    return seconds, measure_return(model, task, seed)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.manual_vs_autograd", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help=f"comma-separated, of {', '.join(BUDGETS)}")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every budget")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in BUDGETS]
    if unknown or not names:
        parser.error(f"unknown tasks {unknown}; choose from {', '.join(BUDGETS)}")
    if args.seeds < 1 or args.scale <= 0 or args.threads < 1:
        parser.error("--seeds and --threads must be >= 1 and --scale > 0")
    torch.set_num_threads(args.threads)
    lines = [
        "| task | timesteps | hand-written s (median) | autograd s (median) | time ratio (median [min, max]) "
        "| hand-written return (median [min, max]) | autograd return (median [min, max]) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        timesteps = max(round(BUDGETS[name] * args.scale), TASKS_BY_NAME[name].min_timesteps("full"))
        results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for seed in range(args.seeds):
            for manual in (True, False) if seed % 2 == 0 else (False, True):
                seconds, ret = run(name, manual, timesteps, seed)
                results[manual].append((seconds, ret))
                what = "hand-written" if manual else "autograd"
                print(f"[{name}] seed {seed} {what:>12}: {seconds:7.1f} s, return {ret:8.1f}", file=sys.stderr)
        ratios = [m[0] / a[0] for m, a in zip(results[True], results[False])]
        lines.append(
            f"| {name} | {timesteps:,} | {statistics.median(s for s, _ in results[True]):.1f} "
            f"| {statistics.median(s for s, _ in results[False]):.1f} | {median_range(ratios, '.2f')} "
            f"| {median_range([r for _, r in results[True]], '.1f')} "
            f"| {median_range([r for _, r in results[False]], '.1f')} |"
        )
    print("\n".join(lines))
    words = ["python -m benchmarks.manual_vs_autograd", *(argv if argv is not None else sys.argv[1:])]
    print(f"\ncommand: {' '.join(words)}")
    print(f"seeds: {args.seeds}, torch threads: {args.threads}; CPU: {cpu_description()}")


if __name__ == "__main__":
    main()
