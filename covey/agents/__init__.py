"""The agents: one file per algorithm over a small shared base."""

from __future__ import annotations

import importlib
import io
import os
from typing import Any

from covey.requirements import check_versions

check_versions()  # a dependency older than covey runs with: say which, before anything fails on it

AGENTS = {"PPO": "covey.agents.ppo", "SAC": "covey.agents.sac", "POCA": "covey.agents.poca"}


def agent_class(name: str) -> type:
    """The agent class for a name such as ``"ppo"`` or ``"POCA"`` (case-insensitive)."""
    key = name.upper()
    if key not in AGENTS:
        raise ValueError(f"Unknown agent {name!r}; choose one of {', '.join(a.lower() for a in AGENTS)}.")
    return getattr(importlib.import_module(AGENTS[key]), key)


def file_agent(path: str | os.PathLike | io.BufferedIOBase) -> str:
    """The agent a model file holds ("PPO", "SAC" or "POCA"): a covey file's, or a Stable-Baselines3 PPO or SAC
    file's (an SB3 file of another algorithm is refused, naming it)."""
    from covey import sb3_files, serialization

    if sb3_files.is_sb3_file(serialization.zip_entry_names(path)):
        return sb3_files.file_algorithm(path)
    return str(serialization.read_settings(path).get("agent"))


def load(path: str | os.PathLike | io.BufferedIOBase, env: Any = None, **kwargs: Any):
    """Load any covey model file, or a Stable-Baselines3 PPO or SAC file, with the agent class that saved it.

    >>> from covey.agents import load
    >>> model = load("ppo_cartpole.zip")  # doctest: +SKIP
    """
    return agent_class(file_agent(path)).load(path, env=env, **kwargs)
