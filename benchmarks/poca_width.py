"""covey POCA's critic at several attention widths on simple_spread: training time and final return.

    python -m benchmarks.poca_width                        # widths 64 and 128, 100k env steps, 3 seeds
    python -m benchmarks.poca_width --widths 32,64,128 --timesteps 5000 --seeds 1   # smoke run

The settings of ``benchmarks.poca_vs_supersuit`` (simple_spread N=3, 8 copies); only ``attention_width``
changes. Widths alternate order per seed; only ``learn`` is timed. Returns are mean per-agent returns of
the deterministic policy over 50 episodes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from benchmarks.common import median_range
from benchmarks.poca_vs_supersuit import EVAL_SEED_OFFSET, make_env, make_poca
from covey.evaluation import evaluate_group

EVAL_EPISODES = 50


def run(width: int, timesteps: int, seed: int) -> tuple[float, float]:
    """Seconds of ``learn`` and the mean per-agent return."""
    model = make_poca(seed, attention_width=width)
    start = time.perf_counter()
    model.learn(timesteps)
    seconds = time.perf_counter() - start
    result = evaluate_group(model, make_env, n_eval_episodes=EVAL_EPISODES, seed=EVAL_SEED_OFFSET + seed)
    return seconds, result["agent_return"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.poca_width", description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128", help="comma-separated attention widths")
    parser.add_argument("--timesteps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    torch.set_num_threads(args.threads)
    results: dict[int, list[tuple[float, float]]] = {w: [] for w in widths}
    for seed in range(args.seeds):
        for width in widths if seed % 2 == 0 else widths[::-1]:
            seconds, agent_return = run(width, args.timesteps, seed)
            results[width].append((seconds, agent_return))
            print(f"seed {seed} width {width}: {seconds:.1f} s, return {agent_return:.2f}", file=sys.stderr)
    print(f"POCA simple_spread, {args.timesteps} env steps, {args.seeds} seeds, {args.threads} torch thread(s)\n")
    print("| attention width | seconds (median) | env steps/s | per-agent return (median [min, max]) | per seed |")
    print("|---:|---:|---:|---:|---|")
    for width, runs in results.items():
        seconds = statistics.median(s for s, _ in runs)
        returns = [r for _, r in runs]
        spread = median_range(returns, ".2f")
        per_seed = ", ".join(f"{r:.2f}" for r in returns)
        print(f"| {width} | {seconds:.1f} | {args.timesteps / seconds:,.0f} | {spread} | {per_seed} |")
    print(f"\ncommand: python -m benchmarks.poca_width {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
