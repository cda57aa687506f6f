"""GroupEvalCallback: SB3's EvalCallback for POCA teams on PettingZoo envs."""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch
from mpe2 import simple_spread_v3
from stable_baselines3.common.callbacks import BaseCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.logger import configure

from covey import POCA, PPO
from covey.callbacks import GroupEvalCallback
from covey.envs import EarlyExitEnv
from covey.evaluation import evaluate_group, group_episodes

SMALL = dict(n_envs=2, n_steps=16, batch_size=32, seed=0)


def spread():
    return simple_spread_v3.parallel_env(N=3, max_cycles=10)


def test_evaluations_files_logs_and_best_model_are_sb3s(tmp_path):
    torch.set_num_threads(1)
    model = POCA("MlpPolicy", spread, **SMALL)
    model.set_logger(configure(str(tmp_path / "log"), ["csv"]))
    callback = GroupEvalCallback(
        spread,
        eval_freq=8,
        n_eval_episodes=2,
        log_path=str(tmp_path),
        best_model_save_path=str(tmp_path),
        verbose=0,
    )
    model.learn(64, callback=callback)  # 32 calls of 2 env copies: evaluations after calls 8, 16, 24, 32
    saved = np.load(tmp_path / "evaluations.npz")
    np.testing.assert_array_equal(saved["timesteps"], [16, 32, 48, 64])
    assert saved["results"].shape == saved["ep_lengths"].shape == (4, 2)
    assert (saved["ep_lengths"] == 10).all()
    assert len(np.unique(saved["results"])) == 8  # every episode of every evaluation its own
    means = saved["results"].mean(axis=1)
    assert callback.best_mean_reward == pytest.approx(means.max())
    assert callback.last_mean_reward == pytest.approx(means[-1])
    with open(tmp_path / "log" / "progress.csv") as f:
        logged = [float(row["eval/mean_reward"]) for row in csv.DictReader(f) if row["eval/mean_reward"]]
    np.testing.assert_allclose(logged, means, rtol=1e-5)
    # The saved best model is the one evaluated best: replaying that evaluation's episodes (evaluation k is
    # seeded seed + k * n_eval_episodes) gives its returns again.
    best = int(np.argmax(means))
    env = spread()
    returns, _, lengths = group_episodes(POCA.load(tmp_path / "best_model.zip"), env, 2, True, seed=2 * best)
    np.testing.assert_allclose(returns, saved["results"][best], rtol=1e-6)
    np.testing.assert_array_equal(lengths, saved["ep_lengths"][best])


def test_an_evaluations_file_is_never_left_half_written(tmp_path, monkeypatch):
    """A write of evaluations.npz that fails part way (a full disk, training killed) leaves the previous
    evaluations readable and no stray file beside them."""
    callback = GroupEvalCallback(EarlyExitEnv, eval_freq=8, n_eval_episodes=1, log_path=str(tmp_path), verbose=0)
    model = POCA("MlpPolicy", EarlyExitEnv, **SMALL).learn(32, callback=callback)  # one rollout of 2 x 16 steps

    def saved_timesteps():
        with np.load(tmp_path / "evaluations.npz") as saved:
            return saved["timesteps"].tolist()

    assert saved_timesteps() == [16, 32]
    savez = np.savez

    def savez_then_fail(file, **arrays):
        if isinstance(file, str):  # a path, as np.savez takes one: the archive is opened there
            file = open(file if file.endswith(".npz") else file + ".npz", "wb")
        file.write(b"PK\x03\x04 half an archive")
        file.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", savez_then_fail)
    with pytest.raises(OSError, match="No space left"):
        model.learn(16, callback=callback, reset_num_timesteps=False)
    monkeypatch.setattr(np, "savez", savez)
    assert saved_timesteps() == [16, 32]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evaluations.npz"]


def test_a_new_best_callback_stops_training_as_in_sb3():
    stop = StopTrainingOnRewardThreshold(reward_threshold=-1e9, verbose=0)
    callback = GroupEvalCallback(EarlyExitEnv, callback_on_new_best=stop, eval_freq=8, n_eval_episodes=1, verbose=0)
    model = POCA("MlpPolicy", EarlyExitEnv, **SMALL).learn(640, callback=callback)
    assert model.num_timesteps == 16  # stopped at the first evaluation
    assert stop.parent is callback and callback.n_evaluations == 1


class CountingEnv(EarlyExitEnv):
    closed = 0

    def close(self) -> None:
        CountingEnv.closed += 1


def test_an_env_made_from_a_function_is_closed_when_training_ends_and_made_again():
    CountingEnv.closed = 0
    callback = GroupEvalCallback(CountingEnv, eval_freq=8, n_eval_episodes=1, verbose=0)
    model = POCA("MlpPolicy", EarlyExitEnv, **SMALL).learn(32, callback=callback)
    assert CountingEnv.closed == 1 and callback.eval_env is None
    model.learn(32, callback=callback, reset_num_timesteps=False)
    assert CountingEnv.closed == 2 and callback.n_evaluations == 4
    instance = CountingEnv()
    callback = GroupEvalCallback(instance, eval_freq=8, n_eval_episodes=1, verbose=0)
    model.learn(32, callback=callback)
    assert CountingEnv.closed == 2 and callback.eval_env is instance  # the caller's env stays open


