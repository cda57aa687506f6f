"""Env specs on the command line, and the envs built from them.

- PPO and SAC take a Gymnasium id (``CartPole-v1``, or Gymnasium's ``module:EnvId-v0``); every copy is
  ``gym.make(id, **env_kwargs)`` wrapped in SB3's ``Monitor`` (episode statistics of the env's own
  rewards), then the SuperSuit wrappers.
- POCA takes a PettingZoo env module as ``module:name`` (``mpe2:simple_spread_v3``); every copy is
  ``importlib.import_module(module).<name>.parallel_env(**env_kwargs)``, then the SuperSuit wrappers.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from covey.cli.config import COVEY_WRAPPERS, CLIError, RunConfig

PETTINGZOO_EXAMPLES = "mpe2:simple_spread_v3, pettingzoo.sisl:multiwalker_v9"


def _import(module: str, spec: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise CLIError(
            f"Cannot import module {module!r} for env {spec!r} ({err}). Install the package that provides it "
            '(e.g. `pip install mpe2` or `pip install "pettingzoo[sisl,butterfly]"`), or fix the module name.'
        ) from err


def _pettingzoo_module(spec: str) -> Any | None:
    """The object named by ``module:name`` when it makes PettingZoo envs (has ``parallel_env``), else None."""
    module_name, _, name = spec.partition(":")
    module = _import(module_name, spec)
    try:
        target = getattr(module, name, None)
        if target is None:
            target = importlib.import_module(f"{module_name}.{name}")
    except (ImportError, AssertionError) as err:
        # PettingZoo's packages import an env module on attribute access: a name the package lacks raises there
        # (an ImportError or, before 1.27, an AssertionError); an env module that is there may fail on a
        # dependency of its own, which the user installs
        if not _has_submodule(module_name, name):
            return None
        raise CLIError(
            f"Cannot import {module_name}.{name} for env {spec!r} ({type(err).__name__}: {err}). Install what it "
            'needs (e.g. `pip install "pettingzoo[sisl,butterfly]"` for PettingZoo\'s families).'
        ) from err
    return target if callable(getattr(target, "parallel_env", None)) else None


def _has_submodule(module_name: str, name: str) -> bool:
    """Whether the package ``module_name`` has a module ``name``, found without importing it."""
    try:
        return importlib.util.find_spec(f"{module_name}.{name}") is not None
    except (ImportError, ValueError):
        return False


def parallel_env_factory(spec: str) -> Callable[..., Any]:
    """``parallel_env`` of the PettingZoo env module named ``module:name``; clear errors otherwise."""
    if ":" not in spec:
        if _is_gym_id(spec):
            raise CLIError(
                f"{spec!r} is a Gymnasium env id, but POCA trains a team in a PettingZoo env. Use ppo or sac for "
                f"Gymnasium envs, or give a PettingZoo env as module:name (e.g. {PETTINGZOO_EXAMPLES})."
            )
        raise CLIError(f"POCA needs a PettingZoo env written module:name (e.g. {PETTINGZOO_EXAMPLES}), got {spec!r}.")
    target = _pettingzoo_module(spec)
    if target is None:
        module_name, _, name = spec.partition(":")
        raise CLIError(
            f"{spec!r} is not a PettingZoo env: {module_name}.{name} has no parallel_env(). "
            f"Name an env module, e.g. {PETTINGZOO_EXAMPLES}."
        )
    return target.parallel_env


def _is_gym_id(spec: str) -> bool:
    import gymnasium as gym

    try:
        gym.spec(spec)
    except gym.error.Error:
        return False
    return True


def check_gym_spec(spec: str, agent: str) -> None:
    """Refuse a PettingZoo env given to a single-agent algorithm (other problems surface in gym.make)."""
    if ":" not in spec:
        return
    try:
        target = _pettingzoo_module(spec)
    except CLIError:  # a module that does not import: gym.make's error names it (_import's hint is PettingZoo's)
        return
    if target is not None:
        raise CLIError(
            f"{spec!r} is a PettingZoo multi-agent env, but {agent} trains one agent in a Gymnasium env. "
            f"Train the team with POCA (covey train poca --env {spec}), or give a Gymnasium id such as CartPole-v1."
        )


def apply_wrappers(env: Any, wrappers: list[dict[str, Any]]) -> Any:
    """SuperSuit wrappers (they accept Gymnasium envs and PettingZoo envs alike) and covey's, in order."""
    if not wrappers:
        return env
    import supersuit

    import covey.wrappers

    for item in wrappers:
        module = covey.wrappers if item["name"] in COVEY_WRAPPERS else supersuit
        try:
            env = getattr(module, item["name"])(env, **item["kwargs"])
        except (TypeError, ValueError, AssertionError) as err:
            raise CLIError(f"Wrapper {item['name']} with kwargs {item['kwargs']} failed: {err}") from err
    return env


