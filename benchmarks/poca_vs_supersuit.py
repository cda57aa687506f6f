"""MA-POCA against the usual SB3 recipe for PettingZoo teams, side by side in one process.

    python -m benchmarks.poca_vs_supersuit                     # 100k env steps x 2 seeds, about 10 min
    python -m benchmarks.poca_vs_supersuit --timesteps 5000 --seeds 1   # smoke run

The task is mpe2's simple_spread (N=3, 25 cycles). The baseline is SB3's PPO with parameter sharing via
SuperSuit (``pettingzoo_env_to_vec_env_v1`` + ``concat_vec_envs_v1``): every agent is one entry of the
vector env. Both get the same number of env steps (one parallel step of one copy = 1; SB3 counts agent
entries, so its budget is 3x), the same rollout size in agent-steps, minibatch size, epochs and learning
rate. Reported: wall time, env steps/s, and the mean per-agent return of the deterministic policy.
SuperSuit's vector env has no ``seed()``, so the SB3 run seeds torch and NumPy with ``set_random_seed`` and
the env copies with one seeded reset before training.

``run_poca``, ``run_supersuit_ppo`` and ``measure_env_speed`` are also the ``poca_simple_spread`` task of
``python -m benchmarks.compare``.
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
from stable_baselines3.common.vec_env import VecEnv

from benchmarks.common import median_range, random_stepping_speed
from covey import POCA
from covey.evaluation import evaluate_group
from covey.wrappers.group_env import SubprocGroupVecEnv

N_AGENTS, N_COPIES, N_STEPS, BATCH_GROUP_STEPS, EPOCHS, LR = 3, 8, 128, 256, 4, 1e-3
MIN_TIMESTEPS = N_COPIES * N_STEPS
"""Env steps of one rollout (both learners round a budget up to whole rollouts)."""
N_EVAL_EPISODES, EVAL_SEED_OFFSET = 20, 10_000


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


def make_poca(seed: int, *, n_processes: int | None = None, **policy_kwargs) -> POCA:
    """covey's POCA with this benchmark's settings (``policy_kwargs`` beyond covey's defaults, e.g. a width).
    With ``n_processes`` the copies step in that many processes (:class:`SubprocGroupVecEnv`), else in this one."""
    env = make_env if n_processes is None else SubprocGroupVecEnv([make_env] * N_COPIES, n_processes=n_processes)
    return POCA(
        "MlpPolicy",
        env,
        n_envs=N_COPIES,
        n_steps=N_STEPS,
        batch_size=BATCH_GROUP_STEPS,
        n_epochs=EPOCHS,
        learning_rate=LR,
        seed=seed,
        policy_kwargs=policy_kwargs or None,
    )


def run_poca(
    timesteps: int,
    seed: int,
    n_eval_episodes: int = N_EVAL_EPISODES,
    callback=None,
    policy_kwargs=None,
    n_processes: int | None = None,
) -> tuple[float, float, int]:
    """Train covey's POCA for ``timesteps`` env steps; (seconds of ``learn``, per-agent return, env steps).

    ``callback`` (an SB3 callback) is passed to ``learn``; a :class:`benchmarks.poca_curve.LearningCurve`'s own
    evaluation time is left out of the seconds. ``policy_kwargs`` (e.g. a width) and ``n_processes`` go to
    :func:`make_poca`."""
    model = make_poca(seed, n_processes=n_processes, **(policy_kwargs or {}))
    seconds = timed_learn(model, timesteps, callback)
    model.get_env().close()
    agent_return = evaluate_group(model, make_env, n_eval_episodes=n_eval_episodes, seed=EVAL_SEED_OFFSET + seed)
    return seconds, agent_return["agent_return"], model.num_timesteps


def make_supersuit_env(seed: int, num_cpus: int = 0) -> VecEnv:
    """N_COPIES copies of the env as one SB3 VecEnv with an entry per agent, copy i reset with seed + i; stepped in
    this process, or with ``num_cpus`` > 0 in that many worker processes (SuperSuit's blocks of copies).

    The vector env has no ``seed()``; the seeded reset seeds each copy's random generator, which the
    unseeded resets that follow (SB3's at the start of ``learn``, the copies' own) keep using.
    """
    venv = ss.concat_vec_envs_v1(
        ss.pettingzoo_env_to_vec_env_v1(make_env()), N_COPIES, num_cpus=num_cpus, base_class="stable_baselines3"
    )
    venv.venv.reset(seed=seed)
    return venv


def make_supersuit_ppo(seed: int, num_cpus: int = 0) -> SB3PPO:
    """SB3's PPO with this benchmark's settings on :func:`make_supersuit_env` (torch and NumPy seeded first)."""
    set_random_seed(seed)
    return SB3PPO(
        "MlpPolicy",
        make_supersuit_env(seed, num_cpus),
        n_steps=N_STEPS,
        batch_size=BATCH_GROUP_STEPS * N_AGENTS,
        n_epochs=EPOCHS,
        learning_rate=LR,
        ent_coef=5e-3,
        policy_kwargs=dict(net_arch=[128, 128]),
    )


def run_supersuit_ppo(
    timesteps: int, seed: int, n_eval_episodes: int = N_EVAL_EPISODES, callback=None, num_cpus: int = 0
) -> tuple[float, float, int]:
    """Train SB3 PPO with parameter sharing for ``timesteps`` env steps; as :func:`run_poca` (``num_cpus``: as
    :func:`make_supersuit_env`'s)."""
    model = make_supersuit_ppo(seed, num_cpus)
    seconds = timed_learn(model, timesteps * N_AGENTS, callback)  # SB3 counts one step per agent entry
    model.get_env().close()
    policy = _SharedPolicy(model)
    agent_return = evaluate_group(policy, make_env, n_eval_episodes=n_eval_episodes, seed=EVAL_SEED_OFFSET + seed)
    return seconds, agent_return["agent_return"], model.num_timesteps // N_AGENTS


def timed_learn(model, total_timesteps: int, callback=None) -> float:
    """Seconds of ``model.learn(total_timesteps, callback)``, less any time the callback spent evaluating
    (its ``eval_seconds``, e.g. :class:`benchmarks.poca_curve.LearningCurve`'s)."""
    start = time.perf_counter()
    if callback is not None:
        callback.start = start
    model.learn(total_timesteps, callback=callback)
    return time.perf_counter() - start - getattr(callback, "eval_seconds", 0.0)


def measure_env_speed(seconds: float, seed: int = 0) -> float:
    """Env steps per second (N_COPIES per vector step) of the SB3 run's vector env stepped with random actions."""
    return random_stepping_speed(make_supersuit_env(seed), N_COPIES, seconds, seed)


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
            seconds, agent_return, _ = run(args.timesteps, seed)
            runs[name].append((seconds, agent_return))
            print(f"  seed {seed} {name}: {seconds:.1f} s, per-agent return {agent_return:.2f}", file=sys.stderr)
    random_return = evaluate_group(None, make_env, n_eval_episodes=N_EVAL_EPISODES, seed=EVAL_SEED_OFFSET)[
        "agent_return"
    ]
    print(f"- command: `python -m benchmarks.poca_vs_supersuit {shlex.join(argv or sys.argv[1:])}`")
    threads = f"{args.threads} torch thread" + ("s" if args.threads != 1 else "")
    print(f"- simple_spread N={N_AGENTS}, {args.timesteps} env steps per run, {args.seeds} seeds, {threads}")
    print()
    print("| learner | seconds (median) | env steps/s | per-agent return (median [min, max]) |")
    print("|---|---:|---:|---:|")
    for name, results in runs.items():
        seconds = statistics.median(s for s, _ in results)
        spread = median_range([r for _, r in results], ".2f")
        print(f"| {name} | {seconds:.1f} | {args.timesteps / seconds:,.0f} | {spread} |")
    print(f"| uniform random | | | {random_return:.2f} |")


if __name__ == "__main__":
    main()
