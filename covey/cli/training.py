"""``covey train``: one run folder per run, with logs, evaluations, checkpoints, resume, Ctrl-C and SIGTERM.

A run folder::

    config.yaml          the resolved config (what --resume reads back)
    progress.csv         SB3's CSV logger (one row per log dump; appended to on resume)
    events.out.tfevents.*  TensorBoard (when tensorboard is installed)
    evaluations.csv      timesteps,mean_return,std_return (one row per evaluation)
    checkpoints/         step_<N>.zip + step_<N>.json (+ step_<N>.replay.npz for SAC), best_model.zip
    model.zip            the final model
    curve.png            the learning curve

A checkpoint is the model file (networks *and* optimizer state, ``num_timesteps``) plus a JSON file with
the random number generator states (Python, NumPy, torch, the action space's), the recent episode
statistics, the best evaluation so far and the episode counter; SAC adds its replay buffer (plain arrays;
kept for the latest checkpoint only). Nothing is pickled: loading a checkpoint never runs code.
Not restored: the envs' internal state (episodes restart from a reset, seeded from the step count) and
an on-policy rollout in progress (checkpoints are taken between updates, so none is ever half-used; only a
second Ctrl-C saves the model wherever it stopped, its unfinished rollout's steps counted but not trained on).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import pathlib
import random
import re
import signal
import sys
import threading
import time
import zipfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import yaml
from stable_baselines3.common.callbacks import BaseCallback

from covey.cli.config import (
    RESUME_OVERRIDABLE,
    CLIError,
    RunConfig,
    agent_kwargs,
    load_yaml_file,
    schedule_objects,
)
from covey.cli.envs import build_env
from covey.cli.evaluation import Evaluator
from covey.files import write_text_atomically
from covey.serialization import ModelFileError
from covey.wrappers.group_env import WorkerLost

STATE_FORMAT = 1
EVALUATIONS_HEADER = "timesteps,mean_return,std_return\n"


# ---------------------------------------------------------------------------- the run folder
class RunFolder:
    """Paths of one run folder."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = pathlib.Path(path)

    config = property(lambda self: self.path / "config.yaml")
    progress = property(lambda self: self.path / "progress.csv")
    evaluations = property(lambda self: self.path / "evaluations.csv")
    checkpoints = property(lambda self: self.path / "checkpoints")
    model = property(lambda self: self.path / "model.zip")
    best_model = property(lambda self: self.path / "checkpoints" / "best_model.zip")
    curve = property(lambda self: self.path / "curve.png")

    def is_run(self) -> bool:
        return self.config.is_file()

    def checkpoint_steps(self) -> list[int]:
        """Steps of the complete checkpoints (model and state written), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        steps = []
        for path in self.checkpoints.glob("step_*.json"):
            match = re.fullmatch(r"step_(\d+)\.json", path.name)
            if match and (self.checkpoints / f"step_{match.group(1)}.zip").is_file():
                steps.append(int(match.group(1)))
        return sorted(steps)

    def checkpoint(self, step: int) -> tuple[pathlib.Path, pathlib.Path]:
        """``(model file, state file)`` of the checkpoint at ``step``."""
        return self.checkpoints / f"step_{step}.zip", self.checkpoints / f"step_{step}.json"

    def latest_model(self) -> pathlib.Path:
        """The final model, or the latest checkpoint where it is further on (a finished run extended by a resume
        that was stopped) or where there is no final model yet (an unfinished run)."""
        steps = self.checkpoint_steps()
        if self.model.is_file():
            if not steps or steps[-1] <= _model_steps(self.model):
                return self.model
        if steps:
            return self.checkpoint(steps[-1])[0]
        raise CLIError(f"{self.path} holds no model.zip and no checkpoint yet.")


def _model_steps(path: pathlib.Path) -> int:
    """The env steps a model file was trained for (its settings' ``num_timesteps``)."""
    from covey import serialization

    try:
        return int(serialization.read_settings(path).get("num_timesteps", 0))
    except Exception:  # a file that cannot be read is no further on than any checkpoint
        return -1


def new_run_dir(cfg: RunConfig) -> pathlib.Path:
    """``runs/<agent>-<env>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``, ... when that exists)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.split(":")[-1])
    base = pathlib.Path("runs") / f"{cfg.agent}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def truncate_csv(path: pathlib.Path, key: str, last_step: int) -> None:
    """Drop the rows of a CSV log written after ``last_step`` (a run resumed from an older checkpoint)."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or key not in rows[0]:
        return
    column = rows[0].index(key)

    def keep(row: list[str]) -> bool:
        try:
            return float(row[column]) <= last_step
        except (IndexError, ValueError):
            return True

    kept = [rows[0]] + [row for row in rows[1:] if keep(row)]
    if len(kept) < len(rows):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows(kept)
        write_text_atomically(path, buffer.getvalue())


# ---------------------------------------------------------------------------- RNG states (JSON, no pickle)
def rng_state(model: Any) -> dict[str, Any]:
    """Python, NumPy (global), torch and action-space generator states as JSON-friendly data."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    space = getattr(model, "action_space", None)
    if space is not None:
        state["action_space"] = space.np_random.bit_generator.state
    return state


def set_rng_state(model: Any, state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["torch_cuda"]])
    space = getattr(model, "action_space", None)
    if space is not None and "action_space" in state:
        space.np_random.bit_generator.state = state["action_space"]


def _next_multiple(step: int, freq: int) -> int:
    """The first multiple of ``freq`` after ``step``: when an evaluation or a checkpoint is next due."""
    return (int(step) // freq + 1) * freq


# ---------------------------------------------------------------------------- Ctrl-C and SIGTERM
class Interrupt:
    """The first Ctrl-C (or SIGTERM, as a cluster's scheduler sends before it stops a job) asks training to stop at
    the next consistent point (between updates, where a checkpoint is saved); a second one stops at once
    (KeyboardInterrupt), and the model is saved as it stands. ``exit_code``: 130 after Ctrl-C, 143 after SIGTERM."""

    SIGNALS = {signal.SIGINT: ("Ctrl-C", 130), signal.SIGTERM: ("SIGTERM", 143)}

    def __init__(self) -> None:
        self.requested = False
        self.exit_code = 130
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name, self.exit_code = self.SIGNALS[signum]
        print(
            f"\ncovey: {name}: saving a checkpoint after the current update (Ctrl-C or SIGTERM again to stop at once "
            "and save the model as it stands)...",
            file=sys.stderr,
            flush=True,
        )


# ---------------------------------------------------------------------------- one run
@dataclass
class Run:
    """A run in progress: its folder, config, evaluator and what its callbacks share."""

    folder: RunFolder
    cfg: RunConfig
    evaluator: Evaluator | None
    interrupt: Interrupt
    desc: str = ""
    best_mean_return: float = -math.inf
    last_eval: tuple[int, float, float] | None = None
    last_checkpoint_step: int | None = None

    def evaluate(self, model: Any) -> tuple[float, float]:
        mean, std = self.evaluator(model)
        step = int(model.num_timesteps)
        self.last_eval = (step, mean, std)
        with open(self.folder.evaluations, "a") as f:
            f.write(f"{step},{mean!r},{std!r}\n")
        if mean > self.best_mean_return:
            self.best_mean_return = mean
            self.folder.checkpoints.mkdir(exist_ok=True)
            model.save(self.folder.best_model)
        return mean, std

    def save_checkpoint(self, model: Any) -> pathlib.Path:
        """Model (with optimizer state), SAC's replay buffer, then the state file that completes it."""
        step = int(model.num_timesteps)
        self.folder.checkpoints.mkdir(exist_ok=True)
        model_path, state_path = self.folder.checkpoint(step)
        model.save(model_path)
        replay = None
        if getattr(model, "replay_buffer", None) is not None:
            replay = self.folder.checkpoints / f"step_{step}.replay.npz"
            model.save_replay_buffer(replay)
        state = {
            "format": STATE_FORMAT,
            "num_timesteps": step,
            "episode_num": int(getattr(model, "_episode_num", 0)),
            "ep_info_buffer": [{k: float(v) for k, v in ep.items()} for ep in model.ep_info_buffer],
            "best_mean_return": None if math.isinf(self.best_mean_return) else self.best_mean_return,
            "replay_buffer": replay.name if replay is not None else None,
            "rng": rng_state(model),
        }
        write_text_atomically(state_path, json.dumps(state))
        if replay is not None:
            # Only the latest checkpoint keeps the (possibly large) replay buffer.
            for old in self.folder.checkpoints.glob("step_*.replay.npz"):
                if old != replay:
                    old.unlink()
        self.last_checkpoint_step = step
        return model_path


class ProgressCallback(BaseCallback):
    """A tqdm bar over the run's whole budget: steps/s, ETA, latest mean episode return and evaluation."""

    def __init__(self, run: Run, total: int) -> None:
        super().__init__()
        self.run, self.total = run, total
        self.bar: Any = None
        self._last = 0.0

    def _on_training_start(self) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=self.total,
            initial=int(self.model.num_timesteps),
            desc=self.run.desc or None,
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            file=sys.stderr,
            smoothing=0.05,
        )

    def _on_step(self) -> bool:
        now = time.monotonic()
        if now - self._last >= 0.25:
            self._last = now
            self._refresh()
        return True

    def _refresh(self) -> None:
        bar, model = self.bar, self.model
        bar.update(int(model.num_timesteps) - bar.n)
        postfix = {}
        if model.ep_info_buffer:
            postfix["return"] = f"{np.mean([ep['r'] for ep in model.ep_info_buffer]):.4g}"
        if self.run.last_eval is not None:
            postfix["eval"] = f"{self.run.last_eval[1]:.4g}"
        if postfix:
            bar.set_postfix(postfix, refresh=False)

    def _on_training_end(self) -> None:
        if self.bar is not None:
            self._refresh()
            self.bar.close()


def evaluate_and_log(run: Run, model: Any) -> None:
    """Evaluate ``model`` (a row of evaluations.csv, the best model) and log the result in a row of its own."""
    mean, std = run.evaluate(model)
    step = int(model.num_timesteps)
    # A row of the evaluation's own: what training has recorded since the last row (the update's train/*)
    # is held back for the next regular row, so no curve gets two points at one step.
    logger = model.logger
    held = [dict(d) for d in (logger.name_to_value, logger.name_to_count, logger.name_to_excluded)]
    for d in (logger.name_to_value, logger.name_to_count, logger.name_to_excluded):
        d.clear()
    logger.record("eval/mean_reward", mean)
    logger.record("eval/std_reward", std)
    logger.record("eval/mean_ep_length", run.evaluator.mean_length)  # as SB3's EvalCallback
    logger.record("time/total_timesteps", step, exclude="tensorboard")
    logger.dump(step=step)
    for d, values in zip((logger.name_to_value, logger.name_to_count, logger.name_to_excluded), held):
        d.update(values)


class EvaluationCallback(BaseCallback):
    """Evaluate every ``eval_freq`` env steps and at the end; rows go to evaluations.csv, values to the logger
    (``eval/mean_reward``, ``eval/std_reward``, ``eval/mean_ep_length``, written in a log row of the evaluation's
    step, as SB3's ``EvalCallback`` writes them), the best model to ``checkpoints/best_model.zip``.

    It acts at the start of a rollout, after the last update: the model evaluated at step N is the one
    trained on exactly N env steps.
    """

    def __init__(self, run: Run, total: int) -> None:
        super().__init__()
        self.run, self.total = run, total
        self.next = math.inf

    def _on_training_start(self) -> None:
        freq = self.run.cfg.eval_freq
        if freq > 0:
            self.next = _next_multiple(self.model.num_timesteps, freq)

    def _on_rollout_start(self) -> None:
        if self.model.num_timesteps >= self.next:
            self._evaluate()
            freq = self.run.cfg.eval_freq
            self.next = _next_multiple(self.model.num_timesteps, freq)

    def _on_step(self) -> bool:
        return True

    def _evaluate(self) -> None:
        evaluate_and_log(self.run, self.model)

    def _on_training_end(self) -> None:
        done = self.model.num_timesteps >= self.total
        last = self.run.last_eval[0] if self.run.last_eval else None
        if done and last != self.model.num_timesteps:
            self._evaluate()


class CheckpointCallback(BaseCallback):
    """Save a checkpoint every ``checkpoint_freq`` env steps, and on Ctrl-C, then stop.

    It acts at the start of a rollout: the last update is complete and no collected data is pending
    (for SAC, every transition so far is in the replay buffer), so a checkpoint resumes exactly there.
    """

    def __init__(self, run: Run) -> None:
        super().__init__()
        self.run = run
        self.next = math.inf
        self.stop = False

    def _on_training_start(self) -> None:
        freq = self.run.cfg.checkpoint_freq
        if freq > 0:
            self.next = _next_multiple(self.model.num_timesteps, freq)

    def _on_rollout_start(self) -> None:
        step = int(self.model.num_timesteps)
        if self.run.interrupt.requested:
            if self.run.last_checkpoint_step != step:
                self.run.save_checkpoint(self.model)
            self.stop = True
        elif step >= self.next:
            self.run.save_checkpoint(self.model)
            freq = self.run.cfg.checkpoint_freq
            self.next = _next_multiple(step, freq)

    def _on_step(self) -> bool:
        return not self.stop


def make_logger(folder: RunFolder, append: bool) -> Any:
    """SB3's logger writing progress.csv (and TensorBoard events when tensorboard is installed).

    SB3's CSV writer truncates its file; to append on resume it is handed the previous rows and header.
    """
    from stable_baselines3.common.logger import CSVOutputFormat, configure

    previous = folder.progress.read_text() if append and folder.progress.is_file() else ""
    formats = ["csv"]
    try:
        import tensorboard  # noqa: F401

        formats.append("tensorboard")
    except ImportError:
        print("covey: tensorboard is not installed; logging progress.csv only.", file=sys.stderr)
    logger = configure(str(folder.path), formats)
    if previous.strip():
        for output in logger.output_formats:
            if isinstance(output, CSVOutputFormat):
                output.file.write(previous if previous.endswith("\n") else previous + "\n")
                output.file.flush()
                output.keys = next(csv.reader([previous.splitlines()[0]]))
    return logger


def draw_curve(folder: RunFolder) -> pathlib.Path | None:
    """curve.png of the run (covey.plotting.plot_run); a failure is reported, never fatal. A run stopped before
    its first log row has nothing to draw yet: no picture, and nothing said."""
    if not folder.progress.is_file() or len(folder.progress.read_text().splitlines()) < 2:
        return None
    try:
        from covey.plotting import plot_run

        return pathlib.Path(plot_run(folder.path))
    except Exception as err:  # the run's model and logs are saved already: a missing picture must not cost them
        print(f"covey: could not draw {folder.curve}: {type(err).__name__}: {err}", file=sys.stderr)
        return None


# ---------------------------------------------------------------------------- train and resume
def build_agent(cfg: RunConfig, env: Any) -> Any:
    """The agent for ``cfg`` on ``env``; its constructor checks every value (errors name the field)."""
    from covey.agents import agent_class

    cls = agent_class(cfg.agent)
    kwargs = agent_kwargs(cfg)
    if cfg.is_group:
        kwargs["n_envs"] = cfg.n_envs
    try:
        return cls(cfg.policy, env, seed=cfg.seed, **kwargs)
    except (ValueError, TypeError, NotImplementedError) as err:
        raise CLIError(f"{cfg.agent} config: {err}") from err


def prepare(cfg: RunConfig) -> tuple[Any, Any]:
    """Check everything that can be checked before training: the env and the agent (built, not trained)."""
    if cfg.seed is None:
        cfg.seed = int(np.random.SeedSequence().entropy % (2**31))
    torch.set_num_threads(cfg.torch_threads)
    env = build_env(cfg, seed=cfg.seed)
    model = build_agent(cfg, env)
    return env, model


def start(cfg: RunConfig, run_dir: str | os.PathLike | None = None, desc: str = "", quiet: bool = False) -> int:
    """Check the config, build the agent, create the run folder and train. Returns the exit code."""
    if run_dir is not None and not str(run_dir).strip():
        raise CLIError(
            "--run-dir is empty (an unset shell variable?), which would train into the current folder: give a "
            "folder, or leave the flag out for runs/<agent>-<env>-<time>."
        )
    env, model = prepare(cfg)
    path = pathlib.Path(run_dir) if run_dir is not None else new_run_dir(cfg)
    if path.exists() and not path.is_dir():
        raise CLIError(f"--run-dir {path} is a file, not a folder: choose a folder for the run (it is created).")
    folder = RunFolder(path)
    if folder.is_run() or folder.model.exists():
        if folder.is_run() and folder.checkpoint_steps():  # what resume() continues from
            raise CLIError(
                f"{path} already holds a run. Continue it with `covey train --resume {path}`, or choose another "
                "--run-dir."
            )
        if not folder.is_run():
            held = "a model.zip but no run (no config.yaml)"
        elif folder.model.exists():
            held = "a run with no checkpoint to resume from"
        else:
            held = "a run that stopped before its first checkpoint"
        raise CLIError(
            f"{path} already holds {held}, so it cannot be resumed. Remove the folder to start it over, or choose "
            "another --run-dir."
        )
    rollout = _rollout_steps(model, cfg)
    if cfg.timesteps < rollout:
        print(
            f"covey: warning: timesteps={cfg.timesteps:,} is less than one rollout (n_steps={model.n_steps:,} x "
            f"{model.env.num_envs} env{'s' * (model.env.num_envs > 1)}): training runs whole rollouts, so this run "
            f"trains {rollout:,} steps.",
            file=sys.stderr,
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CLIError(f"--run-dir {path} cannot be created ({err.strerror}): choose a folder that can be.") from err
    folder.config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    if not quiet:
        print(
            f"covey: training {cfg.agent.upper()} on {cfg.env} ({cfg.n_envs} env{'s' * (cfg.n_envs > 1)}) for "
            f"{cfg.timesteps:,} steps -> {path}",
            file=sys.stderr,
        )
    return _train(model, cfg, folder, state=None, desc=desc, quiet=quiet)


def load_run_config(folder: RunFolder, sets: list[str] | None = None) -> RunConfig:
    """A run folder's config.yaml, with the ``--set`` changes a resume allows."""
    from covey.cli.config import apply_sets

    if not folder.path.exists():
        raise CLIError(f"{folder.path} does not exist: give the run folder that covey train wrote (its --run-dir).")
    if not folder.is_run():
        inside = sorted(p for p in folder.path.glob("*/config.yaml")) if folder.path.is_dir() else []
        runs = f"; the run folders in it: {', '.join(str(p.parent) for p in inside)}" if inside else ""
        raise CLIError(f"{folder.path} is not a run folder (it has no config.yaml){runs}.")
    raw = load_yaml_file(folder.config)
    sets = list(sets or [])
    for item in sets:
        key = item.split("=", 1)[0].strip()
        if key not in RESUME_OVERRIDABLE:
            raise CLIError(
                f"--set {key}: a resumed run keeps its config; only {', '.join(RESUME_OVERRIDABLE)} may change "
                "(start a new run to change the rest)."
            )
    return RunConfig.from_dict(apply_sets(raw, sets))


def resume(run_dir: str | os.PathLike, sets: list[str] | None = None, quiet: bool = False) -> int:
    """Continue a run from its latest checkpoint: same config, the step count and the logs go on."""
    folder = RunFolder(run_dir)
    cfg = load_run_config(folder, sets)
    steps = folder.checkpoint_steps()
    if not steps:
        raise CLIError(
            f"{folder.path} has no checkpoint to resume from (checkpoints/step_<N>.zip with its .json): the run "
            "stopped before its first. Start it over: remove the folder, or give `covey train` another --run-dir."
        )
    model_path, state_path = folder.checkpoint(steps[-1])
    sac = cfg.agent == "sac"
    with _damaged(folder, steps, state_path, sac, (ValueError, KeyError, TypeError)):  # (JSONDecodeError: a ValueError)
        state = json.loads(state_path.read_text())
        int(state["num_timesteps"]), state["rng"]
    torch.set_num_threads(cfg.torch_threads)
    start_step = int(state["num_timesteps"])
    budget_given = any(item.split("=", 1)[0].strip() == "timesteps" for item in sets or [])
    if budget_given and cfg.timesteps < start_step:  # before anything is written: the run keeps its budget
        raise CLIError(
            f"{folder.path} is already at step {start_step:,}, past timesteps={cfg.timesteps:,}: give a larger "
            "budget to extend it (--timesteps), or leave it out to finish the run's own."
        )
    env = build_env(cfg, seed=cfg.seed)
    from covey.agents import agent_class

    device = cfg.hyperparameters.get("device", "auto")
    with _damaged(folder, steps, model_path, sac):
        model = agent_class(cfg.agent).load(model_path, env=env, device=device, custom_objects=schedule_objects(cfg))
    if state.get("replay_buffer"):
        replay = folder.checkpoints / state["replay_buffer"]
        if not replay.is_file():
            raise CLIError(f"The checkpoint's replay buffer {replay} is missing; cannot resume SAC faithfully.")
        with _damaged(folder, steps, replay, True, (ValueError,)):
            model.load_replay_buffer(replay)
    model.num_timesteps = start_step
    if hasattr(model, "_episode_num"):
        model._episode_num = int(state.get("episode_num", 0))
    model.ep_info_buffer = deque(state.get("ep_info_buffer", []), maxlen=model.stats_window_size)
    # The envs restart from a reset: seed it from the step count, so a resumed run does not replay the
    # episodes the run began with, and resuming twice from one checkpoint gives the same run.
    env.seed(cfg.seed + start_step)
    set_rng_state(model, state["rng"])
    folder.config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    # Logs written after the checkpoint (a run that died later) are replaced by the resumed run's.
    truncate_csv(folder.progress, "time/total_timesteps", start_step)
    truncate_csv(folder.evaluations, "timesteps", start_step)
    if not quiet:
        print(f"covey: resuming {folder.path} at step {start_step:,} of {cfg.timesteps:,}", file=sys.stderr)
    return _train(model, cfg, folder, state=state, quiet=quiet)


def _evaluated_steps(folder: RunFolder) -> set[int]:
    """The steps evaluations.csv has a row for (none where it is missing)."""
    if not folder.evaluations.is_file():
        return set()
    with open(folder.evaluations, newline="") as f:
        return {int(float(row["timesteps"])) for row in csv.DictReader(f) if row.get("timesteps")}


def _rollout_steps(model: Any, cfg: RunConfig) -> int:
    """Env steps of one rollout of an on-policy agent (training runs whole ones); 0 for SAC."""
    return 0 if cfg.agent == "sac" else int(model.n_steps) * model.env.num_envs


def _last_step(model: Any, cfg: RunConfig) -> int:
    """The step training will end at: the budget, rounded up to whole rollouts from where the model stands."""
    rollout, start = _rollout_steps(model, cfg), int(model.num_timesteps)
    if rollout == 0 or cfg.timesteps <= start:
        return cfg.timesteps
    return start + -(-(cfg.timesteps - start) // rollout) * rollout


@contextlib.contextmanager
def _damaged(folder: RunFolder, steps: list[int], path: pathlib.Path, sac: bool, errors: tuple = ()) -> Iterator[None]:
    """A file of the latest checkpoint that cannot be read (a crash or a full disk while it was copied), raising
    ``ModelFileError``, ``zipfile.BadZipFile``, ``EOFError`` or one of ``errors``, as a CLIError that names it
    and the way on: remove that checkpoint, to resume from the one before."""
    try:
        yield
    except (ModelFileError, zipfile.BadZipFile, EOFError, *errors) as err:
        latest = f"checkpoints/step_{steps[-1]}.*"
        if sac:
            before = "start the run over (SAC's replay buffer is kept with the latest checkpoint only)"
        elif len(steps) > 1:
            before = f"resume from the checkpoint before it (step {steps[-2]:,})"
        else:
            before = "start the run over (it has no other checkpoint)"
        problem = str(err).rstrip(".")
        kind = "SAC's replay buffer" if path.suffix == ".npz" else "its model" if path.suffix == ".zip" else "its state"
        raise CLIError(
            f"The latest checkpoint of {folder.path} cannot be read: {kind}, {path.name}, is damaged ({problem}). "
            f"Remove {latest} from the run folder to {before}."
        ) from err


def _train(
    model: Any, cfg: RunConfig, folder: RunFolder, state: dict | None, desc: str = "", quiet: bool = False
) -> int:
    resumed = state is not None
    remaining = cfg.timesteps - int(model.num_timesteps)
    # the final evaluation, which a stop during it left undone
    evaluate_last = (
        remaining <= 0 and cfg.eval_episodes > 0 and int(model.num_timesteps) not in _evaluated_steps(folder)
    )
    logging = remaining > 0 or evaluate_last
    if logging:  # (a finished run's resume logs nothing: no empty TensorBoard file)
        model.set_logger(make_logger(folder, append=resumed))
    if not folder.evaluations.exists():
        folder.evaluations.write_text(EVALUATIONS_HEADER)
    evaluator = None
    if cfg.eval_episodes > 0 and logging:
        evaluator = Evaluator(cfg, cfg.eval_episodes, cfg.eval_deterministic, seed=cfg.seed + 1000)
    run = Run(folder, cfg, evaluator, Interrupt(), desc=desc)
    if resumed:
        best = state.get("best_mean_return")
        run.best_mean_return = -math.inf if best is None else float(best)
        run.last_checkpoint_step = int(state["num_timesteps"])
    hard_stop = False
    if remaining > 0:
        # The bar closes first at the end, so its steps/s leave out the final evaluation. Where an evaluation and
        # a checkpoint fall on one step, the evaluation runs first: the checkpoint then holds the best so far.
        callbacks: list[BaseCallback] = [ProgressCallback(run, _last_step(model, cfg))]
        if evaluator is not None:
            callbacks.append(EvaluationCallback(run, cfg.timesteps))
        callbacks.append(CheckpointCallback(run))
        with run.interrupt:
            try:
                model.learn(remaining, callback=callbacks, reset_num_timesteps=not resumed)
            except (KeyboardInterrupt, WorkerLost) as stop:
                # SIGTERM for the whole process group (a cluster's scheduler) also ends the env's worker processes
                if isinstance(stop, WorkerLost):
                    if not run.interrupt.requested:
                        raise
                    print(
                        f"covey: the worker process stepping env {stop.copies} ended too ({stop.how}).", file=sys.stderr
                    )
                hard_stop = True
                for callback in callbacks:
                    if isinstance(callback, ProgressCallback) and callback.bar is not None:
                        callback.bar.close()
    else:
        if not quiet:  # (training runs whole rollouts, so a finished run may be past its budget)
            print(
                f"covey: the run is already at step {int(model.num_timesteps):,}, its budget {cfg.timesteps:,} spent.",
                file=sys.stderr,
            )
        if evaluate_last:
            evaluate_and_log(run, model)
    if logging:
        model.logger.close()  # progress.csv and the TensorBoard writer, whose thread would outlive the run in-process
    if evaluator is not None:
        evaluator.close()
    model.env.close()

    step = int(model.num_timesteps)
    if hard_stop or (run.interrupt.requested and step < cfg.timesteps):
        if hard_stop:
            checkpoint = run.save_checkpoint(model)
        else:
            checkpoint = folder.checkpoint(run.last_checkpoint_step)[0]
        draw_curve(folder)
        print(
            f"covey: interrupted; checkpoint saved at step {run.last_checkpoint_step:,} ({checkpoint}).\n"
            f"Resume with: covey train --resume {folder.path}",
            file=sys.stderr,
        )
        return run.interrupt.exit_code
    if run.last_checkpoint_step != step:
        run.save_checkpoint(model)
    if remaining > 0 or not folder.model.is_file():
        model.save(folder.model)
    curve = draw_curve(folder)
    if not quiet:
        lines = [f"covey: done, {step:,} steps. Run folder: {folder.path}", f"  model: {folder.model}"]
        if run.last_eval is not None:
            lines.append(
                f"  evaluation at step {run.last_eval[0]:,}: mean return {run.last_eval[1]:.2f} "
                f"+/- {run.last_eval[2]:.2f} ({cfg.eval_episodes} episode{'s' * (cfg.eval_episodes != 1)})"
            )
        if curve is not None:
            lines.append(f"  curve: {curve}")
        print("\n".join(lines))
    return 0
