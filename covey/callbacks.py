"""Callbacks for POCA's PettingZoo teams, in the shape of SB3's.

SB3's ``EvalCallback`` wraps its env in a ``DummyVecEnv``, which a PettingZoo env cannot go into.
:class:`GroupEvalCallback` is its counterpart for POCA: the same arguments, files, log keys and hooks, with the
episodes played by :func:`covey.evaluation.group_episodes`.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback, EventCallback

from covey.evaluation import group_episodes
from covey.files import write_atomically
from covey.wrappers.group_env import is_aec_env, is_env_maker, is_parallel_env, make_one_env


class GroupEvalCallback(EventCallback):
    """Evaluate a POCA team every ``eval_freq`` calls (steps of the vectorized env, as SB3 counts them) on
    ``n_eval_episodes`` episodes of ``eval_env``, a PettingZoo env (ParallelEnv or AEC) or a function making
    one (then made here once and closed when training ends).

    As SB3's ``EvalCallback``: ``eval/mean_reward`` and ``eval/mean_ep_length`` are logged and written with the
    step; ``log_path`` gets ``evaluations.npz`` (``timesteps``, ``results``, ``ep_lengths``; rewritten
    atomically after each evaluation);
    ``best_model_save_path`` gets ``best_model.zip`` on each new best; ``callback_on_new_best`` (e.g.
    ``StopTrainingOnRewardThreshold``) and ``callback_after_eval`` (e.g. ``StopTrainingOnNoModelImprovement``)
    are called as there, and ``best_mean_reward`` / ``last_mean_reward`` are kept.

    ``render=True`` renders the eval env after its reset and every step (make it with a ``render_mode``), as SB3's
    does; ``warn`` is taken for SB3's signature and has nothing to warn about here (SB3's warns of an eval env
    without a ``Monitor``, which PettingZoo envs do not take).

    The reward of an episode is the group return, the sum of every agent's rewards; ``eval/mean_agent_reward``
    logs the per-agent return beside it (the group return over the agents that took part). Evaluation ``k``
    (from 0) resets its episodes with seeds ``seed + k * n_eval_episodes + i``: every evaluation sees new
    episodes and a run is reproducible.

    >>> from covey.envs import EarlyExitEnv
    >>> callback = GroupEvalCallback(EarlyExitEnv, eval_freq=100, n_eval_episodes=2)
    """

    def __init__(
        self,
        eval_env: Any,
        callback_on_new_best: BaseCallback | None = None,
        callback_after_eval: BaseCallback | None = None,
        n_eval_episodes: int = 5,
        eval_freq: int = 10000,
        log_path: str | None = None,
        best_model_save_path: str | None = None,
        deterministic: bool = True,
        render: bool = False,
        verbose: int = 1,
        warn: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(callback_after_eval, verbose=verbose)
        if isinstance(eval_env, str):
            raise TypeError(
                f"GroupEvalCallback got the name {eval_env!r}; pass a PettingZoo env or a function making one, "
                "e.g. GroupEvalCallback(lambda: simple_spread_v3.parallel_env())."
            )
        if not is_env_maker(eval_env) and not is_parallel_env(eval_env) and not is_aec_env(eval_env):
            raise TypeError(
                f"GroupEvalCallback evaluates POCA on a PettingZoo env (or a function making one), got "
                f"{type(eval_env).__name__}. For PPO and SAC use SB3's EvalCallback."
            )
        self.callback_on_new_best = callback_on_new_best
        if callback_on_new_best is not None:
            callback_on_new_best.parent = self  # SB3's StopTrainingOnRewardThreshold reads its parent
        self._env_source = eval_env  # an env, or a function making one when training starts
        self.eval_env: Any = None
        self._owns_env = False
        self.n_eval_episodes, self.eval_freq = n_eval_episodes, eval_freq
        self.deterministic, self.render, self.warn, self.seed = deterministic, render, warn, seed
        self.best_model_save_path = best_model_save_path
        self.log_path = os.path.join(log_path, "evaluations") if log_path is not None else None
        self.best_mean_reward = -np.inf
        self.last_mean_reward = -np.inf
        self.evaluations_timesteps: list[int] = []
        self.evaluations_results: list[list[float]] = []
        self.evaluations_length: list[list[int]] = []
        self.n_evaluations = 0

    def _init_callback(self) -> None:
        from covey.agents.poca import POCA

        if not isinstance(self.model, POCA):
            raise TypeError(
                f"GroupEvalCallback evaluates POCA teams; this is {type(self.model).__name__}. Use SB3's "
                "stable_baselines3.common.callbacks.EvalCallback for PPO and SAC."
            )
        if self.eval_env is None:
            self.eval_env, self._owns_env = make_one_env(self._env_source)
        for path in (self.best_model_save_path, self.log_path and os.path.dirname(self.log_path)):
            if path:
                os.makedirs(path, exist_ok=True)
        if self.callback_on_new_best is not None:
            self.callback_on_new_best.init_callback(self.model)

    def _on_step(self) -> bool:
        if self.eval_freq <= 0 or self.n_calls % self.eval_freq != 0:
            return True
        seed = self.seed + self.n_evaluations * self.n_eval_episodes
        rewards, agent_rewards, lengths = group_episodes(
            self.model, self.eval_env, self.n_eval_episodes, self.deterministic, seed, _render if self.render else None
        )
        self.n_evaluations += 1
        if self.log_path is not None:
            self.evaluations_timesteps.append(self.num_timesteps)
            self.evaluations_results.append(rewards)
            self.evaluations_length.append(lengths)
            arrays = {
                "timesteps": self.evaluations_timesteps,
                "results": self.evaluations_results,
                "ep_lengths": self.evaluations_length,
            }
            # atomically: training stopped mid-write leaves the previous evaluations, not a truncated archive
            write_atomically(pathlib.Path(self.log_path + ".npz"), lambda f: np.savez(f, **arrays))
        mean_reward, mean_length = float(np.mean(rewards)), float(np.mean(lengths))
        self.last_mean_reward = mean_reward
        if self.verbose >= 1:
            print(
                f"Eval num_timesteps={self.num_timesteps}, episode_reward={mean_reward:.2f} +/- {np.std(rewards):.2f}"
            )
            print(f"Episode length: {mean_length:.2f} +/- {np.std(lengths):.2f}")
        self.logger.record("eval/mean_reward", mean_reward)
        self.logger.record("eval/mean_agent_reward", float(np.mean(agent_rewards)))
        self.logger.record("eval/mean_ep_length", mean_length)
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(self.num_timesteps)
        continue_training = True
        if mean_reward > self.best_mean_reward:
            if self.verbose >= 1:
                print("New best mean reward!")
            if self.best_model_save_path is not None:
                self.model.save(os.path.join(self.best_model_save_path, "best_model"))
            self.best_mean_reward = mean_reward
            if self.callback_on_new_best is not None:
                continue_training = self.callback_on_new_best.on_step()
        if self.callback is not None:
            continue_training = continue_training and self._on_event()
        return continue_training

    def _on_training_end(self) -> None:
        if self._owns_env:  # made here: closed, and made again if training goes on with another learn()
            self.eval_env.close()
            self.eval_env, self._owns_env = None, False


def _render(env: Any) -> bool:
    """:func:`group_episodes`' ``on_step`` for ``render=True``: render, and go on with the episode."""
    env.render()
    return True
