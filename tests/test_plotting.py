"""Learning-curve plots: CSV reading (SB3's logger output), seed aggregation checked by hand, the PNGs written
for one run and for several, clear errors, and a real tiny training run plotted."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
from PIL import Image
from stable_baselines3.common.logger import configure

from covey import PPO, plotting
from covey.plotting import aggregate_curves, plot_run, plot_runs, read_csv_columns


@pytest.fixture
def figures(monkeypatch):
    """Keep every figure the plotting functions save (they are written as usual)."""
    saved = []
    real_save = plotting._save

    def save(fig, out):
        saved.append(fig)
        return real_save(fig, out)

    monkeypatch.setattr(plotting, "_save", save)
    return saved


def write_run(
    folder: pathlib.Path,
    steps: list[int],
    returns: list[float | None],
    evaluations: list[tuple[int, float, float]] | None = None,
    config: str | None = None,
    critic: bool = True,
) -> pathlib.Path:
    """A run folder as the command line writes it: progress.csv in SB3's layout (empty cells where a key was
    not logged in a row), optionally evaluations.csv and config.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    header = ["time/iterations", "time/total_timesteps", "rollout/ep_rew_mean"]
    if critic:
        header += ["train/value_loss", "train/baseline_loss", "train/explained_variance"]
    lines = [",".join(header)]
    for i, (step, ret) in enumerate(zip(steps, returns)):
        cells = [str(i + 1), str(step), "" if ret is None else repr(ret)]
        if critic:
            # The first row has no training statistics yet (SB3 logs them after the first update).
            cells += ["", "", ""] if i == 0 else [repr(10.0 / (i + 1)), repr(5.0 / (i + 1)), repr(0.1 * i)]
        lines.append(",".join(cells))
    (folder / "progress.csv").write_text("\n".join(lines) + "\n")
    if evaluations is not None:
        rows = ["timesteps,mean_return,std_return"] + [f"{s},{m},{d}" for s, m, d in evaluations]
        (folder / "evaluations.csv").write_text("\n".join(rows) + "\n")
    if config is not None:
        (folder / "config.yaml").write_text(config)
    return folder


def assert_png(path: pathlib.Path, size: tuple[int, int]) -> None:
    assert path.is_file()
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == size
        image.verify()


# ============================================================================================ reading CSV


def test_read_csv_columns_empty_cells_text_and_short_rows(tmp_path):
    path = tmp_path / "progress.csv"
    path.write_text(
        'time/total_timesteps,rollout/ep_rew_mean,train/value_loss,note\n64,12.5,,"a, b"\n128,,3.25,x\n\n192,20.0\n'
    )
    cols = read_csv_columns(path)
    assert list(cols) == ["time/total_timesteps", "rollout/ep_rew_mean", "train/value_loss", "note"]
    np.testing.assert_array_equal(cols["time/total_timesteps"], [64.0, 128.0, 192.0])
    np.testing.assert_array_equal(cols["rollout/ep_rew_mean"], [12.5, np.nan, 20.0])
    np.testing.assert_array_equal(cols["train/value_loss"], [np.nan, 3.25, np.nan])
    assert np.isnan(cols["note"]).all()  # text is not a number
    assert all(c.dtype == np.float64 for c in cols.values())


def test_read_csv_columns_reads_sb3_logger_output_where_keys_appear_later(tmp_path):
    # SB3's CSV writer appends a column when a key first appears and pads the earlier rows with empty cells.
    logger = configure(str(tmp_path), ["csv"])
    logger.record("time/total_timesteps", 100)
    logger.record("rollout/ep_rew_mean", 1.5)
    logger.dump(100)
    logger.record("time/total_timesteps", 200)
    logger.record("rollout/ep_rew_mean", 2.5)
    logger.record("train/value_loss", 0.75)
    logger.dump(200)
    logger.record("time/total_timesteps", 300)
    logger.record("train/value_loss", 0.5)
    logger.dump(300)
    logger.close()
    cols = read_csv_columns(tmp_path / "progress.csv")
    assert set(cols) == {"time/total_timesteps", "rollout/ep_rew_mean", "train/value_loss"}
    assert list(cols)[-1] == "train/value_loss"  # a later key is a later column
    np.testing.assert_array_equal(cols["time/total_timesteps"], [100, 200, 300])
    np.testing.assert_array_equal(cols["rollout/ep_rew_mean"], [1.5, 2.5, np.nan])
    np.testing.assert_array_equal(cols["train/value_loss"], [np.nan, 0.75, 0.5])


