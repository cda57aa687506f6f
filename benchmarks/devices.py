"""covey and SB3 on the CPU and on CUDA, side by side in one process: which device each learner trains faster
on (README, "Devices"; RESULTS.md, "On a machine with CUDA").

    python -m benchmarks.devices                # about a minute where there is CUDA
    python -m benchmarks.devices --scale 0.05   # smoke run, seconds

Two learners, each at covey's and SB3's defaults beside the settings named here: PPO on 8 CartPole envs (256
steps per env and rollout, minibatches of 256, so 80 minibatches per rollout; one untimed rollout first, then 3
timed), and SAC on one Pendulum env (500 env steps, gradient steps from step 100 on, learning rate 1e-3). Every
(learner, library, device) run builds a fresh model with seed 0; the runs go in that order within a round, and
rounds repeat it, so the machine's drift reaches all of them. On a machine without CUDA only the CPU rows run.
Torch runs on one thread (``--threads``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
import warnings

import stable_baselines3
import torch
from stable_baselines3.common.env_util import make_vec_env

import covey
from benchmarks.common import code_version, cpu_description

PPO_ENVS, PPO_STEPS = 8, 256  # envs, steps per env and rollout
PPO_ROLLOUTS = 3
SAC_STEPS, SAC_STARTS = 500, 100
LIBRARIES = {"covey": covey, "SB3": stable_baselines3}


def timed_run(agent: str, library: str, device: str, scale: float) -> tuple[int, float]:
    """(env steps, seconds) of one timed ``learn`` of a fresh model."""
    cls = getattr(LIBRARIES[library], agent)
    if agent == "PPO":
        env = make_vec_env("CartPole-v1", PPO_ENVS, seed=0)
        model = cls("MlpPolicy", env, n_steps=PPO_STEPS, batch_size=256, seed=0, device=device)
        model.learn(PPO_ENVS * PPO_STEPS)  # one untimed rollout and update
        steps = PPO_ENVS * PPO_STEPS * max(1, round(PPO_ROLLOUTS * scale))
    else:
        env = make_vec_env("Pendulum-v1", 1, seed=0)
        model = cls("MlpPolicy", env, learning_starts=SAC_STARTS, learning_rate=1e-3, seed=0, device=device)
        steps = max(SAC_STARTS + 8, round(SAC_STEPS * scale))
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return steps, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the timed env steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"command: python -m benchmarks.devices {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(f"code: {code_version()}; torch {torch.__version__}, {args.threads} thread(s); CPU: {cpu_description()}")
    print(f"CUDA device: {gpu}")
    seconds: dict[tuple[str, str, str], list[float]] = {}
    print("\n| round | learner | library | device | env steps | seconds | env steps/s |")
    print("|---:|---|---|---|---:|---:|---:|")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPO's advice to use the CPU, in both libraries, on every CUDA row
        for round_ in range(args.rounds):
            for agent in ("PPO", "SAC"):
                for library in LIBRARIES:
                    for device in devices:
                        steps, dt = timed_run(agent, library, device, args.scale)
                        seconds.setdefault((agent, library, device), []).append(dt)
                        print(f"| {round_} | {agent} | {library} | {device} | {steps} | {dt:.2f} | {steps / dt:,.1f} |")
    print("\nRatios of seconds, per round (below 1: the first is faster):")
    for agent in ("PPO", "SAC"):
        for device in devices:
            ratios = [a / b for a, b in zip(seconds[agent, "covey", device], seconds[agent, "SB3", device])]
            print(f"- {agent}, covey/SB3 both on {device}: " + ", ".join(f"{r:.2f}" for r in ratios))
        if "cuda" in devices:
            for library in LIBRARIES:
                ratios = [a / b for a, b in zip(seconds[agent, library, "cpu"], seconds[agent, library, "cuda"])]
                print(f"- {agent}, {library} on the CPU / on CUDA: " + ", ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
