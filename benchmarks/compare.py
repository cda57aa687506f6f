"""Side-by-side benchmark of covey against Stable-Baselines3: training time, env throughput, final return.

    python -m benchmarks.compare --suite quick                  # its tasks, 2 seeds: 10-14 min on RESULTS.md's CPU
    python -m benchmarks.compare --suite full --out results.md  # long: hours
    python -m benchmarks.compare --suite quick --tasks sac_pendulum --seeds 1 --scale 0.1   # smoke run

Both frameworks train in the same process, alternating per seed (covey first on even seeds, SB3 first on
odd ones), on identical envs, seeds and hyperparameters; the envs are made without rendering
(:func:`benchmarks.common.unrendered_vec_env`: SB3's ``make_vec_env`` would make them with
``render_mode="rgb_array"``, under which LunarLander simulates particles that slow its unrendered episodes down).
Only ``model.learn`` is timed. The machine may be shared and noisy: compare the covey/SB3 ratios of one run, not
absolute seconds across runs. A task that differs from another only in covey's options (the ``_bf16`` rows,
``poca_simple_spread_width64``) shares that task's SB3 runs when both run: per seed SB3 trains once, between the
two covey runs.

The single-agent tasks pit covey's PPO or SAC against SB3's on a Gymnasium VecEnv. ``poca_simple_spread``
is the multi-agent task of :mod:`benchmarks.poca_vs_supersuit`: covey's MA-POCA against SB3's PPO with
parameter sharing via SuperSuit, on mpe2's simple_spread (3 agents, 25 cycles, 8 env copies). Its timesteps
and steps/s count env steps (one parallel step of one copy; SB3 trains on one entry per agent, 3 per env
step), its returns are mean per-agent returns, and its raw env speed is SB3's 8-copy SuperSuit vector env.
``poca_simple_spread_width64`` is the same with covey's critic at ``attention_width=64`` (its default is 128).
``ppo_cartpole_8env_custom_policy`` and ``sac_pendulum_custom_policy`` (full suite) train users' SB3 policy classes
(:mod:`benchmarks.custom_policy`) with both libraries, at ``ppo_cartpole_8env``'s and ``sac_pendulum``'s settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
import pettingzoo
import stable_baselines3
import supersuit
import torch
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv

import covey
from benchmarks import custom_policy, poca_vs_supersuit
from benchmarks.common import (
    code_version,
    cpu_description,
    median_range,
    random_stepping_speed,
    unrendered_vec_env,
)
from covey.networks import linear

FRAMEWORKS: dict[str, dict[str, type]] = {
    "covey": {"PPO": covey.PPO, "SAC": covey.SAC},
    "sb3": {"PPO": stable_baselines3.PPO, "SAC": stable_baselines3.SAC},
}
N_EVAL_EPISODES = 10
EVAL_SEED_OFFSET = 10_000
DEFAULT_SEEDS = {"quick": 2, "full": 3}
SB3_DEFAULTS = {"PPO": {"n_steps": 2048}, "SAC": {"learning_starts": 100, "batch_size": 256}}


@dataclass(frozen=True)
class Runner:
    """Hooks for a task that is not one agent class per framework on a Gymnasium VecEnv (a multi-agent team)."""

    train: dict[str, Callable[[int, int, int], tuple[float, float, int]]]
    """Per framework: ``(timesteps, seed, n_eval_episodes)`` -> (seconds of ``learn`` only, mean return of the
    deterministic policy on envs seeded from ``EVAL_SEED_OFFSET + seed``, timesteps actually trained)."""
    env_speed: Callable[[float, int], float]
    """``(seconds, seed)`` -> timesteps per second of the training env stepped with random actions."""
    min_timesteps: int
    """The smallest budget in which learning happens (one rollout)."""
    eval_episodes: int = N_EVAL_EPISODES
    """Evaluation episodes per seed (more than the default where one episode says little)."""


@dataclass(frozen=True)
class Task:
    """One benchmark: an agent on an env, with hyperparameters shared by both frameworks."""

    name: str
    agent: str
    """"PPO" or "SAC" (the class is looked up per framework in FRAMEWORKS); any name when ``runner`` is set."""
    env_id: str
    """A Gymnasium id (a description when ``runner`` is set)."""
    n_envs: int
    budgets: dict[str, int]
    """Timesteps per suite ("quick", "full")."""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    suite_hyperparameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-suite additions to ``hyperparameters`` (e.g. a shorter warm-up for the quick suite)."""
    env_kwargs: dict[str, Any] | None = None
    covey_options: dict[str, Any] = field(default_factory=dict)
    """covey-only arguments (e.g. ``bf16_matmuls=True``; with ``runner``, keywords of its covey function); SB3
    runs without them."""
    runner: Runner | None = None
    """Trains and measures the task instead of the FRAMEWORKS classes on :func:`make_env`'s VecEnv."""
    sb3_runs_of: str | None = None
    """The task whose SB3 runs this one shares when both run (:func:`task_groups`): the same SB3 side (agent,
    env, settings, budgets), covey's options apart."""
    note: str = ""
    """Printed under the table when the task is in it (what its columns count, where that differs)."""
    policy: Any = "MlpPolicy"
    """The ``policy`` argument of both frameworks: a name, or a user's SB3 policy class."""

    def kwargs(self, suite: str, framework: str = "sb3") -> dict[str, Any]:
        extra = self.covey_options if framework == "covey" else {}
        return {**self.hyperparameters, **self.suite_hyperparameters.get(suite, {}), **extra}

    def min_timesteps(self, suite: str) -> int:
        """The smallest budget in which learning happens: one PPO rollout, SAC's warm-up plus a batch, or the
        runner's."""
        if self.runner is not None:
            return self.runner.min_timesteps
        kwargs = {**SB3_DEFAULTS[self.agent], **self.kwargs(suite)}
        if self.agent == "PPO":
            return kwargs["n_steps"] * self.n_envs
        return kwargs["learning_starts"] + kwargs["batch_size"]

    def timesteps(self, suite: str, scale: float) -> int:
        return max(round(self.budgets[suite] * scale), self.min_timesteps(suite))

    def sb3_side(self, suite: str) -> tuple:
        """What SB3's run of this task depends on: tasks with equal ones may share SB3's runs."""
        settings = (self.agent, self.env_id, self.n_envs, repr(self.kwargs(suite)), repr(self.env_kwargs), self.policy)
        runner = None if self.runner is None else (self.runner.train["sb3"], self.runner.eval_episodes)
        return (*settings, self.budgets, runner)


