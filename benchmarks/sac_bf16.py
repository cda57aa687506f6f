"""covey SAC with and without its opt-in bfloat16 matrix multiplies: training time and final return.

    python -m benchmarks.sac_bf16                                   # Pendulum-v1, 10k steps, 3 seeds
    python -m benchmarks.sac_bf16 --env LunarLanderContinuous --timesteps 30000 --seeds 2

Both variants train on the same seeds and settings, alternating which goes first; only ``learn`` is timed.
The returns answer whether ``bf16_matmuls=True`` changes what SAC learns; the times what it saves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch
from stable_baselines3.common.evaluation import evaluate_policy

from benchmarks.common import unrendered_vec_env
from covey import SAC

ENVS = {
    "Pendulum": dict(env_id="Pendulum-v1", env_kwargs=None, hyperparameters=dict(learning_rate=1e-3)),
    "LunarLanderContinuous": dict(
        env_id="LunarLander-v3",
        env_kwargs=dict(continuous=True),
        hyperparameters=dict(
            learning_rate=7.3e-4, tau=0.01, learning_starts=10_000, policy_kwargs=dict(net_arch=[400, 300])
        ),
    ),
}


def run(env: str, bf16: bool, timesteps: int, seed: int) -> tuple[float, float]:
    """Seconds of ``learn`` and the mean deterministic return over 10 evaluation episodes."""
    spec = ENVS[env]
    venv = unrendered_vec_env(spec["env_id"], 1, seed, spec["env_kwargs"])
    model = SAC("MlpPolicy", venv, seed=seed, bf16_matmuls=bf16, **spec["hyperparameters"])
    start = time.perf_counter()
    model.learn(timesteps)
    seconds = time.perf_counter() - start
    eval_env = unrendered_vec_env(spec["env_id"], 1, 10_000 + seed, spec["env_kwargs"])
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    return seconds, float(mean)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sac_bf16", description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(ENVS), default="Pendulum")
    parser.add_argument("--timesteps", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for seed in range(args.seeds):
        results = {}
        for bf16 in (False, True) if seed % 2 == 0 else (True, False):
            results[bf16] = run(args.env, bf16, args.timesteps, seed)
            print(f"seed {seed} bf16={bf16}: {results[bf16][0]:.1f} s, return {results[bf16][1]:.1f}", file=sys.stderr)
        rows.append((seed, *results[False], *results[True]))
    print(f"SAC {args.env}, {args.timesteps} steps, {args.seeds} seeds, {args.threads} torch thread(s)\n")
    print("| seed | float32 s | bf16 s | bf16/float32 time | float32 return | bf16 return |")
    print("|---:|---:|---:|---:|---:|---:|")
    for seed, s32, r32, s16, r16 in rows:
        print(f"| {seed} | {s32:.1f} | {s16:.1f} | {s16 / s32:.2f} | {r32:.1f} | {r16:.1f} |")
    med = [statistics.median(column) for column in zip(*rows)]
    ratio = statistics.median(s16 / s32 for _, s32, _, s16, _ in rows)
    print(f"| median | {med[1]:.1f} | {med[3]:.1f} | {ratio:.2f} | {med[2]:.1f} | {med[4]:.1f} |")
    print(f"\ncommand: python -m benchmarks.sac_bf16 {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
