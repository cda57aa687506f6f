"""MA-POCA's and the SuperSuit baseline's returns against wall-clock training time, side by side in one process.

    python -m benchmarks.poca_curve                      # 100k env steps x 3 seeds, a point every 8192 env steps
    python -m benchmarks.poca_curve --timesteps 4096 --every 2048 --seeds 1 --eval-episodes 5   # smoke run

The runs of ``benchmarks.poca_vs_supersuit`` (simple_spread N=3, 8 copies, the same settings and seeds),
with the policy evaluated along the way: at the start of the first rollout past every ``--every`` env steps,
that is after the updates on every earlier rollout, and once more after ``learn``. Each point is (env steps,
seconds of training so far, mean per-agent return of the deterministic policy over ``--eval-episodes``
episodes, on the evaluation seeds of ``benchmarks.poca_vs_supersuit``). The evaluations' own time is left out
of the seconds, and they draw no random numbers from the training's generators, so the last point is the
run that ``benchmarks.poca_vs_supersuit`` measures.

Both learners count env steps alike (one parallel step of one copy); their rollouts are the same size, so the
points fall on the same env steps. Below the table: how long covey took to reach the baseline's final return.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
from stable_baselines3.common.callbacks import BaseCallback

from benchmarks.common import code_version, cpu_description, median_range
from benchmarks.poca_vs_supersuit import (
    EVAL_SEED_OFFSET,
    N_AGENTS,
    N_COPIES,
    _SharedPolicy,
    make_env,
    run_poca,
    run_supersuit_ppo,
)
from covey.evaluation import evaluate_group

Point = tuple[int, float, float]
"""(env steps, training seconds, per-agent return)"""

LEARNERS: dict[str, tuple[Callable, Callable, int]] = {
    # name: (run function, the model as evaluate_group's policy, the model's timesteps per env step)
    "covey POCA": (run_poca, lambda model: model, 1),
    "SB3 PPO + SuperSuit": (run_supersuit_ppo, _SharedPolicy, N_AGENTS),
}


class LearningCurve(BaseCallback):
    """Evaluates the model being trained every ``every`` env steps and keeps the points.

    A point is taken at the start of the first rollout at or past each multiple of ``every`` env steps (the
    model's timesteps over ``per_env_step``). ``start`` is when training began (set by
    :func:`benchmarks.poca_vs_supersuit.timed_learn`); ``eval_seconds`` is the time spent evaluating, which
    a point's seconds leave out."""

    def __init__(self, every: int, policy_of: Callable, per_env_step: int, episodes: int, seed: int) -> None:
        super().__init__()
        self.every, self.policy_of, self.per_env_step = every, policy_of, per_env_step
        self.episodes, self.seed = episodes, seed
        self.points: list[Point] = []
        self.start = time.perf_counter()
        self.eval_seconds = 0.0
        self._next = every

    def _on_rollout_start(self) -> None:
        steps = self.model.num_timesteps // self.per_env_step
        if steps >= self._next:
            self.evaluate(steps)
            self._next += self.every * ((steps - self._next) // self.every + 1)

    def _on_step(self) -> bool:
        return True

    def evaluate(self, steps: int) -> None:
        now = time.perf_counter()
        seconds = now - self.start - self.eval_seconds
        policy = self.policy_of(self.model)
        agent_return = evaluate_group(policy, make_env, n_eval_episodes=self.episodes, seed=self.seed)["agent_return"]
        self.points.append((steps, seconds, float(agent_return)))
        self.eval_seconds += time.perf_counter() - now


def learning_curve(name: str, timesteps: int, seed: int, every: int, episodes: int) -> list[Point]:
    """One learner's run: its points along the way and the final one (the run's own evaluation)."""
    run, policy_of, per_env_step = LEARNERS[name]
    curve = LearningCurve(every, policy_of, per_env_step, episodes, EVAL_SEED_OFFSET + seed)
    seconds, agent_return, steps = run(timesteps, seed, episodes, callback=curve)
    return [*curve.points, (steps, seconds, agent_return)]


def first_reach(points: Sequence[Point], target: float) -> Point | None:
    """The first point whose return is at least ``target`` (None if none is)."""
    return next((point for point in points if point[2] >= target), None)


def median_curve(runs: Sequence[Sequence[Point]]) -> list[Point]:
    """Point by point over the runs (which share their env steps): the median seconds and median return, up
    to the shortest run."""
    return [
        (runs[0][i][0], statistics.median(r[i][1] for r in runs), statistics.median(r[i][2] for r in runs))
        for i in range(min(len(r) for r in runs))
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.poca_curve", description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--every", type=int, default=8192, help="env steps between evaluations")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-episodes", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    curves: dict[str, list[list[Point]]] = {name: [] for name in LEARNERS}
    for seed in range(args.seeds):
        names = list(LEARNERS)
        for name in names if seed % 2 == 0 else names[::-1]:
            points = learning_curve(name, args.timesteps, seed, args.every, args.eval_episodes)
            curves[name].append(points)
            last = points[-1]
            print(f"  seed {seed} {name}: {last[1]:.1f} s, per-agent return {last[2]:.2f}", file=sys.stderr)

    print(f"- command: `python -m benchmarks.poca_curve {shlex.join(sys.argv[1:] if argv is None else argv)}`")
    threads = f"{args.threads} torch thread" + ("s" if args.threads != 1 else "")
    print(
        f"- simple_spread N={N_AGENTS}, {N_COPIES} copies, {args.timesteps} env steps per run, {args.seeds} seeds, "
        f"{args.eval_episodes} evaluation episodes per point, {threads}"
    )
    print(f"- CPU: {cpu_description()}")
    print(f"- code: {code_version()}")
    print()
    names = list(LEARNERS)
    header = " | ".join(f"{name} s (median) | {name} return (median [min, max])" for name in names)
    print(f"| env steps | {header} |")
    print("|---:|" + "---:|" * (2 * len(names)))
    # Every run's points fall on the same env steps (rollouts of the same size).
    medians = {name: median_curve(runs) for name, runs in curves.items()}
    for i in range(min(len(curve) for curve in medians.values())):
        cells = []
        for name in names:
            returns = [points[i][2] for points in curves[name]]
            cells.append(f"{medians[name][i][1]:.1f} | {median_range(returns, '.2f')}")
        print(f"| {medians[names[0]][i][0]:,} | {' | '.join(cells)} |")

    baseline, ours = names[1], names[0]
    _, baseline_seconds, target = median_curve(curves[baseline])[-1]
    print()
    random_returns = [
        evaluate_group(None, make_env, n_eval_episodes=args.eval_episodes, seed=EVAL_SEED_OFFSET + seed)["agent_return"]
        for seed in range(args.seeds)
    ]
    print(f"Uniformly random actions, on the same evaluation episodes: {median_range(random_returns, '.2f')}.")
    print(f"{baseline}'s final return (median over seeds): {target:.2f}, after {baseline_seconds:.1f} s of training.")
    reached = first_reach(median_curve(curves[ours]), target)
    per_seed = "; ".join(
        f"seed {seed}: " + ("not reached" if point is None else f"{point[0]:,} env steps, {point[1]:.1f} s")
        for seed, point in enumerate(first_reach(points, target) for points in curves[ours])
    )
    if reached is None:
        print(f"{ours}'s median return did not reach it. Each seed's first point at or above it: {per_seed}.")
    else:
        steps, seconds, _ = reached
        print(
            f"{ours}'s median return first reached it at {steps:,} env steps, after {seconds:.1f} s (median "
            f"seconds there): {seconds / baseline_seconds:.2f}x {baseline}'s time. Each seed's first point at "
            f"or above it: {per_seed}."
        )


if __name__ == "__main__":
    main()