TASKS = [
    Task("ppo_cartpole_1env", "PPO", "CartPole-v1", n_envs=1, budgets={"quick": 20_000, "full": 100_000}),
    Task(
        "ppo_cartpole_8env",
        "PPO",
        "CartPole-v1",
        n_envs=8,
        budgets={"quick": 50_000, "full": 100_000},
        # RL-Zoo settings, with a constant learning rate.
        hyperparameters=dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
        ),
    ),
    # SB3's default hyperparameters, as in the 1-env task (2048 steps per env, minibatches of 64, 10 epochs).
    Task("ppo_cartpole_8env_defaults", "PPO", "CartPole-v1", n_envs=8, budgets={"quick": 50_000, "full": 100_000}),
    Task(
        "ppo_lunarlander",
        "PPO",
        "LunarLander-v3",
        n_envs=16,
        budgets={"quick": 50_000, "full": 1_000_000},
        hyperparameters=dict(n_steps=1024, batch_size=64, n_epochs=4, gamma=0.999, gae_lambda=0.98, ent_coef=0.01),
    ),
    # RL-Zoo's Pendulum settings, with generalized state-dependent exploration (use_sde).
    Task(
        "ppo_pendulum_sde",
        "PPO",
        "Pendulum-v1",
        n_envs=4,
        budgets={"full": 100_000},  # not in the quick suite, which fits in 15 minutes without it
        hyperparameters=dict(
            n_steps=1024,
            gae_lambda=0.95,
            gamma=0.9,
            n_epochs=10,
            ent_coef=0.0,
            learning_rate=1e-3,
            clip_range=0.2,
            use_sde=True,
            sde_sample_freq=4,
        ),
    ),
    Task(
        "sac_pendulum",
        "SAC",
        "Pendulum-v1",
        n_envs=1,
        budgets={"quick": 3_000, "full": 20_000},
        hyperparameters=dict(learning_rate=1e-3),
    ),
    # SAC with generalized state-dependent exploration (use_sde), the settings of sac_pendulum otherwise.
    Task(
        "sac_pendulum_sde",
        "SAC",
        "Pendulum-v1",
        n_envs=1,
        budgets={"full": 20_000},  # not in the quick suite, which fits in 15 minutes without it
        hyperparameters=dict(learning_rate=1e-3, use_sde=True),
    ),
    Task(
        "sac_lunarlander_continuous",
        "SAC",
        "LunarLander-v3",
        n_envs=1,
        budgets={"quick": 3_000, "full": 300_000},
        hyperparameters=dict(learning_rate=7.3e-4, batch_size=256, tau=0.01, policy_kwargs=dict(net_arch=[400, 300])),
        suite_hyperparameters={"quick": dict(learning_starts=1_000), "full": dict(learning_starts=10_000)},
        env_kwargs=dict(continuous=True),
    ),
]
# A user's SB3 policy class (benchmarks.custom_policy) at ppo_cartpole_8env's settings: covey runs it through SB3's
# policy calls.
TASKS.append(
    dataclasses.replace(
        next(task for task in TASKS if task.name == "ppo_cartpole_8env"),
        name="ppo_cartpole_8env_custom_policy",
        budgets={"full": 100_000},  # not in the quick suite, which fits in 15 minutes without it
        policy=custom_policy.TowerPolicy,
        note=(
            "ppo_cartpole_8env_custom_policy: ppo_cartpole_8env with a user's subclass of SB3's ActorCriticPolicy "
            "(benchmarks/custom_policy.py, a custom mlp_extractor), which covey trains through SB3's policy calls."
        ),
    )
)
# covey's opt-in bfloat16 matrix multiplies for SAC, against SB3 in float32 (same settings otherwise): SB3's
# runs are the float32 task's when both run.
TASKS += [
    Task(
        f"{task.name}_bf16",
        task.agent,
        task.env_id,
        task.n_envs,
        task.budgets,
        task.hyperparameters,
        task.suite_hyperparameters,
        task.env_kwargs,
        covey_options=dict(bf16_matmuls=True),
        sb3_runs_of=task.name,  # SB3 runs in float32 either way
    )
    for task in TASKS
    if task.agent == "SAC" and not task.hyperparameters.get("use_sde")
]
# A user's SB3 SACPolicy class (benchmarks.custom_policy) at sac_pendulum's settings, after the bf16 twins are
# made: SAC runs it through SB3's calls, so it has none.
TASKS.append(
    dataclasses.replace(
        next(task for task in TASKS if task.name == "sac_pendulum"),
        name="sac_pendulum_custom_policy",
        budgets={"full": 3_000},  # not in the quick suite, which fits in 15 minutes without it
        policy=custom_policy.LayerNormSACPolicy,
        note=(
            "sac_pendulum_custom_policy: sac_pendulum's quick budget with a user's subclass of SB3's SACPolicy "
            "(benchmarks/custom_policy.py, LayerNorm critics), which covey trains through SB3's policy calls."
        ),
    )
)
# MA-POCA against SB3 PPO with parameter sharing via SuperSuit (the setup of benchmarks.poca_vs_supersuit),
# trained and measured by its own Runner.
TASKS += [
    Task(
        "poca_simple_spread",
        "POCA",
        f"mpe2 simple_spread_v3 (N={poca_vs_supersuit.N_AGENTS}, max_cycles=25)",
        n_envs=poca_vs_supersuit.N_COPIES,
        budgets={"quick": 100_000, "full": 1_000_000},
        runner=Runner(
            train={"covey": poca_vs_supersuit.run_poca, "sb3": poca_vs_supersuit.run_supersuit_ppo},
            env_speed=poca_vs_supersuit.measure_env_speed,
            min_timesteps=poca_vs_supersuit.MIN_TIMESTEPS,
            # 25-step episodes whose returns vary a lot with the start: 10 would rank two learners by chance.
            eval_episodes=50,
        ),
        note=(
            "poca_simple_spread: covey's POCA against SB3 PPO with parameter sharing via SuperSuit on mpe2's "
            f"simple_spread ({poca_vs_supersuit.N_AGENTS} agents, {poca_vs_supersuit.N_COPIES} env copies). "
            "Timesteps and steps/s count env steps (one parallel step of one copy; SB3 trains on one entry per "
            "agent), returns are mean per-agent returns over 50 episodes, and raw env steps/s is SB3's "
            f"{poca_vs_supersuit.N_COPIES}-copy SuperSuit vector env stepped with random actions, in env steps."
        ),
    )
]
# covey's POCA with its critic's attention at width 64 instead of the default 128 (an option of covey's; the
# same settings otherwise), against the same SB3 runs when both run.
TASKS.append(
    dataclasses.replace(
        TASKS[-1],
        name="poca_simple_spread_width64",
        covey_options=dict(policy_kwargs=dict(attention_width=64)),
        sb3_runs_of="poca_simple_spread",
        note=(
            "poca_simple_spread_width64: poca_simple_spread with covey's critic at "
            "`policy_kwargs=dict(attention_width=64)` (default 128), counted the same way."
        ),
    )
)
TASKS_BY_NAME = {task.name: task for task in TASKS}


