"""The ``covey`` command line, driven in subprocesses (``python -m covey ...``) with tiny budgets.

Every run folder lives in pytest's tmp_path; nothing is written into the repository.
"""

import csv
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from envs import needs_onnx_exporter

from covey import POCA
from covey.cli.config import CLIError, RunConfig, apply_sets, linear_schedule, parse_yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
SHIPPED = {
    "ppo_cartpole",
    "ppo_lunarlander",
    "sac_pendulum",
    "sac_lunarlander_continuous",
    "poca_simple_spread",
    "poca_multiwalker",
    "poca_kaz",
}
# PPO CartPole from the shipped config: 8 envs x 32 steps = 256 env steps per rollout.
TINY_PPO = ["timesteps=2048", "eval_freq=1024", "eval_episodes=2", "checkpoint_freq=1024"]


def covey(*args, cwd, check=True, timeout=300) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "covey", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert result.returncode == 0, f"covey {' '.join(map(str, args))} failed:\n{result.stderr[-3000:]}"
    return result


def read_rows(path: pathlib.Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def progress_steps(run: pathlib.Path) -> list[int]:
    return [int(float(r["time/total_timesteps"])) for r in read_rows(run / "progress.csv")]


def assert_png(path: pathlib.Path) -> None:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.width > 100 and image.height > 100


def gif_frames(path: pathlib.Path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "GIF"
        return image.n_frames


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="module")
def ppo_run(work) -> pathlib.Path:
    covey("train", CONFIGS / "ppo_cartpole.yaml", "--set", *TINY_PPO, "--run-dir", "ppo", cwd=work)
    return work / "ppo"


@pytest.fixture(scope="module")
def poca_run(work) -> pathlib.Path:
    covey(
        "train",
        "poca",
        "--env",
        "mpe2:simple_spread_v3",
        "--env-kwargs",
        '{"N": 3, "max_cycles": 25}',
        "--timesteps",
        "1.5e3",
        "--n-envs",
        "4",
        "--seed",
        "0",
        "--set",
        "hyperparameters.n_steps=128",
        "eval_freq=512",
        "eval_episodes=2",
        "--run-dir",
        "poca",
        cwd=work,
    )
    return work / "poca"


# ---------------------------------------------------------------------------- train
def test_train_from_config_writes_the_run_folder(ppo_run):
    from covey.agents import load

    config = yaml.safe_load((ppo_run / "config.yaml").read_text())
    assert config["agent"] == "ppo" and config["env"] == "CartPole-v1"
    assert config["timesteps"] == 2048 and config["hyperparameters"]["n_steps"] == 32  # --set over the file
    steps = progress_steps(ppo_run)
    assert steps == sorted([*range(256, 2049, 256), 1024, 2048])  # a row per rollout, and one per evaluation
    assert (ppo_run / "evaluations.csv").read_text().splitlines()[0] == "timesteps,mean_return,std_return"
    evaluations = read_rows(ppo_run / "evaluations.csv")
    assert [int(r["timesteps"]) for r in evaluations] == [1024, 2048]
    assert all(np.isfinite(float(r["mean_return"])) for r in evaluations)
    # every evaluation, the last one too, is in progress.csv at its own step, as SB3's EvalCallback writes it
    logged = [
        (int(float(r["time/total_timesteps"])), float(r["eval/mean_reward"]))
        for r in read_rows(ppo_run / "progress.csv")
        if r.get("eval/mean_reward")
    ]
    assert logged == [(int(r["timesteps"]), float(r["mean_return"])) for r in evaluations]
    # with SB3's EvalCallback's mean episode length (a CartPole episode's return is its length)
    lengths = [float(r["eval/mean_ep_length"]) for r in read_rows(ppo_run / "progress.csv") if r["eval/mean_reward"]]
    assert lengths == [reward for _, reward in logged]
    # in a row of its own: the updates' train/* stay on the rollouts' rows, one point per step in every curve
    rows = read_rows(ppo_run / "progress.csv")
    assert all(not r["train/value_loss"] and not r["rollout/ep_rew_mean"] for r in rows if r["eval/mean_reward"])
    trained = [int(float(r["time/total_timesteps"])) for r in rows if r["train/value_loss"]]
    assert trained == list(range(512, 2049, 256))  # every rollout's row after the first update
    checkpoints = ppo_run / "checkpoints"
    assert {p.name for p in checkpoints.glob("step_*.zip")} == {"step_1024.zip", "step_2048.zip"}
    assert (checkpoints / "best_model.zip").is_file()
    state = json.loads((checkpoints / "step_1024.json").read_text())
    assert state["num_timesteps"] == 1024 and set(state["rng"]) >= {"python", "numpy", "torch"}
    # the checkpoint at an evaluation's step holds that evaluation in the best so far (a resume keeps the best)
    assert state["best_mean_return"] == float(evaluations[0]["mean_return"])
    final = json.loads((checkpoints / "step_2048.json").read_text())
    assert final["best_mean_return"] == max(float(r["mean_return"]) for r in evaluations)
    model = load(ppo_run / "model.zip")
    assert type(model).__name__ == "PPO" and model.num_timesteps == 2048
    assert list((ppo_run).glob("events.out.tfevents.*"))
    assert_png(ppo_run / "curve.png")


def test_train_short_form_for_poca(poca_run):
    from covey.agents import load

    config = yaml.safe_load((poca_run / "config.yaml").read_text())
    assert config["agent"] == "poca" and config["env"] == "mpe2:simple_spread_v3"
    assert config["env_kwargs"] == {"N": 3, "max_cycles": 25} and config["n_envs"] == 4
    assert config["timesteps"] == 1500
    steps = progress_steps(poca_run)
    assert steps and steps == sorted(steps) and steps[-1] >= 1500
    evaluations = read_rows(poca_run / "evaluations.csv")
    assert len(evaluations) >= 2
    # SB3's EvalCallback's keys: simple_spread's episodes last max_cycles steps
    rows = [r for r in read_rows(poca_run / "progress.csv") if r.get("eval/mean_reward")]
    assert len(rows) == len(evaluations) and all(float(r["eval/mean_ep_length"]) == 25.0 for r in rows)
    assert list((poca_run / "checkpoints").glob("step_*.zip"))
    model = load(poca_run / "model.zip")
    assert type(model).__name__ == "POCA" and len(model.agent_ids) == 3 and model.num_timesteps >= 1500
    assert_png(poca_run / "curve.png")


def test_a_run_in_process_closes_its_logs(tmp_path):
    """covey.cli.main run in a Python process (covey demo trains twice in one) leaves no TensorBoard writer thread
    behind and progress.csv closed, and gives torch back the caller's thread count (the run's torch_threads=1
    stayed set)."""
    import threading

    import torch

    from covey.cli import main

    args = ["train", str(CONFIGS / "ppo_cartpole.yaml"), "--set", "timesteps=512", "eval_episodes=0"]
    assert main([*args, "--run-dir", str(tmp_path / "first")]) == 0  # imports and first-use threads settle here
    threads = threading.active_count()
    callers = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        assert main([*args, "--run-dir", str(tmp_path / "second")]) == 0
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(callers)
    assert threading.active_count() == threads
    assert read_rows(tmp_path / "second" / "progress.csv")


@pytest.mark.parametrize(
    "config_text, sets, named",
    [
        ("agent: ppo\nenv: CartPole-v1\nlearning_rat: 1e-3\n", [], "learning_rat"),
        ("agent: ppo\nenv: CartPole-v1\n", ["hyperparameters.n_step=64"], "n_step"),
        ("agent: ppo\nenv: CartPole-v1\n", ["hyperparameters.n_steps=-5"], "n_steps"),
    ],
    ids=["unknown-key", "unknown-hyperparameter", "negative-n_steps"],
)
def test_bad_config_fails_before_training(tmp_path, config_text, sets, named):
    (tmp_path / "bad.yaml").write_text(config_text)
    extra = ["--set", *sets] if sets else []
    result = covey("train", "bad.yaml", *extra, "--run-dir", "run", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert named in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # no folder, no model.zip: nothing was trained


@pytest.mark.parametrize(
    "raw, problem",
    [
        ({"agent": "ppo", "env": "mpe2:simple_spread_v3"}, "PettingZoo"),
        ({"agent": "poca", "env": "CartPole-v1"}, "Gymnasium env id"),
        ({"agent": "poca", "env": "no_such_module_covey:thing_v0"}, "Cannot import module 'no_such_module_covey'"),
        ({"agent": "sac", "env": "no_such_module_covey:Thing-v0"}, "No module named 'no_such_module_covey'"),
    ],
)
def test_env_specs_that_do_not_fit_the_agent_are_refused(raw, problem):
    from covey.cli.envs import env_fn

    cfg = RunConfig.from_dict(raw)
    with pytest.raises(CLIError, match=re.escape(problem)):
        env_fn(cfg)()


@pytest.mark.parametrize("n_processes", [1, 2])
def test_a_poca_env_whose_spaces_covey_refuses_is_a_config_error(tmp_path, n_processes):
    """Agents of different spaces fail the group env's check as the command's other refusals fail: one line, exit
    code 2, nothing written (a traceback and exit code 1 before)."""
    config = f"agent: poca\nenv: mpe2:simple_speaker_listener_v4\nn_envs: 2\nn_processes: {n_processes}\n"
    (tmp_path / "mixed.yaml").write_text(config)
    for args in (["train", "mixed.yaml", "--run-dir", "run"], ["check", "mixed.yaml"]):
        result = covey(*args, cwd=tmp_path, check=False)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert "env mpe2:simple_speaker_listener_v4: Agents of one group must share one observation space" in (
            result.stderr + result.stdout
        )
        # the config's ways to the fixes the error names: SuperSuit's padding, or covey's one_side
        assert "wrappers: [{name: pad_observations_v0}, {name: pad_action_space_v0}]" in result.stderr + result.stdout
        assert "wrappers: [{name: one_side, kwargs: {team: speaker}}]" in result.stderr + result.stdout
    # which the config takes
    for fix in (
        "[{name: pad_observations_v0}, {name: pad_action_space_v0}]",
        "[{name: one_side, kwargs: {team: speaker}}]",
    ):
        (tmp_path / "fixed.yaml").write_text(config + f"wrappers: {fix}\n")
        result = covey("check", "fixed.yaml", cwd=tmp_path, check=False)
        assert result.returncode == 0, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_poca_config_steps_its_copies_in_the_processes_it_names():
    from covey.cli.envs import build_env
    from covey.wrappers.group_env import GroupVecEnv, SubprocGroupVecEnv

    raw = {"agent": "poca", "env": "mpe2:simple_spread_v3", "env_kwargs": {"N": 3, "max_cycles": 5}, "n_envs": 3}
    one, two = build_env(RunConfig.from_dict(raw)), build_env(RunConfig.from_dict({**raw, "n_processes": 2}))
    try:
        assert type(one) is GroupVecEnv and isinstance(two, SubprocGroupVecEnv) and len(two.processes) == 1
        for x, y in zip(one.reset(seed=1), two.reset(seed=1)):
            np.testing.assert_array_equal(x, y)
        actions = np.ones((3, 3), np.int64)
        np.testing.assert_array_equal(one.step(actions).rewards, two.step(actions).rewards)
    finally:
        two.close()
    with pytest.raises(CLIError, match=r"n_processes=2 is for poca.*ppo steps its copies in the training process"):
        RunConfig.from_dict({"agent": "ppo", "env": "CartPole-v1", "n_envs": 4, "n_processes": 2})
    with pytest.raises(CLIError, match=r"n_processes=4 is more than the 3 env copies"):
        RunConfig.from_dict({**raw, "n_processes": 4})
    # the key's description, read from RunConfig's docstring of it (two lines there), follows the error
    described = (
        r"n_processes=0 is invalid: it must be >= 1 \(poca: processes that step the copies.*training process\)\)\.$"
    )
    with pytest.raises(CLIError, match=described):
        RunConfig.from_dict({**raw, "n_processes": 0})


def test_config_errors_describe_the_key_in_plain_text():
    with pytest.raises(
        CLIError, match=r"env: expected a str, got 5 \(Gymnasium id \(CartPole-v1\) for ppo/sac"
    ) as info:
        RunConfig.from_dict({"agent": "ppo", "env": 5})
    assert "``" not in str(info.value)
    with pytest.raises(
        CLIError, match=r"\(Policy name: MlpPolicy, CnnPolicy, MultiInputPolicy, MlpLstmPolicy, \.\.\.\)\.$"
    ):
        RunConfig.from_dict({"agent": "ppo", "env": "CartPole-v1", "policy": 5})


def test_config_values_numbers_and_dotted_overrides():
    raw = parse_yaml("agent: sac\nenv: Pendulum-v1\ntimesteps: 1e6\nhyperparameters: {buffer_size: 1e5}\n", "test")
    raw = apply_sets(raw, ["hyperparameters.learning_rate=3e-4", "hyperparameters.policy_kwargs.net_arch=[64, 64]"])
    cfg = RunConfig.from_dict(raw)
    assert cfg.timesteps == 1_000_000 and isinstance(cfg.timesteps, int)
    assert cfg.hyperparameters["buffer_size"] == 100_000 and isinstance(cfg.hyperparameters["buffer_size"], int)
    assert cfg.hyperparameters["learning_rate"] == pytest.approx(3e-4)
    assert cfg.hyperparameters["policy_kwargs"] == {"net_arch": [64, 64]}
    with pytest.raises(CLIError, match="timesteps"):
        RunConfig.from_dict({**raw, "timesteps": 12.5})
    with pytest.raises(CLIError, match="gamma"):
        RunConfig.from_dict({**raw, "hyperparameters": {"gamma": "high"}})
    with pytest.raises(CLIError, match="tensorboard_log"):
        RunConfig.from_dict({**raw, "hyperparameters": {"tensorboard_log": "tb"}})


def test_a_sac_config_gives_sb3s_action_noise_by_class_name():
    """A config holds no objects: action_noise is given as the model file keeps it, SB3's class by name and its
    arguments (Ornstein-Uhlenbeck's theta and dt default to SB3's)."""
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    from covey.cli.config import agent_kwargs

    def noise(entry):
        text = f"agent: sac\nenv: Pendulum-v1\nhyperparameters: {{action_noise: {entry}}}\n"
        return agent_kwargs(RunConfig.from_dict(parse_yaml(text, "test")))["action_noise"]

    normal = noise("{class: NormalActionNoise, mean: [0.0], sigma: [0.3]}")
    assert type(normal) is NormalActionNoise and normal._sigma.tolist() == [0.3]
    from covey import SAC

    assert SAC("MlpPolicy", "Pendulum-v1", action_noise=normal, learning_starts=0, batch_size=8).learn(4).num_timesteps
    ou = noise("{class: OrnsteinUhlenbeckActionNoise, mean: [0.0], sigma: [0.2]}")
    assert type(ou) is OrnsteinUhlenbeckActionNoise and (ou._theta, ou._dt) == (0.15, 1e-2)
    with pytest.raises(CLIError, match=r"hyperparameters.action_noise=.*'normal'.*class: NormalActionNoise"):
        noise("{class: normal, mean: [0.0], sigma: [0.3]}")


def test_linear_schedule_falls_from_its_initial_value_to_zero():
    schedule = linear_schedule(1e-3)
    assert schedule(1.0) == pytest.approx(1e-3) and schedule(0.25) == pytest.approx(2.5e-4) and schedule(0.0) == 0.0


def test_a_resumed_run_continues_its_learning_rate_schedule(tmp_path):
    # ppo_cartpole.yaml's learning rate is lin_1e-3: a run stopped at 1024 steps and resumed to 2048 trains its
    # second half at the rates of a run of 2048 steps from the start.
    quiet = ["eval_episodes=0", "checkpoint_freq=0"]
    covey("train", CONFIGS / "ppo_cartpole.yaml", "--set", "timesteps=2048", *quiet, "--run-dir", "whole", cwd=tmp_path)
    covey("train", CONFIGS / "ppo_cartpole.yaml", "--set", "timesteps=1024", *quiet, "--run-dir", "split", cwd=tmp_path)
    covey("resume", "split", "--timesteps", "2048", cwd=tmp_path)

    def rates(run: str) -> dict[int, float]:
        rows = read_rows(tmp_path / run / "progress.csv")
        return {
            int(float(r["time/total_timesteps"])): float(r["train/learning_rate"])
            for r in rows
            if r["train/learning_rate"]
        }

    whole, split = rates("whole"), rates("split")
    later = sorted(step for step in split if step > 1024)  # rows after the resumed run's first update
    assert later == [1536, 1792, 2048]
    assert [split[step] for step in later] == pytest.approx([whole[step] for step in later], rel=1e-9)
    assert whole[later[-1]] == pytest.approx(1e-3 * (1 - (later[-1] - 256) / 2048))  # the update before the row


# ---------------------------------------------------------------------------- resume and Ctrl-C
def interrupt_after_the_first_log_row(
    args: list[str], run: pathlib.Path, whole_group: bool = False, signum: int = signal.SIGINT
) -> str:
    """Runs ``covey train *args`` in ``run``'s parent, Ctrl-Cs it (or sends ``signum``) once ``run`` has its first
    progress row, and returns its stderr once it has exited as an interrupted run exits (130 after Ctrl-C, 143 after
    SIGTERM). ``whole_group``: the signal goes to every process of the command's group, as a terminal sends it,
    else to the training process alone."""
    process = subprocess.Popen(
        [sys.executable, "-m", "covey", "train", *args],
        cwd=run.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=whole_group,  # a process group of its own, as a terminal gives a command
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        progress = run / "progress.csv"
        if progress.is_file() and len(progress.read_text().splitlines()) >= 2:
            break
        time.sleep(0.02)
    if whole_group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == (143 if signum == signal.SIGTERM else 130), stderr[-3000:]
    return stderr


def test_ctrl_c_saves_a_checkpoint_and_resume_finishes_the_budget(tmp_path):
    from covey.agents import load

    budget = 48 * 256  # 48 rollouts of 8 envs x 32 steps
    run = tmp_path / "run"
    stderr = interrupt_after_the_first_log_row(
        [str(CONFIGS / "ppo_cartpole.yaml"), "--run-dir", "run"]
        + ["--set", f"timesteps={budget}", "eval_freq=4096", "eval_episodes=2", "checkpoint_freq=0"],
        run,
    )
    assert f"covey train --resume {pathlib.Path('run')}" in stderr
    steps = [int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.zip")]
    assert len(steps) == 1 and 0 < steps[0] < budget
    assert not (run / "model.zip").exists()
    before = progress_steps(run)
    assert before[-1] <= steps[0]

    covey("train", "--resume", "run", cwd=tmp_path)
    model = load(run / "model.zip")
    assert model.num_timesteps == budget
    after = progress_steps(run)
    assert after[: len(before)] == before  # the logs were appended to, not rewritten
    # and the step count went on where it stopped (a row per rollout, and one per evaluation)
    assert after == sorted([*range(256, budget + 1, 256), 4096, 8192, budget])
    assert int(read_rows(run / "evaluations.csv")[-1]["timesteps"]) == budget


def test_sigterm_saves_a_checkpoint_to_resume_from(tmp_path):
    """A cluster's scheduler stops a job with SIGTERM: the run saves a checkpoint as on Ctrl-C, and resumes."""
    from covey.agents import load

    budget = 24 * 256
    run = tmp_path / "run"
    stderr = interrupt_after_the_first_log_row(
        [str(CONFIGS / "ppo_cartpole.yaml"), "--run-dir", "run", "--quiet"]
        + ["--set", f"timesteps={budget}", "eval_freq=0", "checkpoint_freq=0"],
        run,
        signum=signal.SIGTERM,
    )
    assert "covey: SIGTERM: saving a checkpoint after the current update" in stderr
    assert f"covey train --resume {pathlib.Path('run')}" in stderr
    steps = [int(p.stem.split("_")[1]) for p in (run / "checkpoints").glob("step_*.zip")]
    assert len(steps) == 1 and 0 < steps[0] < budget
    covey("train", "--resume", "run", cwd=tmp_path)
    assert load(run / "model.zip").num_timesteps == budget


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_the_whole_group_saves_a_checkpoint_with_the_copies_in_worker_processes(tmp_path, signum):
    """A terminal's Ctrl-C, or a cluster scheduler's SIGTERM, signals every process of the group, the env's worker
    processes too (n_processes=2). Ctrl-C they leave to the training process, which finishes its update on the same
    copies and saves a checkpoint; SIGTERM ends them, and the training process saves the model as it stands."""
    run = tmp_path / "run"
    stderr = interrupt_after_the_first_log_row(
        ["poca", "--env", "mpe2:simple_spread_v3", "--n-envs", "4", "--run-dir", "run", "--quiet"]
        + ["--set", "n_processes=2", "timesteps=1000000", "eval_freq=0", "checkpoint_freq=0"],
        run,
        whole_group=True,
        signum=signum,
    )
    assert "checkpoint saved at step" in stderr and "covey train --resume run" in stderr
    assert len(list((run / "checkpoints").glob("step_*.zip"))) == 1
    # (how it ended, forkserver, itself signalled, cannot always tell)
    assert ("the worker process stepping env copies 2-3 ended too (" in stderr) == (signum == signal.SIGTERM)


def test_a_run_that_stopped_before_its_first_checkpoint_is_named_so_with_the_way_out(tmp_path):
    """Killed before its first checkpoint, a run folder can be neither resumed nor trained into: both say to
    remove it (or to train into another folder), instead of pointing at each other."""
    run = tmp_path / "early"
    run.mkdir()
    (run / "config.yaml").write_text((CONFIGS / "ppo_cartpole.yaml").read_text())
    again = covey("train", CONFIGS / "ppo_cartpole.yaml", "--run-dir", "early", cwd=tmp_path, check=False)
    assert again.returncode == 2 and "stopped before its first checkpoint" in again.stderr
    assert "Remove the folder to start it over" in again.stderr and "--resume" not in again.stderr
    resumed = covey("resume", "early", cwd=tmp_path, check=False)
    assert resumed.returncode == 2 and "Start it over: remove the folder" in resumed.stderr


def test_a_config_after_set_is_named_as_taken_by_it(tmp_path):
    result = covey("train", "--set", "timesteps=2000", CONFIGS / "ppo_cartpole.yaml", cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "--set took" in result.stderr and "put the config or agent name before --set" in result.stderr
    assert "--set timesteps=2000" in result.stderr and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_sac_resume_restores_the_replay_buffer(tmp_path):
    from covey.agents import load

    sets = ["timesteps=300", "eval_freq=0", "eval_episodes=1", "hyperparameters.learning_starts=100"]
    covey("train", CONFIGS / "sac_pendulum.yaml", "--set", *sets, "--run-dir", "run", cwd=tmp_path)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert (checkpoints / "step_300.replay.npz").is_file()
    covey("resume", "run", "--timesteps", "500", cwd=tmp_path)
    assert load(tmp_path / "run" / "model.zip").num_timesteps == 500
    assert [p.name for p in checkpoints.glob("*.replay.npz")] == ["step_500.replay.npz"]  # only the latest
    with np.load(checkpoints / "step_500.replay.npz", allow_pickle=False) as replay:
        position = int(replay["meta"][2])
    assert position == 500  # the 300 transitions of the first part are still in the buffer


def test_resume_refuses_to_change_the_run(ppo_run):
    result = covey("resume", ppo_run, "--set", "hyperparameters.n_steps=64", cwd=ppo_run.parent, check=False)
    assert result.returncode == 2 and "hyperparameters.n_steps" in result.stderr


# ---------------------------------------------------------------------------- eval, enjoy, export, plot
def test_eval_prints_mean_and_std(ppo_run):
    result = covey("eval", ppo_run, "--episodes", "3", cwd=ppo_run.parent)
    match = re.search(r"mean return: (-?\d+\.\d+) \+/- (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert 1.0 <= float(match.group(1)) <= 500.0  # CartPole returns count steps, at most 500
    bare = covey("eval", ppo_run / "model.zip", cwd=ppo_run.parent, check=False)
    assert bare.returncode == 2 and "--env" in bare.stderr


def test_enjoy_records_a_gym_episode(ppo_run):
    out = ppo_run.parent / "cartpole.gif"
    result = covey("enjoy", ppo_run, "--gif", out, "--max-frames", "60", "--episodes", "2", cwd=ppo_run.parent)
    assert 1 < gif_frames(out) <= 60
    # the cap cut the recording: said, with what it means for the returns printed
    assert "reached --max-frames 60" in result.stderr and "of 2 episode(s) played" in result.stderr
    for flag in ("--fps", "--max-frames", "--episodes"):
        refused = covey("enjoy", ppo_run, "--gif", out, flag, "0", cwd=ppo_run.parent, check=False)
        assert refused.returncode == 2 and f"{flag} must be >= 1, got 0" in refused.stderr


def test_enjoy_records_a_pettingzoo_team(poca_run):
    out = poca_run.parent / "team.gif"
    result = covey("enjoy", poca_run, "--gif", out, "--episodes", "1", cwd=poca_run.parent)
    assert gif_frames(out) > 1 and "1 episode(s)" in result.stdout


@needs_onnx_exporter()
def test_export_writes_a_verified_onnx(ppo_run):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = ppo_run.parent / "policy.onnx"
    result = covey("export", ppo_run, "--onnx", out, cwd=ppo_run.parent)
    assert out.is_file() and out.stat().st_size > 0
    assert "verified: True" in result.stdout


def test_export_sb3_writes_a_file_that_sb3s_own_load_reads(ppo_run, poca_run):
    """``covey export RUN --sb3 FILE``: SB3's PPO file of the run's model, which ``stable_baselines3.PPO.load`` reads
    and which acts as the covey model; a POCA team, which SB3 has no model of, is refused with the reason."""
    import numpy as np
    import stable_baselines3

    from covey.agents import load
    from covey.cli.training import RunFolder

    out = ppo_run.parent / "sb3_policy.zip"
    result = covey("export", ppo_run, "--sb3", out, cwd=ppo_run.parent)
    assert "verified: True" in result.stdout
    theirs = stable_baselines3.PPO.load(out)
    ours = load(RunFolder(ppo_run).latest_model())
    assert theirs.num_timesteps == ours.num_timesteps > 0
    obs = np.random.default_rng(0).uniform(-0.2, 0.2, (64, 4)).astype(np.float32)
    np.testing.assert_array_equal(theirs.predict(obs, deterministic=True)[0], ours.predict(obs, deterministic=True)[0])
    refused = covey("export", poca_run, "--sb3", cwd=poca_run.parent, check=False)
    assert refused.returncode == 2 and "SB3 has no POCA" in refused.stderr
    assert not (poca_run / "model_sb3.zip").exists()


def test_plot_overlays_two_runs(ppo_run, poca_run):
    out = ppo_run.parent / "both.png"
    covey("plot", ppo_run, poca_run, "--out", out, cwd=ppo_run.parent)
    assert_png(out)


# ---------------------------------------------------------------------------- configs and demo
def test_every_shipped_config_validates(tmp_path):
    configs = sorted(CONFIGS.glob("*.yaml"))
    assert {p.stem for p in configs} == SHIPPED
    result = covey("check", *configs, cwd=tmp_path)
    assert result.stdout.count("ok ") == len(configs), result.stdout
    assert not list(tmp_path.iterdir())  # checking trains nothing and writes nothing


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(scale=float("inf")), r"--scale must be a finite number > 0, got inf"),
        (dict(threads=0), r"--threads must be a whole number >= 1"),
        (dict(out=""), r"--out is empty \(an unset shell variable\?\)"),
        (dict(out="afile"), r"--out afile is a file; name a folder"),
        (dict(out="afile/sub"), r"--out afile/sub cannot be created"),
    ],
)
def test_demo_refuses_what_it_cannot_run_with_the_fix(kwargs, message, tmp_path, monkeypatch):
    """An infinite scale, no threads, an empty --out (which trained into the working folder) or a file where the
    folder goes: named by the demo's own flags, before any training (tracebacks, or the wording of covey train's
    --run-dir and torch_threads, before)."""
    from covey.cli.config import CLIError
    from covey.cli.demo import run_demo

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    with pytest.raises(CLIError, match=message):
        run_demo(**{"scale": 0.01, **kwargs})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_run_folder_given_where_a_config_or_a_run_goes_is_named_with_the_command_that_takes_it(tmp_path):
    """covey train on a run folder, or covey resume on the folder that holds runs (the demo's): the error names
    the command to use, or the run folders inside."""
    run = tmp_path / "demo" / "ppo-CartPole-v1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("agent: ppo\nenv: CartPole-v1\n")
    result = covey("train", run, cwd=tmp_path, check=False)
    assert result.returncode == 2 and f"is a run folder: go on training it with covey resume {run}" in result.stderr
    result = covey("resume", tmp_path / "demo", cwd=tmp_path, check=False)
    assert result.returncode == 2 and f"the run folders in it: {run}." in result.stderr


@pytest.mark.parametrize("how", ["code", "interrupt"])
def test_an_interrupted_demo_says_what_it_left_and_how_to_run_it_again(how, tmp_path, capsys, monkeypatch):
    """Ctrl-C in a demo's training (the run saves and returns 130) or after it: the demo says it does not go on from
    there and how to run it again, where it passed on the run's resume hint alone (or said nothing)."""
    from covey.cli import demo, training

    def stopped(cfg, run_dir, **kwargs):
        if how == "interrupt":
            raise KeyboardInterrupt
        return 130

    monkeypatch.setattr(training, "start", stopped)
    assert demo.run_demo(0.01, tmp_path / "demo") == 130
    err = capsys.readouterr().err
    assert "covey demo: stopped" in err and f"another --out (or remove {tmp_path / 'demo'})" in err
    assert ("during PPO CartPole-v1" in err) == (how == "code")


@pytest.mark.slow
def test_demo_at_a_tiny_scale(tmp_path):
    result = covey("demo", "--scale", "0.01", "--out", "demo", cwd=tmp_path)
    table = result.stdout
    assert "trained return" in table and "random return" in table
    assert re.search(r"PPO CartPole-v1\s+[\d,]+\s+\d+\s+-?\d", table)
    assert re.search(r"POCA simple_spread\s+[\d,]+\s+\d+\s+-?\d", table)
    for name in ("ppo-CartPole-v1", "poca-simple_spread"):
        assert (tmp_path / "demo" / name / "model.zip").is_file()
        assert_png(tmp_path / "demo" / name / "curve.png")
    assert gif_frames(tmp_path / "demo" / "simple_spread.gif") > 1
    assert_png(tmp_path / "demo" / "curves.png")


class _Rendered:
    """A PettingZoo env whose render() gives a tiny RGB frame."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def render(self):
        return np.zeros((2, 2, 3), np.uint8)


class _MemoryProbe:
    """A team policy whose state counts its calls: it records the state and episode starts it is given."""

    def __init__(self):
        self.calls: list[tuple] = []

    def predict(self, observation, state=None, episode_start=None, deterministic=False):
        self.calls.append((state, dict(episode_start)))
        return {a: 0 for a in observation}, len(self.calls)


def test_a_recorded_team_episode_carries_the_policys_memory():
    """The GIF recorder plays a team as evaluate_group does: the state predict returns comes back at the next
    step, and episode_start is True only at an agent's first step; the episode ends with its agents."""
    from covey.cli.evaluation import _play_group
    from covey.envs import EarlyExitEnv
    from covey.evaluation import group_episodes

    probe, frames = _MemoryProbe(), []
    total = _play_group(probe, _Rendered(EarlyExitEnv()), 3, True, frames, 1000)
    assert [state for state, _ in probe.calls] == [None, *range(1, 8)]  # 8 steps of the episode
    assert probe.calls[0][1] == dict.fromkeys(["agent_0", "agent_1", "agent_2"], True)
    assert all(not any(starts.values()) for _, starts in probe.calls[1:])
    assert len(frames) == 9 and total == group_episodes(_MemoryProbe(), EarlyExitEnv(), 1, True, 3)[0][0]


def test_a_run_with_no_log_row_yet_draws_no_curve_and_says_nothing(tmp_path, capsys):
    """Ctrl-C before the first log row: the interrupted run has nothing to plot, which is not a failure."""
    from covey.cli.training import RunFolder, draw_curve

    (tmp_path / "progress.csv").write_text("time/total_timesteps,rollout/ep_rew_mean\n")
    assert draw_curve(RunFolder(tmp_path)) is None
    assert capsys.readouterr().err == "" and not (tmp_path / "curve.png").exists()
    (tmp_path / "progress.csv").write_text("time/total_timesteps,rollout/ep_rew_mean\n256,20.5\n512,22.0\n")
    assert draw_curve(RunFolder(tmp_path)) == tmp_path / "curve.png"
    assert_png(tmp_path / "curve.png")


# ---------------------------------------------------------------------------- edges of the run folder
def test_a_run_dir_that_is_a_file_and_a_budget_below_the_runs_steps_are_refused(ppo_run):
    afile = ppo_run.parent / "notes.txt"
    afile.write_text("mine")
    result = covey("train", CONFIGS / "ppo_cartpole.yaml", "--run-dir", afile, cwd=ppo_run.parent, check=False)
    assert result.returncode == 2 and "is a file, not a folder" in result.stderr
    assert "Traceback" not in result.stderr and afile.read_text() == "mine"
    config = (ppo_run / "config.yaml").read_text()
    smaller = covey("resume", ppo_run, "--timesteps", "1000", cwd=ppo_run.parent, check=False)
    assert smaller.returncode == 2 and "already at step 2,048, past timesteps=1,000" in smaller.stderr
    assert (ppo_run / "config.yaml").read_text() == config  # the run keeps its budget


def test_resuming_a_run_that_finished_past_its_budget_finds_it_finished(tmp_path):
    """Training runs whole rollouts, so a finished run may stand past its budget (100 steps in rollouts of 64:
    128). Resuming it without a new budget (a re-queued job's `covey resume DIR`) finds it done, as one that
    ended on its budget, where it was refused as if a smaller budget had been given."""
    run = tmp_path / "run"
    sets = ["hyperparameters.n_steps=64", "hyperparameters.batch_size=64", "eval_episodes=0", "checkpoint_freq=0"]
    covey("train", "ppo", "--env", "CartPole-v1", "--timesteps", "100", "--run-dir", run, "--set", *sets, cwd=tmp_path)
    logs = sorted(run.glob("events.out.tfevents.*")), (run / "progress.csv").read_text()
    for _ in range(2):
        again = covey("resume", run, cwd=tmp_path, check=False)
        assert again.returncode == 0, again.stderr
        assert "already at step 128, its budget 100 spent" in again.stderr
        assert "Traceback" not in again.stderr
    # nothing trained, nothing logged: no empty TensorBoard file per resume
    assert (sorted(run.glob("events.out.tfevents.*")), (run / "progress.csv").read_text()) == logs


def test_resuming_a_finished_run_whose_evaluations_file_is_gone_evaluates_its_model(tmp_path):
    """A finished run without evaluations.csv (removed by hand) resumes as one whose final evaluation is missing:
    it evaluates the final model and writes the file (it failed reading the file, with a traceback)."""
    run = tmp_path / "run"
    sets = ["hyperparameters.n_steps=64", "hyperparameters.batch_size=64", "eval_episodes=1", "checkpoint_freq=0"]
    covey("train", "ppo", "--env", "CartPole-v1", "--timesteps", "64", "--run-dir", run, "--set", *sets, cwd=tmp_path)
    (run / "evaluations.csv").unlink()
    again = covey("resume", run, cwd=tmp_path, check=False)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    rows = (run / "evaluations.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("64,")


def test_the_latest_model_of_a_run_extended_and_stopped_is_its_latest_checkpoint(tmp_path):
    """A finished run (model.zip) extended by a resume that was stopped: eval, enjoy and export take the
    checkpoint that is further on, not the older final model."""
    from covey import PPO
    from covey.cli.training import RunFolder

    folder = RunFolder(tmp_path / "run")
    folder.checkpoints.mkdir(parents=True)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16)
    model.num_timesteps = 512
    model.save(folder.model)
    assert folder.latest_model() == folder.model
    model.num_timesteps = 1024
    for path in folder.checkpoint(1024):
        model.save(path) if path.suffix == ".zip" else path.write_text("{}")
    assert folder.latest_model() == folder.checkpoint(1024)[0]
    model.num_timesteps = 2048
    model.save(folder.model)  # the resume finished: its final model is the latest again
    assert folder.latest_model() == folder.model


def test_an_enjoyed_episodes_return_is_the_envs_own_as_eval_counts_it():
    """With a reward wrapper above the Monitor, the recorded episode's return is the Monitor's (the env's own
    rewards), as eval's is, not the wrapped rewards' sum."""
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    from covey import PPO
    from covey.cli.evaluation import _play_single

    env = gym.wrappers.TransformReward(Monitor(gym.make("CartPole-v1", render_mode="rgb_array")), lambda r: 0.5 * r)
    frames = []
    total = _play_single(PPO("MlpPolicy", "CartPole-v1", seed=0), env, 0, True, frames, max_frames=1000)
    assert total == len(frames) - 1  # CartPole pays 1 a step; the wrapped rewards sum to half of it


def test_a_yaml_or_json_error_is_one_line():
    with pytest.raises(CLIError) as info:
        parse_yaml('{"N": 3', "--env-kwargs")
    assert "\n" not in str(info.value) and "--env-kwargs is not valid YAML" in str(info.value)
    assert "line 1, column" in str(info.value)


def test_an_output_path_that_is_a_folder_is_a_cli_error_not_a_traceback(ppo_run, capsys):
    from covey.cli import main

    folder = ppo_run.parent / "a_folder"
    folder.mkdir(exist_ok=True)
    for argv, words in (
        (["plot", str(ppo_run), "--out", str(folder)], "is a folder; pass the path of the image file"),
        (["enjoy", str(ppo_run), "--gif", str(folder), "--max-frames", "5"], "is a folder"),
        (["export", str(ppo_run), "--onnx", str(folder)], "is a folder; pass the path of the .onnx file"),
    ):
        if argv[0] == "export":
            pytest.importorskip("onnxruntime")
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("covey: error:") and words in err, err
    assert list(folder.iterdir()) == []


def test_a_gymnasium_module_that_is_not_installed_is_named_without_pettingzoos_hint(tmp_path):
    from covey.cli import main
    from covey.cli.envs import check_gym_spec, gym_env_fn

    assert main(["train", "ppo", "--env", "no_such_pkg:Thing-v0", "--run-dir", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()
    check_gym_spec("no_such_pkg:Thing-v0", "ppo")  # not taken for a PettingZoo env: gym.make names the module
    with pytest.raises(CLIError, match="No module named 'no_such_pkg'") as caught:
        gym_env_fn("no_such_pkg:Thing-v0", {}, [])()
    assert "pettingzoo" not in str(caught.value)


def test_a_folder_that_holds_a_model_but_no_resumable_run_is_not_sent_to_resume(tmp_path):
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "model.zip").write_bytes(b"a model saved from Python")
    result = covey("train", CONFIGS / "ppo_cartpole.yaml", "--run-dir", "saved", cwd=tmp_path, check=False)
    assert result.returncode == 2 and "a model.zip but no run (no config.yaml)" in result.stderr
    assert "--resume" not in result.stderr
    (tmp_path / "saved" / "config.yaml").write_text((CONFIGS / "ppo_cartpole.yaml").read_text())
    result = covey("train", CONFIGS / "ppo_cartpole.yaml", "--run-dir", "saved", cwd=tmp_path, check=False)
    assert result.returncode == 2 and "a run with no checkpoint to resume from" in result.stderr
    assert "--resume" not in result.stderr


def test_a_teams_evaluations_score_the_envs_own_rewards_under_reward_wrappers():
    """As PPO's and SAC's evaluations score the Monitor's returns (the env's own rewards), a POCA run's score the
    rewards the PettingZoo env paid, not the ones a reward wrapper (clip_reward_v0) trains on."""
    from mpe2.simple_tag_v3 import parallel_env as simple_tag

    from covey.cli.envs import env_fn
    from covey.cli.evaluation import Evaluator
    from covey.evaluation import evaluate_group

    raw = {"agent": "poca", "env": "mpe2:simple_spread_v3", "env_kwargs": {"N": 2, "max_cycles": 10}}
    clip = [{"name": "clip_reward_v0", "kwargs": {"lower_bound": -0.01, "upper_bound": 0.01}}]
    plain, clipped = RunConfig.from_dict(raw), RunConfig.from_dict({**raw, "wrappers": clip})
    model = POCA("MlpPolicy", env_fn(clipped), n_steps=8, batch_size=8, seed=0)
    scored = Evaluator(clipped, episodes=2, deterministic=True, seed=3)(model)
    own = evaluate_group(model, env_fn(plain), n_eval_episodes=2, deterministic=True, seed=3)
    trained_on = evaluate_group(model, env_fn(clipped), n_eval_episodes=2, deterministic=True, seed=3)
    assert scored == pytest.approx((own["group_return"], own["group_return_std"]))
    assert trained_on["group_return"] == pytest.approx(-0.01 * 2 * 10)  # every clipped reward at the bound
    assert own["group_return"] < -1.0
    # one side's run scores that side's own rewards, not the other side's
    from covey.wrappers import one_side

    raw = {"agent": "poca", "env": "mpe2:simple_tag_v3", "env_kwargs": {"max_cycles": 10}}
    side = [{"name": "one_side", "kwargs": {"team": "adversary"}}]
    cfg = RunConfig.from_dict({**raw, "wrappers": [*side, *clip]})
    model = POCA("MlpPolicy", env_fn(cfg), n_steps=8, batch_size=8, seed=0)
    scored = Evaluator(cfg, episodes=2, deterministic=True, seed=3)(model)
    own = evaluate_group(model, lambda: one_side(simple_tag(max_cycles=10), "adversary"), 2, True, 3)
    assert scored == pytest.approx((own["group_return"], own["group_return_std"]))
    env = env_fn(cfg, scoring=True)()
    env.reset(seed=0)
    rewards = env.step({agent: 0 for agent in env.agents})[1]
    assert sorted(rewards) == ["adversary_0", "adversary_1", "adversary_2"]  # the prey's are not the team's


def test_the_reward_tap_adds_up_the_rewards_of_several_steps_of_the_env():
    """A wrapper that steps the env twice per step of its own (SuperSuit's frame_skip) pays the two steps' rewards
    in one: the scored reward is their sum."""
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseParallelWrapper

    from covey.wrappers.rewards import OwnRewards, RewardTap

    class Twice(BaseParallelWrapper):
        def step(self, actions):
            self.env.step(actions)
            return self.env.step(actions)

    tap = RewardTap(simple_spread_v3.parallel_env(N=2, max_cycles=10))
    env, twin = OwnRewards(Twice(tap), tap), simple_spread_v3.parallel_env(N=2, max_cycles=10)
    env.reset(seed=0)
    twin.reset(seed=0)
    actions = {agent: 1 for agent in twin.agents}
    first, second = twin.step(actions)[1], twin.step(actions)[1]
    assert env.step(actions)[1] == pytest.approx({agent: first[agent] + second[agent] for agent in first})


@pytest.mark.parametrize(
    "args",
    [
        ["train", "ppo", "--env", "CartPole-v1", "--timesteps", "1000", "--set", "timesteps=64"],
        ["train", "ppo", "--env", "CartPole-v1", "--seed", "1", "--set", "seed=2"],
        ["resume", "RUN", "--timesteps", "1e3", "--set", "timesteps=2000"],
    ],
    ids=["train timesteps", "train seed", "resume timesteps"],
)
def test_a_key_given_by_its_flag_and_by_set_is_refused(tmp_path, capsys, args):
    """train let --set win and resume let the flag win, silently; either way one of the two was dropped."""
    from covey.cli import main

    args = [str(tmp_path / "run") if a == "RUN" else a for a in args]
    if args[0] == "train":
        args += ["--run-dir", str(tmp_path / "run")]
    assert main(args) == 2
    key = args[args.index("--set") + 1].split("=")[0]
    assert f"--{key} and --set {key}=... both give {key}: give it once." in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["model", "state"])
def test_a_damaged_latest_checkpoint_is_named_with_the_way_to_the_one_before(ppo_run, tmp_path, capsys, damage):
    """A truncated checkpoint file (a crash or a full disk while it was written) ended resume in a traceback."""
    from covey.cli import main
    from covey.cli.training import RunFolder

    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    steps = RunFolder(run).checkpoint_steps()
    assert len(steps) > 1
    model, state = RunFolder(run).checkpoint(steps[-1])
    damaged = model if damage == "model" else state
    os.truncate(damaged, damaged.stat().st_size // 2)
    assert main(["resume", str(run), "--timesteps", str(2 * steps[-1])]) == 2
    err = capsys.readouterr().err
    assert f"its {damage}, {damaged.name}, is damaged" in err and "Traceback" not in err
    assert f"Remove checkpoints/step_{steps[-1]}.* from the run folder to resume from the checkpoint before it" in err


def test_run_dirs_and_config_files_that_cannot_be_used_are_named(tmp_path, capsys):
    """An empty --run-dir (an unset shell variable) trained into the current folder; a folder that cannot be made
    and a config that is not UTF-8 or is a folder ended in tracebacks."""
    from covey.cli import main

    short = ["train", "ppo", "--env", "CartPole-v1", "--timesteps", "64"]
    (tmp_path / "afile").write_text("mine")
    cases = [
        ([*short, "--run-dir", ""], "--run-dir is empty (an unset shell variable?)"),
        ([*short, "--run-dir", str(tmp_path / "afile" / "sub")], "cannot be created (Not a directory)"),
    ]
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfeagent: ppo\n")
    (tmp_path / "folder.yaml").mkdir()
    cases += [
        (["check", str(tmp_path / "binary.yaml")], "binary.yaml is not UTF-8 text"),
        (["train", str(tmp_path / "folder.yaml")], "folder.yaml' is a folder; give the YAML file in it"),
    ]
    cases += [(["resume", str(tmp_path / "no_such_run")], "no_such_run does not exist: give the run folder")]
    for args, message in cases:
        assert main(args) == 2, args
        out = capsys.readouterr()
        assert message in out.err + out.out  # (check reports each config on stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "binary.yaml", "folder.yaml"]


def test_a_budget_below_one_rollout_is_warned_of_with_the_steps_it_trains(tmp_path, capsys):
    from covey.cli import main

    sets = ["eval_episodes=0", "hyperparameters.n_steps=64", "hyperparameters.batch_size=64", "n_envs=2"]
    args = ["train", "ppo", "--env", "CartPole-v1", "--timesteps", "100", "--run-dir", str(tmp_path / "r")]
    assert main([*args, "--set", *sets]) == 0
    out = capsys.readouterr()
    err = out.err
    assert (
        "timesteps=100 is less than one rollout (n_steps=64 x 2 envs): training runs whole rollouts, so this "
        "run trains 128 steps." in err
    )
    assert "done, 128 steps" in out.out and "128/128" in err  # the progress bar's total: the steps it trains


def test_every_command_argument_and_flag_has_help():
    """`covey COMMAND --help` describes the command and each of its arguments."""
    import argparse

    from covey.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in sub.choices.items():
        assert parser.description, name
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, (name, action.dest)


def test_resuming_a_run_stopped_during_its_final_evaluation_evaluates_it(ppo_run, tmp_path, capsys):
    """A second Ctrl-C during the final evaluation stops the run at its budget without it; resume then found the
    run done and left evaluations.csv without its last row. It evaluates the final model now, once."""
    from covey.cli import main

    run = tmp_path / "run"
    shutil.copytree(ppo_run, run)
    rows = (run / "evaluations.csv").read_text().splitlines()
    assert rows[-1].startswith("2048,")
    (run / "evaluations.csv").write_text("\n".join(rows[:-1]) + "\n")  # as the stop during it left the file

    def logged_evaluations() -> list[int]:
        with open(run / "progress.csv", newline="") as f:
            return [int(float(r["time/total_timesteps"])) for r in csv.DictReader(f) if r.get("eval/mean_reward")]

    before = logged_evaluations()
    assert main(["resume", str(run)]) == 0
    again = (run / "evaluations.csv").read_text().splitlines()
    assert again[:-1] == rows[:-1] and again[-1].startswith("2048,")
    assert logged_evaluations() == [*before, 2048]  # and its row in the logs
    assert main(["resume", str(run)]) == 0
    assert (run / "evaluations.csv").read_text().splitlines() == again  # evaluated once
    capsys.readouterr()


def test_eval_says_it_does_not_read_vecnormalize_statistics_beside_the_model(tmp_path):
    """RL Zoo writes <env>.zip and <env>/vecnormalize.pkl; SB3's docs save vecnormalize.pkl beside the model.
    covey eval reads no pickle, so such a model played on raw observations without a word (scoring lower)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from covey import PPO

    venv = VecNormalize(make_vec_env("CartPole-v1", n_envs=1))
    PPO("MlpPolicy", venv, n_steps=16, batch_size=16).save(tmp_path / "CartPole-v1.zip")
    quiet = covey("eval", tmp_path / "CartPole-v1.zip", "--env", "CartPole-v1", "--episodes", "1", cwd=tmp_path)
    assert "VecNormalize" not in quiet.stderr
    (tmp_path / "CartPole-v1").mkdir()
    venv.save(tmp_path / "CartPole-v1" / "vecnormalize.pkl")
    notice = "vecnormalize.pkl holds SB3's VecNormalize statistics, which this command does not read"
    for model in ("CartPole-v1.zip", "best_model.zip"):  # RL Zoo's best model sits beside the env folder too
        (tmp_path / model).write_bytes((tmp_path / "CartPole-v1.zip").read_bytes())
        said = covey("eval", tmp_path / model, "--env", "CartPole-v1", "--episodes", "1", cwd=tmp_path)
        assert notice in said.stderr and "mean return" in said.stdout, model
    checkpoints = tmp_path / "checkpoints"  # SB3's CheckpointCallback(save_vecnormalize=True)
    checkpoints.mkdir()
    (checkpoints / "rl_model_16_steps.zip").write_bytes((tmp_path / "CartPole-v1.zip").read_bytes())
    venv.save(checkpoints / "rl_model_vecnormalize_16_steps.pkl")
    said = covey("eval", checkpoints / "rl_model_16_steps.zip", "--env", "CartPole-v1", "--episodes", "1", cwd=tmp_path)
    assert "rl_model_vecnormalize_16_steps.pkl holds SB3's VecNormalize statistics" in said.stderr


def test_eval_of_a_run_folder_replays_its_last_evaluation(poca_run):
    """By default eval plays a run folder's own evaluation episodes (its seed + 1000), so it prints the run's last
    evaluation; it played seed 0 before, a different score for the same model. --seed still picks the episodes."""
    last = read_rows(poca_run / "evaluations.csv")[-1]
    assert int(last["timesteps"]) == 1536
    result = covey("eval", poca_run, "--episodes", "2", cwd=poca_run.parent)
    match = re.search(r"mean group return \(sum over the team\): (-?\d+\.\d+) \+/- (\d+\.\d+)", result.stdout)
    assert match, result.stdout
    assert float(match.group(1)) == pytest.approx(float(last["mean_return"]), abs=0.006)
    assert float(match.group(2)) == pytest.approx(float(last["std_return"]), abs=0.006)
    other = covey("eval", poca_run, "--episodes", "2", "--seed", "0", cwd=poca_run.parent)
    assert re.search(r"return \(sum over the team\): (-?\d+\.\d+)", other.stdout).group(1) != match.group(1)


def test_eval_of_a_model_on_an_env_its_wrappers_changed_names_the_run_folder(tmp_path):
    """A team trained with SuperSuit's padding, evaluated as a bare file on the env itself (whose agents differ in
    their spaces): a traceback before, now the error and the way to evaluate it."""
    import supersuit
    from mpe2 import simple_speaker_listener_v4

    from covey import POCA

    def padded():
        return supersuit.pad_action_space_v0(supersuit.pad_observations_v0(simple_speaker_listener_v4.parallel_env()))

    run = tmp_path / "run"
    run.mkdir()
    POCA("MlpPolicy", padded, n_steps=16, batch_size=16).save(run / "model.zip")
    (run / "config.yaml").write_text("agent: poca\nenv: mpe2:simple_speaker_listener_v4\n")  # a run folder's
    env = ("--env", "mpe2:simple_speaker_listener_v4")
    result = covey("eval", run / "model.zip", *env, cwd=tmp_path, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "its agents differ in their spaces (a group shares one observation space, but 'speaker_0'" in result.stderr
    assert f"If it trained with wrappers, evaluate its run folder, whose config names them: {run}." in result.stderr
    assert "one_side" not in result.stderr  # advice on training one side, which evaluating this model needs not
    # the run folder itself, with --env naming the env without its wrappers: the way is to leave --env out
    result = covey("eval", run, *env, cwd=tmp_path, check=False)
    assert result.returncode == 2 and "--env and --env-kwargs replace its env (and keep its wrappers)" in result.stderr
    (run / "model.zip").rename(tmp_path / "model.zip")  # a model file outside any run folder
    result = covey("eval", tmp_path / "model.zip", *env, cwd=tmp_path, check=False)
    assert result.returncode == 2 and "plays only through them" in result.stderr


def test_the_fix_for_a_config_whose_wrapped_team_differs_keeps_the_configs_wrappers(tmp_path):
    """A config that trains one side already, of agents whose action spaces differ: the error's config line put
    the padding in place of the config's one_side, which would have trained every agent as one team."""
    team = "[leadadversary_0, adversary_0]"
    config = (
        "agent: poca\nenv: mpe2:simple_world_comm_v3\nenv_kwargs: {max_cycles: 5}\n"
        f"wrappers: [{{name: one_side, kwargs: {{team: {team}}}}}]\n"
    )
    (tmp_path / "side.yaml").write_text(config)
    result = covey("check", "side.yaml", cwd=tmp_path, check=False)
    said = result.stderr + result.stdout
    assert result.returncode == 2 and "Traceback" not in said
    fix = f"[{{name: one_side, kwargs: {{team: {team}}}}}, {{name: pad_action_space_v0}}]"
    assert f"wrappers: {fix}" in said
    assert "for one side, whose opponents act at random" not in said  # it is one side
    (tmp_path / "fixed.yaml").write_text(config.replace(config.splitlines()[-1], f"wrappers: {fix}"))
    result = covey("check", "fixed.yaml", cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("error", [ImportError, AssertionError])
def test_an_env_name_a_package_lacks_is_the_clis_error_whatever_the_package_raises(monkeypatch, error):
    """PettingZoo before 1.27 answers a name its package lacks (``knights_archers_zombies_v11`` on 1.24) from its
    module ``__getattr__`` with an ImportError or an AssertionError, not the AttributeError that ``getattr``'s
    default catches: the spec was a traceback, where it is the CLI's error naming it."""
    import types

    from covey.cli.envs import parallel_env_factory

    package = types.ModuleType("old_zoo")
    package.__path__ = []  # a package, as pettingzoo.butterfly is

    def missing(name):
        raise error(f"cannot import name {name!r}")

    package.__getattr__ = missing
    monkeypatch.setitem(sys.modules, "old_zoo", package)
    with pytest.raises(CLIError, match=r"'old_zoo:kaz_v11' is not a PettingZoo env: old_zoo.kaz_v11 has no"):
        parallel_env_factory("old_zoo:kaz_v11")


def test_an_env_module_that_fails_on_its_own_dependency_is_named_with_it(monkeypatch, tmp_path):
    """PettingZoo's packages import an env module when its name is read: one that is there but lacks a dependency
    (pygame, Box2D) names the missing package, not "is not a PettingZoo env"."""
    package = tmp_path / "depzoo"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import importlib\n\ndef __getattr__(name):\n    return importlib.import_module(f'{__name__}.{name}')\n"
    )
    (package / "thing_v1.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from covey.cli.config import parse_schedule
    from covey.cli.envs import parallel_env_factory

    with pytest.raises(
        CLIError, match=r"Cannot import depzoo.thing_v1 .*No module named 'not_installed_dependency_xyz'"
    ):
        parallel_env_factory("depzoo:thing_v1")
    with pytest.raises(CLIError, match=r"'depzoo:other_v1' is not a PettingZoo env"):
        parallel_env_factory("depzoo:other_v1")
    with pytest.raises(CLIError, match=r"learning_rate='lin_-0.001' is invalid"):  # a schedule below 0 from the start
        parse_schedule("learning_rate", "lin_-0.001")
    assert parse_schedule("learning_rate", "lin_+1e-3") == 1e-3
