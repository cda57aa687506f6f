"""Each learner's update at 1 and at 2 torch threads, covey's and SB3's, side by side in one process: which
updates a second thread speeds up (README, "Threads").

    python -m benchmarks.threads                                  # under a minute on 2 cores
    python -m benchmarks.threads --repeats 1 --calls-scale 0.05   # smoke run, seconds

The updates are those of ``python -m benchmarks.compare``'s tasks, on data collected once: PPO on CartPole with
8 envs at RL-Zoo's settings (one update: 20 epochs of one minibatch of 256), SAC on Pendulum (one gradient step
on 256 samples), and MA-POCA on simple_spread against SB3's PPO with SuperSuit parameter sharing (one update: 4
epochs of 4 minibatches, 256 group-steps or 768 agent entries each). Each update runs at both thread counts in
alternating rounds (1 2, 2 1, 1 2, ...; the count is set once per round, and one untimed call follows each
switch); a row reports, per learner and thread count, the minimum over the rounds of the mean time per update.
The whole runs at a thread count are ``python -m benchmarks.compare --threads N``'s.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence

import torch
from stable_baselines3 import PPO as SB3PPO
from stable_baselines3 import SAC as SB3SAC

from benchmarks.common import code_version, cpu_description
from benchmarks.fast_paths import (
    PPO_SETTINGS,
    collected_poca,
    collected_ppo,
    duration,
    ppo_on,
    sac_model,
    sac_on_pendulum,
    with_rollout,
)
from benchmarks.poca_vs_supersuit import make_supersuit_ppo

THREADS = (1, 2)


def per_thread_count(
    fn: Callable[[], object], calls: int, repeats: int, threads: Sequence[int] = THREADS
) -> list[float]:
    """Microseconds per call of ``fn`` at each torch thread count in ``threads``, timed in alternating rounds
    (the order reversed every other round): the minimum over ``repeats`` rounds of the mean over ``calls`` calls.
    The thread count is set once per round, before one untimed call; the caller's count is restored at the end."""
    before = torch.get_num_threads()
    best = [float("inf")] * len(threads)
    order = list(range(len(threads)))
    try:
        for round_ in range(repeats):
            for i in order if round_ % 2 == 0 else order[::-1]:
                torch.set_num_threads(threads[i])
                fn()
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[i] = min(best[i], (time.perf_counter() - start) / calls)
    finally:
        torch.set_num_threads(before)
    return [seconds * 1e6 for seconds in best]


def updates() -> list[tuple[str, int, Callable[[], object], Callable[[], object]]]:
    """``(update, calls per round at scale 1, covey's update, SB3's update)`` per row."""
    n_envs, settings = PPO_SETTINGS["8 envs (batch 256)"]
    covey_ppo = collected_ppo(n_envs, True, **settings)
    sb3_ppo = with_rollout(ppo_on(SB3PPO, n_envs, **settings))
    covey_sac = sac_model(timesteps=400)
    sb3_sac = sac_on_pendulum(SB3SAC).learn(400)
    covey_poca = collected_poca()
    sb3_poca = with_rollout(make_supersuit_ppo(0))
    return [
        (
            "PPO CartPole, 8 envs, RL-Zoo settings: an update (20 minibatches of 256)",
            40,
            covey_ppo.train,
            sb3_ppo.train,
        ),
        (
            "SAC Pendulum: a gradient step (256 samples)",
            100,
            lambda: covey_sac.train(1, 256),
            lambda: sb3_sac.train(1, 256),
        ),
        (
            "MA-POCA simple_spread (covey) against SB3 PPO + SuperSuit: an update (16 minibatches)",
            3,
            covey_poca.train,
            sb3_poca.train,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.threads", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds per learner and update")
    parser.add_argument(
        "--calls-scale", type=float, default=1.0, help="multiplies the calls per round (at least 1 call)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.calls_scale <= 0:
        parser.error("--repeats must be >= 1 and --calls-scale > 0")
    print("| update | covey, 1 thread | covey, 2 threads | covey 2/1 | SB3, 1 thread | SB3, 2 threads | SB3 2/1 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what, calls, covey_update, sb3_update in updates():
        calls = max(round(calls * args.calls_scale), 1)
        covey_1, covey_2 = per_thread_count(covey_update, calls, args.repeats)
        sb3_1, sb3_2 = per_thread_count(sb3_update, calls, args.repeats)
        print(
            f"| {what} | {duration(covey_1)} | {duration(covey_2)} | {covey_2 / covey_1:.2f} "
            f"| {duration(sb3_1)} | {duration(sb3_2)} | {sb3_2 / sb3_1:.2f} |",
            flush=True,
        )
    print(f"\ncommand: {shlex.join(['python', '-m', 'benchmarks.threads', *(sys.argv[1:] if argv is None else argv)])}")
    print(f"CPU: {cpu_description()}, {os.cpu_count()} cores")
    print(f"code: {code_version()}")


if __name__ == "__main__":
    main()