@dataclass
class RunResult:
    framework: str
    seed: int
    seconds: float
    timesteps: int
    eval_return: float
    total_seconds: float = 0.0
    """The whole run: building the model and env, ``learn`` and the evaluation (logged, not in the table)."""

    @property
    def steps_per_second(self) -> float:
        return self.timesteps / self.seconds


@dataclass
class TaskResult:
    task: Task
    env_steps_per_second: float
    runs: list[RunResult]

    def timesteps(self) -> str:
        """Timesteps actually trained (PPO rounds the budget up to whole rollouts)."""
        return "/".join(f"{steps:,}" for steps in sorted({run.timesteps for run in self.runs}))

    def of(self, framework: str) -> list[RunResult]:
        return [run for run in self.runs if run.framework == framework]

    def time_ratios(self) -> list[float]:
        """covey seconds / SB3 seconds, one per seed."""
        sb3 = {run.seed: run.seconds for run in self.of("sb3")}
        return [run.seconds / sb3[run.seed] for run in self.of("covey")]


def make_env(task: Task, n_envs: int, seed: int) -> VecEnv:
    """The task's env as SB3's ``make_vec_env`` makes it, without rendering
    (:func:`benchmarks.common.unrendered_vec_env`)."""
    return unrendered_vec_env(task.env_id, n_envs, seed, task.env_kwargs)