def test_what_it_cannot_evaluate_is_refused_clearly():
    with pytest.raises(TypeError, match="not.*name|got the name"):
        GroupEvalCallback("mpe2:simple_spread_v3")
    with pytest.raises(TypeError, match="For PPO and SAC use SB3's EvalCallback"):
        GroupEvalCallback(gym.make("CartPole-v1"))
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, seed=0)
    with pytest.raises(TypeError, match="evaluates POCA teams; this is PPO"):
        model.learn(32, callback=GroupEvalCallback(EarlyExitEnv))


class RenderCountingEnv(EarlyExitEnv):
    renders = 0

    def render(self):
        RenderCountingEnv.renders += 1


def test_it_takes_sb3s_arguments_in_sb3s_order_and_renders_when_asked(tmp_path):
    """Every argument of SB3's EvalCallback, in its positional order (render and warn were missing); render=True
    renders after each reset and step of the evaluation episodes, as SB3's does."""
    import inspect

    from stable_baselines3.common.callbacks import EvalCallback

    theirs = list(inspect.signature(EvalCallback.__init__).parameters)
    ours = list(inspect.signature(GroupEvalCallback.__init__).parameters)
    assert ours[: len(theirs)] == theirs
    RenderCountingEnv.renders = 0
    callback = GroupEvalCallback(RenderCountingEnv, None, None, 2, 8, str(tmp_path), None, True, True, 0, False)
    POCA("MlpPolicy", EarlyExitEnv, **SMALL).learn(16, callback=callback)
    assert (callback.render, callback.verbose, callback.warn) == (True, 0, False)
    lengths = np.load(tmp_path / "evaluations.npz")["ep_lengths"]
    assert lengths.shape == (2, 2) and RenderCountingEnv.renders == lengths.size + lengths.sum() > 0
    callback = GroupEvalCallback(RenderCountingEnv, eval_freq=8, n_eval_episodes=2, verbose=0)
    POCA("MlpPolicy", EarlyExitEnv, **SMALL).learn(16, callback=callback)
    assert RenderCountingEnv.renders == lengths.size + lengths.sum()  # not without render=True


class TimeSteps(BaseCallback):
    """Per rollout, each stored step's time left in the episode (EarlyExitEnv's last observation) for present
    agents, before and after the step (the continuing observation the bootstrap reads)."""

    def _on_training_start(self) -> None:
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        present = buf.present_tensor.numpy()
        before = buf.observations_tensor.numpy()[..., -1][present]
        after = buf.continuing_obs.numpy()[..., -1][present]
        self.rows.append((before, after))


def test_evaluating_on_the_env_instance_training_steps_cuts_its_episode_instead_of_storing_a_step_never_taken():
    """SB3's habit of evaluating on the env object the model trains on: each evaluation plays that env's episodes
    to their end. Training then ends the episode it saw at the step before, truncated, and goes on from a reset:
    every stored step of every agent moves the time on by exactly one step (no row stepped a finished episode,
    or bootstraps from the observation it acted on), and the rollouts after an evaluate_group start afresh."""
    torch.set_num_threads(1)
    env = EarlyExitEnv(episode_length=8)
    tick = 1.0 / env.episode_length
    model = POCA("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0)
    record = TimeSteps()
    evaluations = GroupEvalCallback(env, eval_freq=5, n_eval_episodes=1, verbose=0)
    model.learn(64, callback=[evaluations, record])
    assert evaluations.n_evaluations == 12
    for before, after in record.rows:
        np.testing.assert_allclose(before - after, tick, atol=1e-6)

    evaluate_group(model, env, n_eval_episodes=1)  # after learn, then training goes on
    model.learn(32, callback=record, reset_num_timesteps=False)
    (first, _), *_ = record.rows[-2:]
    np.testing.assert_allclose(first[:3], 1.0)  # the rollout's first step: a new episode's, for every agent
    for before, after in record.rows:
        np.testing.assert_allclose(before - after, tick, atol=1e-6)


class KeepRolloutArrays(BaseCallback):
    """Keeps the rollout buffer's SB3 arrays at each rollout's end without copying them (as notebooks do), and a
    copy of each beside."""

    FIELDS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[dict] = []
        self.copies: list[dict] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf = self.locals["rollout_buffer"]
        self.kept.append({name: getattr(buf, name) for name in self.FIELDS})
        self.copies.append({name: np.copy(getattr(buf, name)) for name in self.FIELDS})


def test_a_rollouts_arrays_kept_by_a_callback_keep_that_rollout():
    """SB3's buffer allocates new arrays for each rollout, so arrays a callback keeps from one rollout still hold
    it after the next ones; covey's did too for the values and returns, but wrote the next rollouts' observations,
    actions and episode starts over the kept ones."""
    callback = KeepRolloutArrays()
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0).learn(96, callback=callback)
    assert len(callback.kept) == 3
    for kept, copied in zip(callback.kept, callback.copies):
        for name in KeepRolloutArrays.FIELDS:
            np.testing.assert_array_equal(kept[name], copied[name], err_msg=name)
    first, last = callback.copies[0], callback.copies[-1]
    assert not np.array_equal(first["observations"], last["observations"])  # the rollouts differ
