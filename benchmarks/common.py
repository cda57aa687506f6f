"""Pieces every benchmark script uses: the envs (made without rendering), the raw stepping speed of an env, the
median-with-spread cell, and the CPU and code a run measured."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

import covey


def unrendered_vec_env(env_id: str, n_envs: int, seed: int, env_kwargs: dict | None = None) -> VecEnv:
    """SB3's ``make_vec_env(env_id, n_envs, seed=seed, env_kwargs=env_kwargs)``, with ``render_mode=None`` unless
    ``env_kwargs`` names one. SB3 makes an env from its id with ``render_mode="rgb_array"``, and under any render
    mode Gymnasium's LunarLander simulates its engines' flames as Box2D bodies that only ``render()`` removes: in
    an episode that is never rendered they pile up with every engine firing, and each step gets slower (``python -m
    benchmarks.lunar_lander_env``). They touch nothing but the ground, so the lander moves the same either way and
    a run's numbers are the same, sooner. No benchmark renders."""
    return make_vec_env(env_id, n_envs, seed=seed, env_kwargs={"render_mode": None, **(env_kwargs or {})})


def random_stepping_speed(venv: VecEnv, env_steps_per_step: int, seconds: float, seed: int = 0) -> float:
    """Env steps per second of ``venv`` stepped with random actions for ``seconds`` (``env_steps_per_step``
    counted per vector step); closes ``venv``."""
    venv.action_space.seed(seed)
    venv.reset()
    steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        venv.step(np.array([venv.action_space.sample() for _ in range(venv.num_envs)]))
        steps += env_steps_per_step
    venv.close()
    return steps / elapsed


def median_range(values: Sequence[float], fmt: str) -> str:
    """``median [min, max]``, or just the value when there is one."""
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return median
    return f"{median} [{format(min(values), fmt)}, {format(max(values), fmt)}]"


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU a run measured: its model name, family and model numbers, whether it has AVX-512 and bfloat16
    products, and the vector code PyTorch chose. Matrix-multiply speed, and with it most of SAC's and POCA's
    time, differs between CPUs that ``os.cpu_count()`` and the platform string do not tell apart.

    ``cpuinfo``: the text of ``/proc/cpuinfo`` (read when left out; elsewhere only PyTorch's choice is known).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as file:
                cpuinfo = file.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    parts = [name]
    if "cpu family" in fields and "model" in fields:
        parts.append(f"family {fields['cpu family']} model {fields['model']}")
    if flags:
        parts.append("AVX-512: " + ("yes" if "avx512f" in flags else "no"))
        parts.append("AVX-512 BF16: " + ("yes" if "avx512_bf16" in flags else "no"))
    parts.append(f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}")
    return ", ".join(parts)


def code_version(root: str | os.PathLike | None = None) -> str:
    """The code a run measured: covey's version and, when ``root`` (the folder that holds the ``covey`` package, by
    default the imported one's) is a git checkout, its commit, with the tracked files that differ from it. A table
    then names its commit without a note by hand, and says so when it ran on changes that no commit holds."""
    root = Path(covey.__file__).resolve().parent.parent if root is None else Path(root).resolve()
    version = f"covey {covey.__version__}"

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    # An installed covey sits in site-packages, which may lie inside some other project's checkout: not its commit.
    if top is None or Path(top.strip()).resolve() != root:
        return f"{version} (not a git checkout)"
    commit = git("rev-parse", "--short=7", "HEAD")
    if commit is None:
        return f"{version} (a git checkout without commits)"
    status = git("status", "--porcelain", "--untracked-files=no")  # lines of "XY path"
    changed = [line[3:] for line in (status or "").splitlines() if line.strip()]
    text = f"{version}, commit `{commit.strip()}`"
    if changed:
        shown = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
        files = "file" if len(changed) == 1 else "files"
        text += f" with uncommitted changes to {len(changed)} tracked {files} ({shown})"
    return text