def test_read_csv_columns_empty_file_and_header_only(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert read_csv_columns(empty) == {}
    header = tmp_path / "header.csv"
    header.write_text("timesteps,mean_return,std_return\n")
    cols = read_csv_columns(header)
    assert list(cols) == ["timesteps", "mean_return", "std_return"]
    assert all(len(c) == 0 for c in cols.values())


# ============================================================================================ aggregation


def test_aggregate_curves_on_different_step_grids_by_hand():
    # a(s) = s on [0, 20]; b is 1 up to step 15, then rises to 3 at step 25. Common range: [5, 20].
    a = (np.array([0, 10, 20]), np.array([0.0, 10.0, 20.0]))
    b = (np.array([5, 15, 25]), np.array([1.0, 1.0, 3.0]))
    grid, mean, low, high = aggregate_curves([a, b], n_points=4)
    np.testing.assert_allclose(grid, [5, 10, 15, 20])
    # b at 20 is halfway from 1 (step 15) to 3 (step 25): 2.
    np.testing.assert_allclose(mean, [(5 + 1) / 2, (10 + 1) / 2, (15 + 1) / 2, (20 + 2) / 2])
    np.testing.assert_allclose(low, [1, 1, 1, 2])
    np.testing.assert_allclose(high, [5, 10, 15, 20])


def test_aggregate_curves_three_curves_mean_min_max():
    curves = [([0, 4], [0.0, 4.0]), ([0, 2, 4], [3.0, 3.0, 3.0]), ([0, 4], [6.0, -2.0])]
    grid, mean, low, high = aggregate_curves(curves, n_points=3)
    np.testing.assert_allclose(grid, [0, 2, 4])
    # At step 2: 2, 3 and 2 (halfway from 6 to -2).
    np.testing.assert_allclose(mean, [3.0, 7.0 / 3.0, 5.0 / 3.0])
    np.testing.assert_allclose(low, [0.0, 2.0, -2.0])
    np.testing.assert_allclose(high, [6.0, 3.0, 4.0])


def test_aggregate_curves_drops_nan_sorts_and_keeps_the_last_value_of_a_repeated_step():
    # Unsorted, a NaN value (ignored) and step 10 logged twice (the later value 7 counts).
    steps = np.array([10.0, 0.0, 5.0, 10.0, np.nan])
    values = np.array([99.0, 1.0, np.nan, 7.0, 3.0])
    grid, mean, low, high = aggregate_curves([(steps, values)], n_points=3)
    np.testing.assert_allclose(grid, [0, 5, 10])
    np.testing.assert_allclose(mean, [1.0, 4.0, 7.0])
    np.testing.assert_array_equal(low, mean)
    np.testing.assert_array_equal(high, mean)


def test_aggregate_curves_common_range_of_one_step():
    grid, mean, low, high = aggregate_curves([([0, 10], [0.0, 1.0]), ([10, 20], [5.0, 6.0])])
    np.testing.assert_allclose(grid, [10])
    np.testing.assert_allclose(mean, [3.0])
    np.testing.assert_allclose(low, [1.0])
    np.testing.assert_allclose(high, [5.0])


def test_aggregate_curves_errors():
    with pytest.raises(ValueError, match="at least one"):
        aggregate_curves([])
    with pytest.raises(ValueError, match="no common range"):
        aggregate_curves([([0, 10], [0.0, 1.0]), ([20, 30], [0.0, 1.0])])
    with pytest.raises(ValueError, match="no finite"):
        aggregate_curves([([0, 10], [np.nan, np.nan])])
    with pytest.raises(ValueError, match="n_points"):
        aggregate_curves([([0, 10], [0.0, 1.0])], n_points=1)
    with pytest.raises(ValueError, match="as many steps as values"):
        aggregate_curves([([0, 10, 20], [0.0, 1.0])])


# ============================================================================================ plot_run


def test_plot_run_writes_curve_png_with_critic_panel_and_title(tmp_path, figures):
    run = write_run(
        tmp_path / "run",
        steps=[64, 128, 192, 256],
        returns=[None, 10.0, 12.0, 20.0],
        evaluations=[(128, 11.0, 2.0), (256, 21.0, 1.5)],
        config="agent: poca\nenv: mpe2:simple_spread_v3\nseed: 3\nlearning_rate: 0.001\n",
    )
    out = plot_run(run)
    assert out == run / "curve.png"
    assert_png(out, (1200, 450))  # two panels: 12 x 4.5 inches at 100 dpi
    fig = figures[-1]
    assert fig._suptitle.get_text() == "poca mpe2:simple_spread_v3 (seed 3)"
    returns_ax, critic_ax = fig.axes[0], fig.axes[1]
    lines = {line.get_label(): line for line in returns_ax.get_lines()}
    training = lines["training (rollout/ep_rew_mean)"]
    np.testing.assert_array_equal(training.get_xdata(), [128, 192, 256])  # the empty first cell is skipped
    np.testing.assert_array_equal(training.get_ydata(), [10.0, 12.0, 20.0])
    np.testing.assert_array_equal(lines["evaluation (mean +- std)"].get_ydata(), [11.0, 21.0])
    band = returns_ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(9.0) and band[:, 1].max() == pytest.approx(22.5)
    assert {line.get_label() for line in critic_ax.get_lines()} == {"value loss", "baseline loss"}
    twin = fig.axes[2]
    assert twin.get_ylabel() == "explained variance"
    np.testing.assert_allclose(twin.get_lines()[0].get_ydata(), [0.1, 0.2, 0.3])


def test_plot_run_without_critic_columns_or_config_is_one_panel(tmp_path, figures):
    run = write_run(tmp_path / "my_run", steps=[10, 20, 30], returns=[1.0, 2.0, 3.0], critic=False)
    out = plot_run(run, out=tmp_path / "elsewhere" / "plot.png")
    assert out == tmp_path / "elsewhere" / "plot.png"
    assert not (run / "curve.png").exists()
    assert_png(out, (650, 450))
    assert figures[-1]._suptitle.get_text() == "my_run"
    assert len(figures[-1].axes) == 1


def test_plot_run_with_empty_or_header_only_evaluations(tmp_path):
    for name, content in (("empty", ""), ("header", "timesteps,mean_return,std_return\n")):
        run = write_run(tmp_path / name, steps=[10, 20], returns=[1.0, 2.0], critic=False)
        (run / "evaluations.csv").write_text(content)
        assert_png(plot_run(run), (650, 450))


def test_plot_run_from_evaluations_alone(tmp_path, figures):
    run = write_run(tmp_path / "run", steps=[10, 20], returns=[None, None], evaluations=[(10, 1.0, 0.5)])
    plot_run(run)
    labels = [line.get_label() for line in figures[-1].axes[0].get_lines()]
    assert labels == ["evaluation (mean +- std)"]


def test_plot_run_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a covey run folder: no progress.csv in"):
        plot_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_run(tmp_path / "missing")
    run = write_run(tmp_path / "run", steps=[10, 20], returns=[None, None])
    with pytest.raises(ValueError, match="Nothing to plot"):
        plot_run(run)
    good = write_run(tmp_path / "good", steps=[10, 20], returns=[1.0, 2.0])
    with pytest.raises(ValueError, match="Cannot write a '.xyz' image"):
        plot_run(good, out=tmp_path / "curve.xyz")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        plot_run(good, out=tmp_path)


def test_plot_run_replaces_an_existing_png(tmp_path):
    run = write_run(tmp_path / "run", steps=[10, 20], returns=[1.0, 2.0], critic=False)
    (run / "curve.png").write_bytes(b"old")
    assert_png(plot_run(run), (650, 450))
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []  # no temporary file left


# ============================================================================================ plot_runs


def test_plot_runs_aggregates_seeds_of_a_label_with_training_curves(tmp_path, figures):
    config = "agent: ppo\nenv: CartPole-v1\nseed: {}\n"
    a = write_run(tmp_path / "a", [0, 10, 20], [0.0, 10.0, 20.0], config=config.format(0))
    b = write_run(tmp_path / "b", [5, 15, 25], [1.0, 1.0, 3.0], config=config.format(1))
    c = write_run(tmp_path / "c", [0, 50], [4.0, 5.0], evaluations=[(50, 5.0, 0.0)], config="agent: sac\n")
    out = plot_runs([a, b, c], tmp_path / "compare.png")
    assert out == tmp_path / "compare.png"
    assert_png(out, (750, 450))
    ax = figures[-1].axes[0]
    assert "training" in ax.get_ylabel()  # a and b have no evaluations
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"ppo CartPole-v1 (mean of 2, min-max band)", "sac"}
    mean_line = lines["ppo CartPole-v1 (mean of 2, min-max band)"]
    grid, mean, low, high = aggregate_curves([([0, 10, 20], [0.0, 10.0, 20.0]), ([5, 15, 25], [1.0, 1.0, 3.0])])
    np.testing.assert_allclose(mean_line.get_xdata(), grid)
    assert grid[0] == 5 and grid[-1] == 20  # the range both seeds cover
    np.testing.assert_allclose(mean_line.get_ydata(), mean)
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(low.min()) and band[:, 1].max() == pytest.approx(high.max())


