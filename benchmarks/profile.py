"""Where covey's training time goes, per benchmark task: env stepping, acting, buffer work, the batched
post-rollout evaluation (PPO, POCA), the update, and logging (POCA: covey's side of ``poca_simple_spread``).

    python -m benchmarks.profile                          # the quick-suite tasks, 1 seed
    python -m benchmarks.profile --tasks sac_pendulum --scale 0.2

Each phase is timed by wrapping the method that does it with a wall-clock accumulator (a few hundred ns
per call); "other" is the rest of ``learn`` (the loop itself, callbacks, bookkeeping).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnv

from benchmarks import poca_vs_supersuit
from benchmarks.common import code_version, cpu_description
from benchmarks.compare import FRAMEWORKS, TASKS_BY_NAME, Task, make_env
from covey.agents.poca import POCA
from covey.agents.ppo import PPO, ManualPPOUpdate, NumpyActing
from covey.agents.sac import SAC
from covey.buffers.group import GroupRolloutBuffer
from covey.buffers.replay import ReplayBuffer
from covey.buffers.rollout import RolloutBuffer
from covey.networks.actor_critic import Actor
from covey.wrappers.group_env import GroupVecEnv

# (phase, class, method): every call of the method counts toward the phase.
PHASES: list[tuple[str, type, str]] = [
    ("env step", VecEnv, "step"),
    ("env step", GroupVecEnv, "step"),
    ("acting", Actor, "act"),
    ("acting", ManualPPOUpdate, "act"),
    ("acting", NumpyActing, "act"),
    ("buffer", RolloutBuffer, "add"),
    ("buffer", RolloutBuffer, "compute_returns"),
    ("buffer", GroupRolloutBuffer, "add"),
    ("buffer", GroupRolloutBuffer, "compute_returns"),
    ("buffer", ReplayBuffer, "add"),
    ("buffer", ReplayBuffer, "sample"),
    ("rollout evaluation", PPO, "_evaluate_rollout"),
    ("rollout evaluation", POCA, "_evaluate_rollout"),
    ("update", PPO, "train"),
    ("update", POCA, "train"),
    ("update", SAC, "_gradient_step"),
    ("update", SAC, "train"),
    ("logging", Logger, "dump"),
]


@contextmanager
def timed_phases(totals: dict[str, float]):
    """Wrap every method of PHASES so that its wall time adds to ``totals[phase]`` (outermost call only)."""
    originals = []
    depth: dict[str, int] = defaultdict(int)

    def wrap(phase: str, method: Callable) -> Callable:
        def timed(*args, **kwargs):
            depth[phase] += 1
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                depth[phase] -= 1
                if depth[phase] == 0:  # nested calls of one phase (SAC.train -> _gradient_step) count once
                    totals[phase] += time.perf_counter() - start

        return timed

    for phase, cls, name in PHASES:
        original = cls.__dict__[name]
        originals.append((cls, name, original))
        setattr(cls, name, wrap(phase, original))
    try:
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def profile_task(task: Task, timesteps: int, seed: int = 0) -> tuple[float, dict[str, float]]:
    if task.runner is not None:  # the multi-agent task: covey's side of benchmarks.poca_vs_supersuit
        model = poca_vs_supersuit.make_poca(seed)
    else:
        agent_class = FRAMEWORKS["covey"][task.agent]
        env = make_env(task, task.n_envs, seed)
        model = agent_class("MlpPolicy", env, seed=seed, verbose=0, **task.kwargs("quick", "covey"))
    totals: dict[str, float] = defaultdict(float)
    with timed_phases(totals):
        start = time.perf_counter()
        model.learn(timesteps)
        total = time.perf_counter() - start
    return total, dict(totals)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS_BY_NAME))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the quick-suite budgets")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    phases = list(dict.fromkeys(phase for phase, _, _ in PHASES))
    print("| task | steps | total s | " + " | ".join(phases) + " | other |")
    print("|---|---:|---:|" + "---:|" * (len(phases) + 1))
    for name in args.tasks.split(","):
        task = TASKS_BY_NAME[name]
        steps = task.timesteps("quick", args.scale)
        total, totals = profile_task(task, steps)
        shares = [100 * totals.get(phase, 0.0) / total for phase in phases]
        other = 100 - sum(shares)
        cells = " | ".join(f"{share:.0f}%" for share in shares)
        print(f"| {name} | {steps} | {total:.1f} | {cells} | {other:.0f}% |", flush=True)
    print(f"\ncommand: python -m benchmarks.profile {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"CPU: {cpu_description()}")
    print(f"code: {code_version()}")


if __name__ == "__main__":
    main()
