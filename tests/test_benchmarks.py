"""The benchmark harness runs end to end on a tiny budget and prints a table row per task (no timing checks)."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
TASKS = ["ppo_cartpole_8env", "sac_pendulum"]


def table_rows(output: str) -> dict[str, dict[str, str]]:
    """The markdown table as {task: {column header: cell}}."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: dict(zip(header, row)) for row in rows}


def test_compare_quick_smoke():
    command = [sys.executable, "-m", "benchmarks.compare", "--suite", "quick", "--tasks", ",".join(TASKS)]
    result = subprocess.run(
        [*command, "--seeds", "1", "--scale", "0.02"], capture_output=True, text=True, timeout=180, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert sorted(rows) == sorted(TASKS)
    for task in TASKS:
        ratio_column = next(column for column in rows[task] if column.startswith("covey/SB3 time ratio"))
        ratio = float(rows[task][ratio_column].split()[0])
        assert ratio > 0
    assert "python -m benchmarks.compare --suite quick" in result.stdout


def test_profile_smoke():
    """The profile attributes the run's time to phases: one row per task, shares that add up to 100%."""
    command = [sys.executable, "-m", "benchmarks.profile", "--tasks", ",".join(TASKS), "--scale", "0.02"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert sorted(rows) == sorted(TASKS)
    for task in TASKS:
        shares = [float(v.rstrip("%")) for k, v in rows[task].items() if v.endswith("%")]
        assert abs(sum(shares) - 100) <= len(shares)  # rounding of each cell
        assert float(rows[task]["update"].rstrip("%")) > 0


def test_poca_vs_supersuit_smoke():
    """Both learners run on simple_spread and the table has a row for each (no timing checks)."""
    command = [sys.executable, "-m", "benchmarks.poca_vs_supersuit", "--timesteps", "1024", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert {"covey POCA", "SB3 PPO + SuperSuit", "uniform random"} <= set(rows)
    assert float(rows["covey POCA"]["seconds (median)"]) > 0


def test_sac_bf16_smoke():
    """float32 and bf16 SAC run side by side; the table has a row per seed and the median row."""
    command = [sys.executable, "-m", "benchmarks.sac_bf16", "--timesteps", "300", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert {"0", "median"} <= set(rows)
    assert float(rows["0"]["bf16/float32 time"]) > 0


def test_ppo_seeds_smoke():
    """Both PPO updates (hand-written gradients and autograd) train one seed and are tabulated."""
    command = [sys.executable, "-m", "benchmarks.ppo_seeds", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert {"hand-written gradients", "autograd"} <= set(rows)
    for row in rows.values():
        assert 0 < float(row["median return"]) <= 500
