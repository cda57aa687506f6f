"""POCA and the SuperSuit baseline with their env copies stepped in one process and in several.

    python -m benchmarks.poca_processes                                  # 100k env steps x 2 seeds, 2 processes
    python -m benchmarks.poca_processes --timesteps 2048 --seeds 1       # smoke run

The settings of ``benchmarks.poca_vs_supersuit`` (simple_spread N=3, 8 copies). Four learners per seed, in an
order that alternates with the seed:

- covey's POCA on its in-process group env, and on ``SubprocGroupVecEnv(..., n_processes=P)``: this process
  steps the first block of copies while P - 1 worker processes step the others;
- SB3's PPO on SuperSuit's ``concat_vec_envs_v1(..., num_cpus=0)`` (in this process) and ``num_cpus=P`` (P worker
  processes, this one waiting for them).

Only ``learn`` is timed (the worker processes start before it, in the env's constructor). covey's two runs train
on the same env steps and random draws, so their returns must agree exactly; the table says whether they did.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence

import torch

from benchmarks.common import median_range
from benchmarks.poca_vs_supersuit import N_AGENTS, N_COPIES, run_poca, run_supersuit_ppo


def learners(processes: int) -> dict[str, Callable[[int, int], tuple[float, float, int]]]:
    """Name -> ``(timesteps, seed)`` -> (seconds of ``learn``, per-agent return, env steps)."""
    return {
        "covey POCA, 1 process": lambda t, s: run_poca(t, s),
        f"covey POCA, {processes} processes": lambda t, s: run_poca(t, s, n_processes=processes),
        "SB3 PPO + SuperSuit, num_cpus=0": lambda t, s: run_supersuit_ppo(t, s),
        f"SB3 PPO + SuperSuit, num_cpus={processes}": lambda t, s: run_supersuit_ppo(t, s, num_cpus=processes),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.poca_processes", description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=2, help="processes that step the copies (2 or more)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    args = parser.parse_args(argv)
    if not 2 <= args.processes <= N_COPIES:
        parser.error(f"--processes must be from 2 to {N_COPIES} (the env copies)")
    torch.set_num_threads(args.threads)
    runs = learners(args.processes)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    names = list(runs)
    for seed in range(args.seeds):
        for name in names if seed % 2 == 0 else names[::-1]:
            seconds, agent_return, steps = runs[name](args.timesteps, seed)
            results[name].append((steps / seconds, agent_return))
            print(f"  seed {seed} {name}: {seconds:.1f} s, per-agent return {agent_return:.3f}", file=sys.stderr)

    command = shlex.join(sys.argv[1:] if argv is None else list(argv))
    print(f"- command: `python -m benchmarks.poca_processes {command}`")
    print(
        f"- mpe2 simple_spread N={N_AGENTS}, {N_COPIES} env copies, {args.timesteps:,} env steps per run, "
        f"{args.seeds} seeds, {args.threads} torch thread(s) in the training process"
    )
    print()
    print("| learner | env steps/s (median [min, max]) | per-agent return (median [min, max]) |")
    print("|---|---:|---:|")
    for name, rows in results.items():
        speeds, returns = [s for s, _ in rows], [r for _, r in rows]
        print(f"| {name} | {median_range(speeds, ',.0f')} | {median_range(returns, '.2f')} |")
    covey_one, covey_many, sb3_one, sb3_many = (results[name] for name in names)

    def median_ratio(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
        return statistics.median(x[0] / y[0] for x, y in zip(a, b))  # per seed

    print()
    speedup = median_ratio(covey_many, covey_one)
    print(f"- covey, {args.processes} processes against 1 (env steps/s, median per seed): {speedup:.2f}x")
    print(f"- SB3, num_cpus={args.processes} against 0: {median_ratio(sb3_many, sb3_one):.2f}x")
    print(f"- covey against SB3, both in one process: {median_ratio(covey_one, sb3_one):.2f}x")
    print(f"- covey against SB3, both in {args.processes} processes: {median_ratio(covey_many, sb3_many):.2f}x")
    same = all(a[1] == b[1] for a, b in zip(covey_one, covey_many))
    print(
        f"- covey's returns in 1 and {args.processes} processes, seed by seed: {'identical' if same else 'DIFFERENT'}"
    )


if __name__ == "__main__":
    main()
