"""Learning-curve plots of run folders.

A run folder holds ``progress.csv`` (Stable-Baselines3's CSV logger output), optionally ``evaluations.csv``
(``timesteps,mean_return,std_return``) and ``config.yaml`` (with ``agent``, ``env`` and ``seed``).
:func:`plot_run` draws one run (returns, and the critic's diagnostics when they were logged);
:func:`plot_runs` overlays several runs, averaging the seeds of each configuration.

Figures are drawn with matplotlib's object-oriented API (``matplotlib.figure.Figure``), which needs no
GUI backend and leaves pyplot's global state alone.

>>> from covey.plotting import plot_run
>>> plot_run("runs/ppo_cartpole")  # doctest: +SKIP
PosixPath('runs/ppo_cartpole/curve.png')
"""

from __future__ import annotations

import csv
import logging
import math
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from covey.cli.config import RESUME_OVERRIDABLE
from covey.files import write_atomically

log = logging.getLogger(__name__)

STEPS_KEY = "time/total_timesteps"
RETURN_KEY = "rollout/ep_rew_mean"
LOSS_KEYS = {
    "train/value_loss": "value loss",
    "train/baseline_loss": "baseline loss",
    "train/critic_loss": "critic loss",
}
EXPLAINED_VARIANCE_KEY = "train/explained_variance"
EVALUATIONS_FILE = "evaluations.csv"
PROGRESS_FILE = "progress.csv"
CONFIG_FILE = "config.yaml"
CURVE_FILE = "curve.png"


# ============================================================================================ pure helpers


def _to_float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan  # an empty cell (key not logged in that row) or a text value


