"""``covey demo``: PPO on CartPole-v1 and a POCA team on simple_spread, trained in a few minutes on 2 cores.

Leaves ``runs/demo-<time>/`` with both run folders (logs, checkpoints, model, curve.png), a GIF of the
trained simple_spread team, and prints a table: task, env steps, seconds, trained return, random return.
"""

from __future__ import annotations

import copy
import math
import pathlib
import sys
import time
from typing import Any

from covey.cli.config import CLIError, RunConfig

# The settings of examples/ppo_cartpole.py and examples/poca_simple_spread.py, with shorter budgets.
PPO_CARTPOLE: dict[str, Any] = {
    "agent": "ppo",
    "env": "CartPole-v1",
    "n_envs": 8,
    "hyperparameters": {
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_1e-3",
        "clip_range": "lin_0.2",
        "device": "cpu",  # an MLP's PPO trains faster on the CPU than on a GPU (README, "Devices")
    },
    "timesteps": 50_000,
    "seed": 0,
}
POCA_SPREAD: dict[str, Any] = {
    "agent": "poca",
    "env": "mpe2:simple_spread_v3",
    "env_kwargs": {"N": 3, "max_cycles": 25},
    "n_envs": 8,
    "hyperparameters": {"n_steps": 128, "batch_size": 256, "n_epochs": 4, "learning_rate": 1e-3},
    "timesteps": 150_000,
    "seed": 0,
}
TASKS = (
    ("PPO CartPole-v1", "ppo-CartPole-v1", PPO_CARTPOLE),
    ("POCA simple_spread", "poca-simple_spread", POCA_SPREAD),
)


def scaled(raw: dict[str, Any], scale: float) -> dict[str, Any]:
    """The task with its budget times ``scale`` (at least one rollout), five evaluations and one checkpoint."""
    raw = copy.deepcopy(raw)
    rollout = raw["hyperparameters"]["n_steps"] * raw["n_envs"]
    raw["timesteps"] = max(int(raw["timesteps"] * scale), rollout)
    raw["eval_freq"] = max(raw["timesteps"] // 5, 1)
    raw["eval_episodes"] = 10 if scale >= 0.2 else 2
    raw["checkpoint_freq"] = 0
    return raw


def run_demo(scale: float = 1.0, out: str | pathlib.Path | None = None, threads: int = 1) -> int:
    from covey.agents import load
    from covey.cli.evaluation import Evaluator, record_gif
    from covey.cli.training import start

    if not 0 < scale < math.inf:
        raise CLIError(f"--scale must be a finite number > 0, got {scale}.")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise CLIError(f"--threads must be a whole number >= 1 (torch threads for training), got {threads}.")
    if out is not None and not str(out).strip():
        raise CLIError("--out is empty (an unset shell variable?): name the folder for the demo's runs.")
    root = pathlib.Path(out) if out is not None else pathlib.Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if root.exists() and not root.is_dir():
        raise CLIError(f"--out {root} is a file; name a folder for the demo's runs.")
    if root.exists() and any(root.iterdir()):
        raise CLIError(f"{root} exists and is not empty; choose another --out.")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CLIError(f"--out {root} cannot be created ({err.strerror}): choose a folder that can be.") from None
    episodes = 20 if scale >= 0.2 else 3
    rows, models = [], {}
    finished: list[pathlib.Path] = []
    try:
        for task, name, raw in TASKS:
            raw = scaled(raw, scale)
            raw["torch_threads"] = threads
            cfg = RunConfig.from_dict(raw)
            rollout = raw["hyperparameters"]["n_steps"] * raw["n_envs"]  # the budget in whole rollouts, as trained
            print(f"covey demo: {task}, {-(-cfg.timesteps // rollout) * rollout:,} env steps", file=sys.stderr)
            started = time.perf_counter()
            code = start(cfg, root / name, desc=task, quiet=True)
            seconds = time.perf_counter() - started
            if code != 0:
                _say_stopped(root, finished, f"during {task}")
                return code
            finished.append(root / name)
            model = load(root / name / "model.zip", device="cpu")
            evaluator = Evaluator(cfg, episodes, deterministic=True, seed=10_000)
            trained, _ = evaluator(model)
            random, _ = evaluator(None)
            evaluator.close()
            rows.append((task, int(model.num_timesteps), seconds, trained, random))
            models[name] = (model, cfg)
        model, cfg = models["poca-simple_spread"]
        gif, _, _ = record_gif(model, cfg, root / "simple_spread.gif", episodes=2, seed=10_000, fps=8)
        curves = stack_images([root / name / "curve.png" for _, name, _ in TASKS], root / "curves.png")
    except KeyboardInterrupt:
        _say_stopped(root, finished, "")
        return 130
    print(_table(rows, episodes))
    print(
        f"\nRun folders: {root / TASKS[0][1]} and {root / TASKS[1][1]} (config.yaml, progress.csv, evaluations.csv, "
        f"checkpoints/, model.zip, curve.png)\nBoth learning curves: {curves}\nThe trained team: {gif}"
        f"\nNext: covey eval {root / TASKS[0][1]}; covey enjoy {root / TASKS[1][1]} --gif team.gif"
    )
    return 0


def _say_stopped(root: pathlib.Path, finished: list[pathlib.Path], when: str) -> None:
    """What an interrupted demo leaves: the runs that finished, and how to run the demo again."""
    done = f"; finished runs: {', '.join(map(str, finished))}" if finished else ""
    print(
        f"covey demo: stopped{' ' + when if when else ''}{done}. The demo does not go on from there: run it again "
        f"with another --out (or remove {root}).",
        file=sys.stderr,
    )


def stack_images(paths: list[pathlib.Path], out: pathlib.Path) -> pathlib.Path | None:
    """The PNGs that exist, one above the other on white, as one PNG (None when there are none)."""
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in paths if p.is_file()]
    if not images:
        return None
    canvas = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    top = 0
    for image in images:
        canvas.paste(image, (0, top))
        top += image.height
    canvas.save(out, optimize=True)
    return out


def _table(rows: list[tuple[str, int, float, float, float]], episodes: int) -> str:
    header = ("task", "env steps", "seconds", "trained return", "random return")
    lines = [f"{header[0]:<20} {header[1]:>10} {header[2]:>8} {header[3]:>15} {header[4]:>14}"]
    for task, steps, seconds, trained, random in rows:
        lines.append(f"{task:<20} {steps:>10,} {seconds:>8.0f} {trained:>15.1f} {random:>14.1f}")
    lines.append(
        f"(mean over {episodes} episodes, the same ones for the trained and the random policy; "
        "simple_spread: group return, summed over the 3 agents)"
    )
    return "\n".join(lines)