def gym_env_fn(spec: str, env_kwargs: dict, wrappers: list[dict], render_mode: str | None = None) -> Callable[[], Any]:
    """A function making one monitored, wrapped Gymnasium env."""
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    def make() -> Any:
        kwargs = dict(env_kwargs)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        try:
            env = gym.make(spec, **kwargs)
        except gym.error.Error as err:
            raise CLIError(f"Cannot make the Gymnasium env {spec!r}: {err}") from err
        except ModuleNotFoundError as err:  # module:EnvId whose module is not installed
            raise CLIError(f"Cannot make the Gymnasium env {spec!r}: {err}") from err
        except TypeError as err:
            raise CLIError(f"env_kwargs {env_kwargs} do not fit {spec!r}: {err}") from err
        return apply_wrappers(Monitor(env), wrappers)

    return make


def group_env_fn(
    spec: str, env_kwargs: dict, wrappers: list[dict], render_mode: str | None = None, scoring: bool = False
) -> Callable[[], Any]:
    """A function making one wrapped PettingZoo parallel env. ``scoring``: one whose steps report the env's own
    rewards, before the wrappers change them (:class:`~covey.wrappers.rewards.OwnRewards`), as a Gymnasium env's
    Monitor reports them."""
    factory = parallel_env_factory(spec)

    def make() -> Any:
        kwargs = dict(env_kwargs)
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        try:
            env = factory(**kwargs)
        except TypeError as err:
            raise CLIError(f"env_kwargs {env_kwargs} do not fit {spec!r}: {err}") from err
        if not scoring or not wrappers:
            return apply_wrappers(env, wrappers)
        from covey.wrappers.rewards import OwnRewards, RewardTap

        tap = RewardTap(env)
        return OwnRewards(apply_wrappers(tap, wrappers), tap)

    return make


def env_fn(cfg: RunConfig, render_mode: str | None = None, scoring: bool = False) -> Callable[[], Any]:
    """One env copy of the run (Gymnasium or PettingZoo, by agent); ``scoring``: a copy for evaluations, whose
    returns are the env's own rewards (a Gymnasium copy's Monitor counts them in any copy)."""
    if cfg.is_group:
        return group_env_fn(cfg.env, cfg.env_kwargs, cfg.wrappers, render_mode, scoring)
    check_gym_spec(cfg.env, cfg.agent)
    return gym_env_fn(cfg.env, cfg.env_kwargs, cfg.wrappers, render_mode)


def build_env(cfg: RunConfig, n_envs: int | None = None, seed: int | None = None) -> Any:
    """The run's training env: an SB3 VecEnv (ppo, sac) or a covey GroupVecEnv (poca) of ``n_envs`` copies."""
    n_envs = cfg.n_envs if n_envs is None else n_envs
    make = env_fn(cfg)
    if cfg.is_group:
        from covey.wrappers.group_env import MixedSpacesError, SubprocGroupVecEnv, make_group_env

        n_processes = min(cfg.n_processes, n_envs)
        try:  # the group's spaces are checked here, as an SB3 VecEnv's are in the agent's constructor
            if n_processes > 1:
                return SubprocGroupVecEnv([make] * n_envs, n_processes=n_processes)
            return make_group_env(make, n_envs)
        except MixedSpacesError as err:
            import yaml

            # the config's own wrappers first, as they are: the fix goes around them
            kept = [yaml.safe_dump(dict(w), default_flow_style=True, sort_keys=False).strip() for w in cfg.wrappers]
            listed = ", ".join([*kept, *(f"{{name: {name}}}" for name in err.wrappers)])
            side = ", ".join([*kept, f"{{name: one_side, kwargs: {{team: {err.side}}}}}"])
            one_side = "" if err.side is None else f"; for one side, whose opponents act at random: wrappers: [{side}]"
            raise CLIError(
                f"env {cfg.env}: {err} In a run's config, for one team: wrappers: [{listed}] (or --set "
                f"'wrappers=[{listed}]'){one_side}."
            ) from err
        except (ValueError, NotImplementedError) as err:
            raise CLIError(f"env {cfg.env}: {err}") from err
    from covey.wrappers.vec_env import FastVecEnv

    venv = FastVecEnv([make] * n_envs)
    if seed is not None:
        venv.seed(seed)
    return venv


class RandomPolicy:
    """Uniformly random actions with ``predict``'s signature, to score random play with evaluate_policy."""

    def __init__(self, action_space: Any, seed: int = 0) -> None:
        self.action_space = action_space
        self.action_space.seed(seed)

    def predict(self, observation: Any, state=None, episode_start=None, deterministic: bool = False):
        import numpy as np

        n = len(episode_start) if episode_start is not None else 1
        return np.stack([self.action_space.sample() for _ in range(n)]), state