def measure_env_speed(task: Task, seconds: float, seed: int = 0) -> float:
    """Env steps per second (n_envs per VecEnv step) of the task's VecEnv stepped with random actions."""
    if task.runner is not None:
        return task.runner.env_speed(seconds, seed)
    return random_stepping_speed(make_env(task, task.n_envs, seed), task.n_envs, seconds, seed)


def measure_training(framework: str, task: Task, suite: str, timesteps: int, seed: int) -> RunResult:
    """Train one model on a fresh env, timing ``learn`` only, then evaluate it on a separately seeded env."""
    started = time.perf_counter()
    if task.runner is not None:
        options = task.covey_options if framework == "covey" else {}
        seconds, eval_return, trained = task.runner.train[framework](
            timesteps, seed, task.runner.eval_episodes, **options
        )
        return RunResult(framework, seed, seconds, trained, eval_return, time.perf_counter() - started)
    agent_class = FRAMEWORKS[framework][task.agent]
    env = make_env(task, task.n_envs, seed)
    model = agent_class(task.policy, env, seed=seed, verbose=0, **task.kwargs(suite, framework))
    start = time.perf_counter()
    model.learn(total_timesteps=timesteps)
    seconds = time.perf_counter() - start
    eval_return = measure_return(model, task, seed)
    env.close()
    return RunResult(framework, seed, seconds, model.num_timesteps, eval_return, time.perf_counter() - started)