def test_plot_runs_uses_evaluations_when_every_run_has_them_and_explicit_labels(tmp_path, figures):
    a = write_run(tmp_path / "a", [10, 20], [1.0, 2.0], evaluations=[(10, 5.0, 1.0), (20, 7.0, 1.0)])
    b = write_run(tmp_path / "b", [10, 20], [1.0, 2.0], evaluations=[(10, 9.0, 1.0), (20, 11.0, 1.0)])
    plot_runs([a, b], tmp_path / "out.png", labels=["mine", "mine"])
    ax = figures[-1].axes[0]
    assert "evaluation" in ax.get_ylabel()
    (line,) = ax.get_lines()
    assert line.get_label() == "mine (mean of 2, min-max band)"
    assert line.get_ydata()[0] == pytest.approx(7.0) and line.get_ydata()[-1] == pytest.approx(9.0)


def test_plot_runs_averages_only_runs_of_one_setup(tmp_path, figures):
    """Runs of one agent and env that differ in a hyperparameter are separate lines, labelled with it; runs that
    differ only in their seed, budget and evaluation schedule are averaged (all four were averaged as seeds)."""
    config = (
        "agent: ppo\nenv: CartPole-v1\nhyperparameters:\n  learning_rate: {}\n  device: cpu\nseed: {}\ntimesteps: {}\n"
    )
    runs = [
        write_run(tmp_path / "a", [0, 10], [0.0, 10.0], config=config.format("0.001", 0, 10)),
        write_run(tmp_path / "b", [0, 10, 20], [2.0, 4.0, 6.0], config=config.format("0.001", 1, 20)),
        write_run(tmp_path / "c", [0, 10], [5.0, 5.0], config=config.format("1.0e-05", 0, 10)),
        write_run(tmp_path / "d", [0, 10], [7.0, 7.0], config=config.format("1.0e-05", 0, 10).replace("cpu", "cuda")),
    ]
    plot_runs(runs, tmp_path / "out.png")
    lines = {line.get_label(): line for line in figures[-1].axes[0].get_lines()}
    assert set(lines) == {
        "ppo CartPole-v1 learning_rate=0.001 (mean of 2, min-max band)",
        "ppo CartPole-v1 learning_rate=1e-05 (mean of 2, min-max band)",
    }
    fast = lines["ppo CartPole-v1 learning_rate=0.001 (mean of 2, min-max band)"]
    assert (fast.get_ydata()[0], fast.get_ydata()[-1]) == pytest.approx((1.0, 7.0))  # (0+2)/2 and (10+4)/2
    slow = lines["ppo CartPole-v1 learning_rate=1e-05 (mean of 2, min-max band)"]
    np.testing.assert_allclose(slow.get_ydata(), 6.0)


