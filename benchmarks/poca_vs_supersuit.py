"""MA-POCA against the usual SB3 recipe for PettingZoo teams, side by side in one process.

    python -m benchmarks.poca_vs_supersuit                     # 100k env steps x 2 seeds, about 10 min
    python -m benchmarks.poca_vs_supersuit --timesteps 5000 --seeds 1   # smoke run

The task is mpe2's simple_spread (N=3, 25 cycles). The baseline is SB3's PPO with parameter sharing via
SuperSuit (``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1``): every agent is one entry of the
vector env. Both get the same number of env steps (one parallel step of one copy = 1; SB3 counts agent
entries, so its budget is 3x), the same rollout size in agent-steps, minibatch size, epochs and learning
rate. Reported: wall time, env steps/s, and the mean per-agent return of the deterministic policy.
SuperSuit's vector env has no ``seed()``, so the SB3 run seeds torch and NumPy only.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import numpy as np
import supersuit as ss
import torch
from mpe2 import simple_spread_v3
from stable_baselines3 import PPO as SB3PPO
from stable_baselines3.common.utils import set_random_seed

from covey import POCA
from covey.evaluation import evaluate_group

N_AGENTS, N_COPIES, N_STEPS, BATCH_GROUP_STEPS, EPOCHS, LR = 3, 8, 128, 256, 4, 1e-3


def make_env():
    return simple_spread_v3.parallel_env(N=N_AGENTS, max_cycles=25)


class _SharedPolicy:
    """predict({agent: obs}) for an SB3 model trained on SuperSuit's one-entry-per-agent vector env."""

    def __init__(self, model) -> None:
        self.model = model

    def predict(self, observation: dict, state=None, episode_start=None, deterministic: bool = True):
        agents = list(observation)
        actions, _ = self.model.predict(np.stack([observation[a] for a in agents]), deterministic=deterministic)
        return dict(zip(agents, actions)), state


def run_poca(timesteps: int, seed: int) -> tuple[float, float]:
    model = POCA(
        "MlpPolicy",
        make_env,
        n_envs=N_COPIES,
        n_steps=N_STEPS,
        batch_size=BATCH_GROUP_STEPS,
        n_epochs=EPOCHS,
        learning_rate=LR,
        seed=seed,
    )
    start = time.perf_counter()
    model.learn(timesteps)
    seconds = time.perf_counter() - start
    return seconds, evaluate_group(model, make_env, n_eval_episodes=20, seed=10_000 + seed)["agent_return"]


def run_supersuit_ppo(timesteps: int, seed: int) -> tuple[float, float]:
    set_random_seed(seed)
    venv = ss.concat_vec_envs_v1(
        ss.pettingzoo_env_to_vec_env_v1(make_env()), N_COPIES, num_cpus=0, base_class="stable_baselines3"
    )
    model = SB3PPO(
        "MlpPolicy",
        venv,
        n_steps=N_STEPS,
        batch_size=BATCH_GROUP_STEPS * N_AGENTS,
        n_epochs=EPOCHS,
        learning_rate=LR,
        ent_coef=5e-3,
        policy_kwargs=dict(net_arch=[128, 128]),
    )
    start = time.perf_counter()
    model.learn(timesteps * N_AGENTS)  # SB3 counts one step per agent entry
    seconds = time.perf_counter() - start
    venv.close()
    policy = _SharedPolicy(model)
    return seconds, evaluate_group(policy, make_env, n_eval_episodes=20, seed=10_000 + seed)["agent_return"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=100_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    runs = {"covey POCA": [], "SB3 PPO + SuperSuit": []}
    for seed in range(args.seeds):
        order = [("covey POCA", run_poca), ("SB3 PPO + SuperSuit", run_supersuit_ppo)]
        for name, run in order if seed % 2 == 0 else order[::-1]:
            seconds, agent_return = run(args.timesteps, seed)
            runs[name].append((seconds, agent_return))
            print(f"  seed {seed} {name}: {seconds:.1f} s, per-agent return {agent_return:.2f}", file=sys.stderr)
    random_return = evaluate_group(None, make_env, n_eval_episodes=20, seed=10_000)["agent_return"]
    print(f"- command: `python -m benchmarks.poca_vs_supersuit {shlex.join(argv or sys.argv[1:])}`")
    print(f"- simple_spread N={N_AGENTS}, {args.timesteps} env steps per run, {args.seeds} seeds, 1 torch thread")
    print()
    print("| learner | seconds (median) | env steps/s | per-agent return (median [min, max]) |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():
        seconds = statistics.median(s for s, _ in results)
        returns = [r for _, r in results]
        spread = f"{statistics.median(returns):.2f} [{min(returns):.2f}, {max(returns):.2f}]"
        print(f"| {name} | {seconds:.1f} | {args.timesteps / seconds:,.0f} | {spread} |")
    print(f"| uniform random | | | {random_return:.2f} |")


if __name__ == "__main__":
    main()
