"""Every example runs end to end with a tiny budget and prints its result and the steps it trained."""

import pathlib
import re
import subprocess
import sys

import pytest

from covey.agents import load

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "script, extra",
    [
        ("ppo_cartpole.py", []),
        ("ppo_lunarlander.py", []),
        ("ppo_lunarlander.py", ["--continuous"]),
        ("sac_pendulum.py", []),
        ("sac_lunarlander_continuous.py", []),
        ("poca_simple_spread.py", []),
        ("poca_multiwalker.py", []),
        ("poca_kaz.py", []),
        ("ppo_lstm_memory.py", []),
        ("ppo_lstm_memory.py", ["--feed-forward"]),
    ],
)
def test_example_runs(script, extra, tmp_path):
    save = tmp_path / "model.zip"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--timesteps", "1000", "--save", str(save), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "evaluation over" in result.stdout or "return" in result.stdout
    assert save.exists()
    trained = load(save).num_timesteps  # whole rollouts: at least the budget asked for
    assert trained >= 1000 and re.search(rf"\b{trained} (env )?steps", result.stdout), result.stdout