def measure_return(model: Any, task: Task, seed: int) -> float:
    """Mean return of the deterministic policy over N_EVAL_EPISODES episodes."""
    eval_env = make_env(task, 1, EVAL_SEED_OFFSET + seed)
    mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=N_EVAL_EPISODES, deterministic=True)
    eval_env.close()
    return float(mean_return)


def task_groups(names: Sequence[str]) -> list[list[Task]]:
    """The named tasks in groups that run together: a task with ``sb3_runs_of`` joins that task's group when
    both are named; every other task is a group of its own. Groups come in the order of their first task."""
    groups: dict[str, list[Task]] = {}
    for name in names:
        task = TASKS_BY_NAME[name]
        lead = task.sb3_runs_of if task.sb3_runs_of in names else name
        groups.setdefault(lead, []).append(task)
    return list(groups.values())


def run_group(
    tasks: Sequence[Task], suite: str, seeds: int, scale: float, env_seconds: float, log: Callable[[str], None]
) -> list[TaskResult]:
    """Train and measure ``tasks`` (one task, or tasks with the same SB3 side): per seed one SB3 run, which
    every task's covey run is compared with. Per seed SB3 runs between the covey runs (first with one task);
    the order of the covey runs, and which goes first with one task, alternates with the seed, so that slow
    phases of a noisy machine hit both frameworks alike."""
    lead = tasks[0]
    if any(task.sb3_side(suite) != lead.sb3_side(suite) for task in tasks[1:]):
        raise ValueError(f"tasks {[task.name for task in tasks]} do not share SB3's side: run them apart")
    timesteps = lead.timesteps(suite, scale)
    env_speed = measure_env_speed(lead, env_seconds)
    names = "/".join(task.name for task in tasks)
    log(f"[{names}] budget {timesteps} timesteps per run; raw env: {env_speed:,.0f} steps/s")
    runs: dict[str, list[RunResult]] = {task.name: [] for task in tasks}
    for seed in range(seeds):
        even = seed % 2 == 0
        order = [(task, "covey") for task in (tasks if even else tasks[::-1])]
        order.insert((len(tasks) + 1) // 2 if even else len(tasks) // 2, (lead, "sb3"))
        for task, framework in order:
            run = measure_training(framework, task, suite, timesteps, seed)
            for name in runs if framework == "sb3" else [task.name]:
                runs[name].append(run)
            log(
                f"[{names if framework == 'sb3' else task.name}] seed {seed} {framework:>5}: {run.seconds:7.1f} s, "
                f"{run.steps_per_second:8,.0f} steps/s, return {run.eval_return:8.1f} "
                f"({run.total_seconds:.1f} s with setup and evaluation)"
            )
    return [TaskResult(task, env_speed, runs[task.name]) for task in tasks]


def format_table(results: Sequence[TaskResult]) -> str:
    header = [
        "task",
        "timesteps",
        "covey s (median)",
        "SB3 s (median)",
        "covey/SB3 time ratio (median [min, max])",
        "covey steps/s",
        "SB3 steps/s",
        "raw env steps/s",
        "covey return (median [min, max])",
        "SB3 return (median [min, max])",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for result in results:
        covey_runs, sb3_runs = result.of("covey"), result.of("sb3")
        row = [
            result.task.name,
            result.timesteps(),
            f"{statistics.median(run.seconds for run in covey_runs):.1f}",
            f"{statistics.median(run.seconds for run in sb3_runs):.1f}",
            median_range(result.time_ratios(), ".2f"),
            f"{statistics.median(run.steps_per_second for run in covey_runs):,.0f}",
            f"{statistics.median(run.steps_per_second for run in sb3_runs):,.0f}",
            f"{result.env_steps_per_second:,.0f}",
            median_range([run.eval_return for run in covey_runs], ".1f"),
            median_range([run.eval_return for run in sb3_runs], ".1f"),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def format_report(
    results: Sequence[TaskResult],
    args: argparse.Namespace,
    command: str,
    started: datetime.datetime,
    load_at_start: tuple[float, float, float],
    code: str,
    not_run: Sequence[str] = (),
) -> str:
    minutes = (datetime.datetime.now().astimezone() - started).total_seconds() / 60
    load = "/".join(f"{value:.2f}" for value in os.getloadavg())
    machine = [
        f"- command: `{command}`",
        *(
            [f"- interrupted (Ctrl-C) before these tasks finished, which the table leaves out: {', '.join(not_run)}"]
            if not_run
            else []
        ),
        f"- code: {code}",
        f"- date: {started.isoformat(timespec='seconds')} (took {minutes:.1f} min)",
        f"- suite: {args.suite}, seeds: {args.seeds}, scale: {args.scale}",
        f"- cores (os.cpu_count()): {os.cpu_count()}, torch threads: {torch.get_num_threads()}",
        f"- torch {torch.__version__}, stable-baselines3 {stable_baselines3.__version__}, covey {covey.__version__}, "
        f"gymnasium {gymnasium.__version__}, pettingzoo {pettingzoo.__version__}, supersuit {supersuit.__version__}, "
        f"numpy {np.__version__}, Python {platform.python_version()}",
        f"- platform: {platform.platform()}, CUDA available: {torch.cuda.is_available()}"
        + (
            f" ({torch.cuda.get_device_name(0)}: device='auto' picks it for every model but covey's POCA, "
            "which runs on the CPU)"
            if torch.cuda.is_available()
            else ""
        ),
        f"- CPU: {cpu_description()}",
        "- load average (1/5/15 min) at start: "
        + "/".join(f"{value:.2f}" for value in load_at_start)
        + f", at end: {load}",
    ]
    notes = (
        "Times are wall-clock seconds of `model.learn` only; steps/s = timesteps / those seconds; the ratio is "
        "the median over seeds of covey seconds / SB3 seconds for the same seed (< 1: covey is faster). Returns "
        f"are the mean of {N_EVAL_EPISODES} deterministic evaluation episodes per seed. Raw env steps/s: the "
        "same VecEnv stepped with random actions."
    )
    names = {result.task.name for result in results}
    shared = [
        f"{result.task.name} shares SB3's runs with {result.task.sb3_runs_of} (the same SB3 settings and seeds: per "
        "seed SB3 trained once, between the two covey runs)."
        for result in results
        if result.task.sb3_runs_of in names
    ]
    left_out = getattr(args, "left_out", [])
    if left_out:
        shared.append(
            f"Left out: {', '.join(left_out)}. This CPU has no fast bfloat16 products (PyTorch's CPU capability: "
            f"{torch.backends.cpu.get_cpu_capability()}), where `bf16_matmuls=True` runs tens of times slower than "
            "float32 and warns; name them in --tasks to run them anyway."
        )
    notes = " ".join([notes, *(result.task.note for result in results if result.task.note), *shared])
    return "\n".join(["# covey vs Stable-Baselines3", "", format_table(results), "", notes, "", *machine, ""])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(DEFAULT_SEEDS), default="quick")
    parser.add_argument(
        "--tasks", default=None, help="comma-separated task names (default: every task with a budget in the suite)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per task (default: quick 2, full 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (set once at start)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every budget (clamped so learning runs)")
    parser.add_argument("--env-seconds", type=float, default=2.0, help="duration of the raw env speed measurement")
    parser.add_argument("--out", default=None, help="also write the report as markdown to this file")
    args = parser.parse_args(argv)
    args.left_out = []
    if args.tasks is None:
        args.task_list = [task.name for task in TASKS if args.suite in task.budgets]
        if not linear.fast_bfloat16_products():  # bf16_matmuls would take an hour here, and say nothing new
            args.left_out = [name for name in args.task_list if TASKS_BY_NAME[name].covey_options.get("bf16_matmuls")]
            args.task_list = [name for name in args.task_list if name not in args.left_out]
    else:
        args.task_list = list(dict.fromkeys(name.strip() for name in args.tasks.split(",") if name.strip()))
    if not args.task_list:
        parser.error(f"--tasks names no task; choose from {', '.join(TASKS_BY_NAME)}")
    unknown = [name for name in args.task_list if name not in TASKS_BY_NAME]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; choose from {', '.join(TASKS_BY_NAME)}")
    outside = [name for name in args.task_list if args.suite not in TASKS_BY_NAME[name].budgets]
    if outside:
        parser.error(f"task(s) {outside} have no {args.suite} budget; run them with --suite full")
    if args.seeds is None:
        args.seeds = DEFAULT_SEEDS[args.suite]
    if args.seeds < 1 or args.threads < 1 or not 0 < args.scale < math.inf or not 0 < args.env_seconds < math.inf:
        parser.error("--seeds and --threads must be >= 1, --scale and --env-seconds finite numbers > 0")
    if args.out is not None:
        problem = out_problem(args.out)
        if problem:
            parser.error(f"--out {args.out}: {problem}")
    return args


def out_problem(path: str) -> str | None:
    """Why the report cannot go to ``path`` (checked before the runs, which take minutes to hours), or None."""
    if not path:
        return "name a file"
    if os.path.isdir(path) or path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        return "names a folder; name a file in it (e.g. results.md)"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist; create it first"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return "cannot be written here; choose a writable place"
    if os.path.exists(path):
        with open(path, errors="replace") as file:
            old = file.read()
        if old.strip() and HAND_WRITTEN not in old:
            return (
                "holds other text, not a report of this command (which keeps the notes below its "
                f"{HAND_WRITTEN[:40]!r}... line): name a new file, or delete this one"
            )
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.compare", *(sys.argv[1:] if argv is None else argv)])
    torch.set_num_threads(args.threads)
    started, load_at_start = datetime.datetime.now().astimezone(), os.getloadavg()
    code = code_version()  # before the run: what it imports

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    by_name = {}
    try:
        for group in task_groups(args.task_list):
            for result in run_group(group, args.suite, args.seeds, args.scale, args.env_seconds, log):
                by_name[result.task.name] = result
    except KeyboardInterrupt:
        done = [name for name in args.task_list if name in by_name]
        log(
            "interrupted: "
            + (f"the report holds the tasks that finished ({', '.join(done)})" if done else "no task had finished")
        )
        if not done:
            raise SystemExit(130) from None
        interrupted = True
    else:
        interrupted = False
    results = [by_name[name] for name in args.task_list if name in by_name]
    not_run = [name for name in args.task_list if name not in by_name]
    report = format_report(results, args, command, started, load_at_start, code, not_run)
    print(report)
    if args.out:
        try:
            write_report(args.out, report)
        except OSError as err:
            log(f"the report was not written to {args.out}: {err}")
            raise SystemExit(1) from None
    if interrupted:
        raise SystemExit(130)


HAND_WRITTEN = "Everything above this line was written by the command. The notes below were added by hand."


def write_report(path: str, report: str) -> None:
    """Write ``report`` to ``path``, keeping what an earlier file had from the :data:`HAND_WRITTEN` line on."""
    notes = f"{HAND_WRITTEN}\n"
    if os.path.exists(path):
        with open(path) as file:
            old = file.read()
        if HAND_WRITTEN in old:
            notes = old[old.index(HAND_WRITTEN) :]
    with open(path, "w") as file:
        file.write(f"{report}\n{notes}")


if __name__ == "__main__":
    main()
