"""Scoring and watching a model from the command line: evaluation, random play, GIF recording."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np

from covey.cli.config import RunConfig
from covey.cli.envs import RandomPolicy, build_env, env_fn
from covey.evaluation import group_episodes
from covey.files import write_atomically


class Evaluator:
    """Mean and std of the return over ``episodes`` episodes, the same episodes at every call.

    PPO/SAC: SB3's ``evaluate_policy`` on its own env copy (returns are the Monitor's, i.e. the env's own
    rewards before any reward wrapper). POCA: ``covey.evaluation.evaluate_group``'s group return, of the env's
    own rewards too (:class:`~covey.wrappers.rewards.OwnRewards`).
    The env is re-seeded with ``seed`` before every evaluation, so evaluations compare like with like.
    ``mean_length`` is the last evaluation's mean episode length (SB3's ``EvalCallback`` logs it).
    """

    def __init__(self, cfg: RunConfig, episodes: int, deterministic: bool, seed: int) -> None:
        self.cfg, self.episodes, self.deterministic, self.seed = cfg, episodes, deterministic, seed
        self.mean_length = float("nan")
        self._venv = None if cfg.is_group else build_env(cfg, n_envs=1)
        self._make = env_fn(cfg, scoring=True) if cfg.is_group else None

    def __call__(self, model: Any) -> tuple[float, float]:
        """``(mean, std)`` of the return; ``model=None`` plays uniformly random actions."""
        if self.cfg.is_group:
            from covey.evaluation import evaluate_group

            result = evaluate_group(model, self._make, self.episodes, self.deterministic, self.seed)
            self.mean_length = float(result["episode_length"])
            return float(result["group_return"]), float(result["group_return_std"])
        from stable_baselines3.common.evaluation import evaluate_policy

        if model is None:
            model = RandomPolicy(self._venv.action_space, self.seed)
        self._venv.seed(self.seed)
        returns, lengths = evaluate_policy(
            model,
            self._venv,
            n_eval_episodes=self.episodes,
            deterministic=self.deterministic,
            warn=False,
            return_episode_rewards=True,
        )
        self.mean_length = float(np.mean(lengths))
        return float(np.mean(returns)), float(np.std(returns))

    def close(self) -> None:
        if self._venv is not None:
            self._venv.close()


def record_gif(
    model: Any,
    cfg: RunConfig,
    out: str | os.PathLike,
    episodes: int = 1,
    deterministic: bool = True,
    seed: int = 0,
    fps: int = 30,
    max_frames: int = 1000,
) -> tuple[pathlib.Path, int, list[float]]:
    """Play ``episodes`` episodes with ``render_mode="rgb_array"`` and write them to a GIF with Pillow.

    Returns the GIF's path, its number of frames and the return of every episode (group return for teams).
    """
    # rgb_array rendering opens no window: pygame-based envs need no display (and stop warning about one).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    make = env_fn(cfg, render_mode="rgb_array", scoring=True)
    frames: list[np.ndarray] = []
    returns: list[float] = []
    env = make()
    try:
        for episode in range(episodes):
            if len(frames) >= max_frames:
                break
            play = _play_group if cfg.is_group else _play_single
            returns.append(play(model, env, seed + episode, deterministic, frames, max_frames))
    finally:
        env.close()
    return _write_gif(frames, out, fps), len(frames), returns


def _frame(env: Any) -> np.ndarray:
    frame = env.render()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3:
        raise ValueError(
            f"The env's render() returned {type(frame).__name__}, not an RGB image: it does not support "
            "render_mode='rgb_array', which GIF recording needs."
        )
    return frame


def _play_single(model, env, seed: int, deterministic: bool, frames: list, max_frames: int) -> float:
    """One episode's return as :class:`Evaluator` counts it: the env's own rewards, which its Monitor reports at
    the episode's end, before any reward wrapper (the wrapped rewards' sum, for an episode cut short)."""
    obs, _ = env.reset(seed=seed)
    frames.append(_frame(env))
    total, done, state, start = 0.0, False, None, np.ones(1, dtype=bool)
    while not done and len(frames) < max_frames:
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=deterministic)
        start = np.zeros(1, dtype=bool)
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        done = terminated or truncated
        frames.append(_frame(env))
    episode = info.get("episode") if done else None
    return float(episode["r"]) if isinstance(episode, dict) and "r" in episode else total


def _play_group(model, env, seed: int, deterministic: bool, frames: list, max_frames: int) -> float:
    """One episode as :func:`covey.evaluation.group_episodes` plays it (a recurrent team carries its memory),
    a frame after the reset and after each step."""

    def record(env) -> bool:
        frames.append(_frame(env))
        return len(frames) < max_frames

    returns, _, _ = group_episodes(model, env, 1, deterministic, seed, on_step=record)
    return returns[0]


def _write_gif(frames: list[np.ndarray], out: str | os.PathLike, fps: int) -> pathlib.Path:
    from PIL import Image

    if not frames:
        raise ValueError("No frames were recorded.")
    out = pathlib.Path(out)
    images = [Image.fromarray(np.asarray(f, dtype=np.uint8)) for f in frames]
    duration = max(int(1000 / max(fps, 1)), 20)
    write_atomically(
        out,
        lambda f: images[0].save(f, format="GIF", save_all=True, append_images=images[1:], duration=duration, loop=0),
    )
    return out