def read_csv_columns(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The columns of a CSV file with a header row, as float arrays by column name.

    Empty cells (SB3 leaves them where a key was not logged in a row) and text become NaN; a row with fewer
    cells than the header (a line cut short) is padded with NaN. An empty file gives ``{}``.

    >>> cols = read_csv_columns("progress.csv")  # doctest: +SKIP
    >>> cols["time/total_timesteps"][:3]  # doctest: +SKIP
    array([2048., 4096., 6144.])
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return {}
    header = [name.strip() for name in rows[0]]
    body = [row for row in rows[1:] if any(cell.strip() for cell in row)]
    data = np.full((len(body), len(header)), np.nan)
    for i, row in enumerate(body):
        for j, cell in enumerate(row[: len(header)]):
            data[i, j] = _to_float(cell)
    return {name: data[:, j].copy() for j, name in enumerate(header)}


def _clean_index(steps: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Indices of the finite points sorted by step; of several values at one step, the last one logged."""
    if steps.shape != values.shape:
        raise ValueError(f"A curve needs as many steps as values, got {steps.shape[0]} and {values.shape[0]}.")
    index = np.flatnonzero(np.isfinite(steps) & np.isfinite(values))
    index = index[np.argsort(steps[index], kind="stable")]
    # np.unique keeps the first occurrence; on the reversed order that is the last one logged.
    _, last = np.unique(steps[index][::-1], return_index=True)
    return index[len(index) - 1 - last]


def _clean_curve(steps, values) -> tuple[np.ndarray, np.ndarray]:
    """The finite points of a curve sorted by step (duplicates: the last value logged)."""
    steps = np.asarray(steps, dtype=float).reshape(-1)
    values = np.asarray(values, dtype=float).reshape(-1)
    index = _clean_index(steps, values)
    return steps[index], values[index]


def aggregate_curves(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], n_points: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and min-max band of several ``(steps, values)`` curves on a common grid of steps.

    Each curve is linearly interpolated within its own range (NaN points are dropped first); the grid spans
    only the steps every curve covers, from the latest first step to the earliest last step, in ``n_points``
    evenly spaced points (one point when that range is a single step). Returns ``(grid, mean, low, high)``.

    >>> grid, mean, low, high = aggregate_curves([([0, 10], [0.0, 10.0]), ([0, 5, 10], [2.0, 2.0, 2.0])], 3)
    >>> grid.tolist(), mean.tolist(), low.tolist(), high.tolist()
    ([0.0, 5.0, 10.0], [1.0, 3.5, 6.0], [0.0, 2.0, 2.0], [2.0, 5.0, 10.0])
    """
    if len(curves) == 0:
        raise ValueError("aggregate_curves needs at least one (steps, values) curve, got none.")
    if not isinstance(n_points, (int, np.integer)) or n_points < 2:
        raise ValueError(f"n_points={n_points!r} is invalid: it must be an integer >= 2.")
    cleaned = [_clean_curve(steps, values) for steps, values in curves]
    empty = [i for i, (steps, _) in enumerate(cleaned) if len(steps) == 0]
    if empty:
        raise ValueError(f"Curves {empty} have no finite (step, value) point; drop them before aggregating.")
    start = max(float(steps[0]) for steps, _ in cleaned)
    end = min(float(steps[-1]) for steps, _ in cleaned)
    if start > end:
        raise ValueError(
            f"The curves cover no common range of steps (the latest start is {start:g}, the earliest end "
            f"{end:g}); aggregate runs that cover the same steps, e.g. trained for the same budget."
        )
    grid = np.array([start]) if start == end else np.linspace(start, end, int(n_points))
    stacked = np.stack([np.interp(grid, steps, values) for steps, values in cleaned])  # (n_curves, n_grid)
    return grid, stacked.mean(axis=0), stacked.min(axis=0), stacked.max(axis=0)


# ============================================================================================ run folders


@dataclass
class _Run:
    """What the plots need from one run folder."""

    path: pathlib.Path
    progress: dict[str, np.ndarray]
    config: dict
    evaluations: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None  # steps, mean, std

    @property
    def title(self) -> str | None:
        """``"<agent> <env>"`` from config.yaml, or None when it names neither."""
        parts = [_config_text(self.config.get(key)) for key in ("agent", "env")]
        parts = [p for p in parts if p]
        return " ".join(parts) if parts else None

    @property
    def label(self) -> str:
        return self.title or self.path.name

    def training_curve(self) -> tuple[np.ndarray, np.ndarray] | None:
        return _finite_series(self, RETURN_KEY)

    def evaluation_curve(self) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.evaluations is None else (self.evaluations[0], self.evaluations[1])


def _config_text(value) -> str | None:
    """An ``agent`` or ``env`` entry of config.yaml as text (an env given as a mapping shows its id)."""
    if value is None:
        return None
    if isinstance(value, dict):
        for key in ("id", "name", "env_id"):
            if isinstance(value.get(key), str):
                return value[key]
        return None
    return str(value)


def _read_config(path: pathlib.Path) -> dict:
    if not path.is_file():
        return {}
    import yaml

    try:
        with open(path) as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as err:
        # The plot does not depend on the config: fall back to the folder name for titles and labels.
        log.warning("Cannot read %s (%s); the plot is titled with the folder name.", path, err)
        return {}
    return config if isinstance(config, dict) else {}


def _read_evaluations(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    if not path.is_file():
        return None
    cols = read_csv_columns(path)
    if "timesteps" not in cols or "mean_return" not in cols:
        if cols:
            log.warning("%s lacks the columns timesteps,mean_return; evaluations are not plotted.", path)
        return None
    index = _clean_index(cols["timesteps"], cols["mean_return"])
    if len(index) == 0:
        return None
    std = cols.get("std_return")
    return cols["timesteps"][index], cols["mean_return"][index], (std[index] if std is not None else None)


def _load_run(run_dir: str | os.PathLike) -> _Run:
    path = pathlib.Path(run_dir)
    progress = path / PROGRESS_FILE
    if not progress.is_file():
        if not path.exists():
            raise FileNotFoundError(f"not a covey run folder: {path} does not exist")
        raise FileNotFoundError(
            f"not a covey run folder: no {PROGRESS_FILE} in {path} (pass the folder a training run wrote its logs to)"
        )
    return _Run(
        path=path,
        progress=read_csv_columns(progress),
        config=_read_config(path / CONFIG_FILE),
        evaluations=_read_evaluations(path / EVALUATIONS_FILE),
    )


# ============================================================================================ drawing


def _figure(width: float, height: float, n_panels: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    return fig, list(axes)


def _output_path(out: str | os.PathLike) -> tuple[pathlib.Path, str]:
    """The file to write and its image format: the suffix's (png, pdf, svg, ...), PNG when it has none."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = pathlib.Path(out)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; pass the path of the image file to write, e.g. curve.png.")
    if path.suffix == "":
        return path.with_suffix(".png"), "png"
    fmt = path.suffix[1:].lower()
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise ValueError(
            f"Cannot write a {path.suffix!r} image; use one of {', '.join(sorted(supported))} (e.g. .png)."
        )
    return path, fmt


def _save(fig, out: str | os.PathLike) -> pathlib.Path:
    """Write the image atomically: a viewer never sees a half-written file, a failure keeps the old one."""
    out, fmt = _output_path(out)
    write_atomically(out, lambda f: fig.savefig(f, format=fmt, dpi=100))
    return out


def _finite_series(run: _Run, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    if key not in run.progress or STEPS_KEY not in run.progress:
        return None
    steps, values = _clean_curve(run.progress[STEPS_KEY], run.progress[key])
    return (steps, values) if len(steps) else None


def _draw_critic(ax, run: _Run) -> None:
    losses = {name: _finite_series(run, key) for key, name in LOSS_KEYS.items()}
    losses = {name: series for name, series in losses.items() if series is not None}
    for name, (steps, values) in losses.items():
        ax.plot(steps, values, label=name)
    if losses and all(np.all(values > 0) for _, values in losses.values()):
        ax.set_yscale("log")  # losses shrink by orders of magnitude over training
    ax.set_xlabel("env steps")
    ax.set_ylabel("loss")
    ax.set_title("critic")
    handles, labels = ax.get_legend_handles_labels()
    ev = _finite_series(run, EXPLAINED_VARIANCE_KEY)
    if ev is not None:
        # Explained variance lives in (-inf, 1]: its own axis, so the losses' scale does not flatten it.
        twin = ax.twinx()
        twin.plot(ev[0], ev[1], color="tab:gray", linestyle="--", label="explained variance")
        twin.set_ylabel("explained variance")
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="best", fontsize="small")


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> pathlib.Path:
    """Plot one run's learning curves to a PNG (``<run_dir>/curve.png`` unless ``out`` is given).

    Left: return against env steps, the training return (``rollout/ep_rew_mean``) and, when
    ``evaluations.csv`` has rows, the evaluation mean with a +-std band. Right (when logged): the critic's
    losses (value, POCA's baseline, SAC's critic) and, on its own axis, the explained variance.
    Returns the path written.
    """
    run = _load_run(run_dir)
    training = run.training_curve()
    evaluation = run.evaluation_curve()
    if training is None and evaluation is None:
        raise ValueError(
            f"Nothing to plot in {run.path}: {PROGRESS_FILE} has no {RETURN_KEY!r} values against {STEPS_KEY!r} "
            f"(no episode has finished yet?) and there is no {EVALUATIONS_FILE} with rows."
        )
    critic = any(_finite_series(run, key) is not None for key in (*LOSS_KEYS, EXPLAINED_VARIANCE_KEY))
    fig, axes = _figure(12.0 if critic else 6.5, 4.5, 2 if critic else 1)
    ax = axes[0]
    if training is not None:
        ax.plot(training[0], training[1], label="training (rollout/ep_rew_mean)")
    if evaluation is not None:
        steps, mean, std = run.evaluations
        has_std = std is not None and bool(np.isfinite(std).any())
        label = "evaluation (mean +- std)" if has_std else "evaluation (mean)"
        line = ax.plot(steps, mean, marker="o", markersize=3, label=label)[0]
        if has_std:
            std = np.nan_to_num(std)  # a missing std draws no band at that point
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title("return")
    ax.legend(loc="best", fontsize="small")
    if critic:
        _draw_critic(axes[1], run)
    seed = run.config.get("seed")
    title = run.label
    fig.suptitle(f"{title} (seed {seed})" if seed is not None and run.title else title)
    return _save(fig, out if out is not None else run.path / CURVE_FILE)


_NOT_THE_SETUP = {"seed", "hyperparameters.device", *RESUME_OVERRIDABLE}
"""config.yaml entries that leave the learning problem as it is (those a resume may change too): runs that differ in
these alone are seeds of one setup."""


def _setup(config: dict, prefix: str = "") -> dict[str, str]:
    """A run's config.yaml flattened to ``{"hyperparameters.learning_rate": "1e-05", ...}``, without the entries
    in :data:`_NOT_THE_SETUP`."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if name in _NOT_THE_SETUP:
            continue
        if isinstance(value, dict) and value:
            flat.update(_setup(value, f"{name}."))
        else:
            flat[name] = repr(value) if not isinstance(value, str) else value
    return flat


def _default_labels(runs: list[_Run]) -> list[str]:
    """Each run's label: its agent and env, and where runs of those differ in their setup, the settings that
    differ (``"ppo CartPole-v1 learning_rate=1e-05"``: a hyperparameter by its name, another entry by its path)."""
    labels = [run.label for run in runs]
    setups = [_setup(run.config) for run in runs]
    for title in dict.fromkeys(labels):
        members = [i for i, label in enumerate(labels) if label == title]
        keys = sorted({key for i in members for key in setups[i]})
        differing = [key for key in keys if len({setups[i].get(key) for i in members}) > 1]
        for i in members:
            if differing:
                shown = ", ".join(
                    f"{key.removeprefix('hyperparameters.')}={setups[i].get(key, '(unset)')}" for key in differing
                )
                labels[i] = f"{title} {shown}"
    return labels


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    labels: Sequence[str] | None = None,
) -> pathlib.Path:
    """Overlay several runs in one PNG; runs with the same label are aggregated across seeds.

    A label's runs are drawn as their mean and min-max band on a common step grid (see
    :func:`aggregate_curves`). Labels default to ``"<agent> <env>"`` from each run's config.yaml (else the
    folder name), followed by the settings that differ where runs of one agent and env differ in more than
    their seed, budget, evaluation and checkpoint schedule, threads and device (so only the seeds of one setup
    are averaged). Evaluation returns are used when every run has them, else training returns; the y-axis
    says which. Returns ``out``.
    """
    run_dirs = list(run_dirs)
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run folder, got an empty list.")
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(run_dirs):
            raise ValueError(
                f"plot_runs got {len(labels)} labels for {len(run_dirs)} run folders; give one label per folder "
                "(repeat a label to average those runs) or none."
            )
    runs = [_load_run(d) for d in run_dirs]
    labels = [str(label) for label in labels] if labels is not None else _default_labels(runs)
    use_evaluations = all(run.evaluation_curve() is not None for run in runs)
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for run, label in zip(runs, labels):
        curve = run.evaluation_curve() if use_evaluations else run.training_curve()
        if curve is None:
            raise ValueError(
                f"Nothing to plot in {run.path}: {PROGRESS_FILE} has no {RETURN_KEY!r} values against "
                f"{STEPS_KEY!r}, and not every run has evaluations to plot instead."
            )
        groups.setdefault(label, []).append(curve)

    fig, (ax,) = _figure(7.5, 4.5, 1)
    for label, curves in groups.items():
        if len(curves) == 1:
            ax.plot(curves[0][0], curves[0][1], label=label)
            continue
        try:
            grid, mean, low, high = aggregate_curves(curves)
        except ValueError as err:
            raise ValueError(f"Cannot average the {len(curves)} runs labelled {label!r}: {err}") from err
        line = ax.plot(grid, mean, label=f"{label} (mean of {len(curves)}, min-max band)")[0]
        ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return (mean over episodes)" if use_evaluations else "training return (ep_rew_mean)")
    ax.legend(loc="best", fontsize="small")
    return _save(fig, out)