def test_plot_runs_default_label_is_the_folder_name(tmp_path, figures):
    a = write_run(tmp_path / "first", [10, 20], [1.0, 2.0])
    b = write_run(tmp_path / "second", [10, 20], [3.0, 4.0])
    plot_runs([a, b], tmp_path / "out.png")
    assert [line.get_label() for line in figures[-1].axes[0].get_lines()] == ["first", "second"]


def test_plot_runs_errors(tmp_path):
    with pytest.raises(ValueError, match="at least one run folder"):
        plot_runs([], tmp_path / "out.png")
    a = write_run(tmp_path / "a", [0, 10], [0.0, 1.0])
    b = write_run(tmp_path / "b", [20, 30], [0.0, 1.0])
    with pytest.raises(ValueError, match="2 labels for 1 run folders"):
        plot_runs([a], tmp_path / "out.png", labels=["x", "y"])
    with pytest.raises(ValueError, match="runs labelled 'same'.*no common range"):
        plot_runs([a, b], tmp_path / "out.png", labels=["same", "same"])
    with pytest.raises(FileNotFoundError, match="no progress.csv"):
        plot_runs([a, tmp_path], tmp_path / "out.png")
    empty = write_run(tmp_path / "empty", [0, 10], [None, None])
    with pytest.raises(ValueError, match="Nothing to plot"):
        plot_runs([a, empty], tmp_path / "out.png")
    assert not (tmp_path / "out.png").exists()


# ============================================================================================ a real run


def test_plot_run_on_a_real_tiny_ppo_run(tmp_path, figures):
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=2, seed=0)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(384)
    model.logger.close()
    cols = read_csv_columns(tmp_path / "progress.csv")
    steps = cols["time/total_timesteps"]
    np.testing.assert_array_equal(steps, np.arange(1, 7) * 64)
    assert math.isnan(cols["train/value_loss"][0]) and np.isfinite(cols["train/value_loss"][1:]).all()
    out = plot_run(tmp_path)
    assert_png(out, (1200, 450))  # PPO logs value loss and explained variance: the critic panel is drawn
    training = figures[-1].axes[0].get_lines()[0]
    np.testing.assert_array_equal(training.get_xdata(), steps[np.isfinite(cols["rollout/ep_rew_mean"])])
