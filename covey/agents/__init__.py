"""The agents: one file per algorithm over a small shared base."""

from __future__ import annotations

import importlib
import io
import os
from typing import Any

AGENTS = {"PPO": "covey.agents.ppo", "SAC": "covey.agents.sac", "POCA": "covey.agents.poca"}


def agent_class(name: str) -> type:
    """The agent class for a name such as ``"ppo"`` or ``"POCA"`` (case-insensitive)."""
    key = name.upper()
    if key not in AGENTS:
        raise ValueError(f"Unknown agent {name!r}; choose one of {', '.join(a.lower() for a in AGENTS)}.")
    return getattr(importlib.import_module(AGENTS[key]), key)


def load(path: str | os.PathLike | io.BufferedIOBase, env: Any = None, **kwargs: Any):
    """Load any covey model file with the agent class it was saved from.

    >>> from covey.agents import load
    >>> model = load("ppo_cartpole.zip")  # doctest: +SKIP
    """
    from covey import serialization

    settings = serialization.read_settings(path)
    return agent_class(str(settings.get("agent"))).load(path, env=env, **kwargs)
