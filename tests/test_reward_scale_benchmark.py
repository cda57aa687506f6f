"""The reward-scale benchmark's entry point runs and prints its table (no timing is checked)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_reward_scale_benchmark_runs():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.reward_scale", "--seeds", "1", "--timesteps", "512"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| scalar |" in result.stdout and "| twohot |" in result.stdout
