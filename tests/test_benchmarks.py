"""The benchmark harness runs end to end on a tiny budget and prints a table row per task (no timing checks)."""

import dataclasses
import datetime
import pathlib
import shutil
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from covey.networks import linear

REPO = pathlib.Path(__file__).resolve().parent.parent
TASKS = ["ppo_cartpole_8env", "sac_pendulum"]


def table_cells(output: str) -> list[list[str]]:
    """The markdown table's lines as lists of cells, the header first (its separator line left out)."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def table_rows(output: str) -> dict[str, dict[str, str]]:
    """The markdown table as {task: {column header: cell}}."""
    header, *rows = table_cells(output)
    return {row[0]: dict(zip(header, row)) for row in rows}


def number(cell: str) -> float:
    """The first number of a cell such as ``1,234``, ``-21.5`` or ``0.93 [0.90, 0.97]``."""
    return float(cell.split()[0].replace(",", ""))


def cell(row: dict[str, str], prefix: str) -> str:
    """The cell of the column whose header starts with ``prefix``."""
    return next(value for column, value in row.items() if column.startswith(prefix))


def test_compare_quick_smoke():
    """Single-agent tasks, a _bf16 task beside its float32 twin (sharing its SB3 runs) and the MA-POCA task (POCA
    against SB3 PPO + SuperSuit) beside its width-64 twin in one table."""
    tasks = [*TASKS, "sac_pendulum_bf16", "poca_simple_spread", "poca_simple_spread_width64"]
    command = [sys.executable, "-m", "benchmarks.compare", "--suite", "quick", "--tasks", ",".join(tasks)]
    result = subprocess.run(
        [*command, "--seeds", "1", "--scale", "0.02", "--env-seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert sorted(rows) == sorted(tasks)
    for task in tasks:
        assert number(cell(rows[task], "covey/SB3 time ratio")) > 0
        assert number(cell(rows[task], "raw env steps/s")) > 0
        assert number(cell(rows[task], "covey steps/s")) > 0 and number(cell(rows[task], "SB3 steps/s")) > 0
    fp32, bf16 = rows["sac_pendulum"], rows["sac_pendulum_bf16"]
    for column in ("SB3 s (median)", "SB3 steps/s", "SB3 return (median [min, max])", "raw env steps/s"):
        assert fp32[column] == bf16[column]
    assert "sac_pendulum_bf16 shares SB3's runs with sac_pendulum" in result.stdout
    for column in ("SB3 s (median)", "SB3 return (median [min, max])", "raw env steps/s"):
        assert rows["poca_simple_spread"][column] == rows["poca_simple_spread_width64"][column]
    assert "poca_simple_spread_width64 shares SB3's runs with poca_simple_spread" in result.stdout
    poca = rows["poca_simple_spread"]
    # 2,000 env steps rounded up to whole rollouts of 8 copies x 128 steps, for both learners.
    assert poca["timesteps"] == "2,048"
    for framework in ("covey", "SB3"):
        per_agent_return = number(cell(poca, f"{framework} return"))
        assert per_agent_return <= 0  # simple_spread rewards: minus distances to landmarks and collisions
    assert "poca_simple_spread:" in result.stdout and "per-agent returns" in result.stdout
    assert "python -m benchmarks.compare --suite quick" in result.stdout
    runs = [line for line in result.stderr.splitlines() if " s with setup and evaluation)" in line]
    assert len(runs) == 8  # per seed: 5 covey runs, 3 SB3 runs (the twins share their leads')
    assert "- CPU: " in result.stdout and "torch CPU capability: " in result.stdout
    assert "- code: covey " in result.stdout


def test_compare_rejects_unknown_task():
    command = [sys.executable, "-m", "benchmarks.compare", "--tasks", "poca_simple_spread,nope"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert "unknown task(s) ['nope']" in result.stderr


def test_fast_paths_smoke():
    """Every fast-path ablation runs on a few calls (no torch.compile); each time cell is a positive duration."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.fast_paths",
        *("--repeats", "1", "--calls-scale", "0.05", "--skip-compile"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_cells(result.stdout)[1:]
    measurements = [row[0] for row in rows]
    for setting in ("1 env (batch 64)", "8 envs (batch 256)"):
        assert f"PPO update per minibatch, {setting}" in measurements
        assert f"PPO autograd minibatch step, {setting}" in measurements
    for n in ("1 observation", "8 observations"):
        assert [f"PPO acting, a batch of {n}, VecEnv array to env actions", "NumPy"] in [row[:2] for row in rows]
    fast_bf16 = linear.fast_bfloat16_products()  # without, the bf16_matmuls rows are left out (own test)
    assert measurements.count("SAC gradient step, Pendulum 256x256") == (10 if fast_bf16 else 9)
    against_sb3 = [["covey", "SB3"], ["covey's matrix products alone", "SB3's whole of it"]]
    for what in ("PPO update per minibatch, 1 env (batch 64)", "PPO update per minibatch, 8 envs (batch 256)"):
        assert [[row[1].split(" (")[0], row[3]] for row in rows if row[0] == what and "SB3" in row[3]] == against_sb3
    sac_vs_sb3 = [row for row in rows if row[0] == "SAC gradient step, Pendulum 256x256" and "SB3" in row[3]]
    assert [[row[1].split(" (")[0], row[3]] for row in sac_vs_sb3] == against_sb3
    sac_products = [row[1] for row in rows if row[0] == "SAC gradient step, Pendulum 256x256, hand-written"]
    assert sac_products[0].startswith("its matrix products alone (")  # the same step's products, counted alike
    assert sac_vs_sb3[1][1] == "covey's " + sac_products[0].removeprefix("its ")
    flushing = [row for row in rows if row[0].startswith("SAC gradient step, Pendulum 256x256, after 50 steps (")]
    assert [row[1:4:2] for row in flushing] == [["Adam steps flushing denormals", "not flushing"]]
    assert ["SAC gradient step, Pendulum 256x256", "critics' action gradients g @ W"] in [row[:2] for row in rows]
    assert "\ncode: covey " in result.stdout
    stacked = "SAC's 2 critics, forward and backward, 256 samples (Pendulum 256x256)"
    assert [row[1:4:2] for row in rows if row[0] == stacked] == [["one at a time (covey)", "stacked: batched products"]]
    for setting in ("1 env (batch 64)", "8 envs (batch 256)"):
        assert [f"PPO update per minibatch, {setting}", "torch.tanh"] in [row[:2] for row in rows]
    assert "input gradient of a 4 -> 256 layer on 256 samples" in measurements
    assert ["SAC gradient step, Pendulum 256x256", "hand-written gradients"] in [row[:2] for row in rows]
    bf16_rows = [row for row in rows if row[0] == "SAC gradient step, Pendulum 256x256, bf16_matmuls=True"]
    assert [row[1:4:2] for row in bf16_rows] == (
        [["hand-written gradients", "autograd under autocast"], ["weights rounded once per change", "per product"]]
        if fast_bf16
        else []
    )
    assert ("Left out: the SAC rows with bf16_matmuls=True." in result.stdout) is not fast_bf16
    sde_rows = [row for row in rows if row[0] == "SAC gradient step, Pendulum 256x256, use_sde=True"]
    assert [row[1:4:2] for row in sde_rows] == [["hand-written gradients", "autograd"]]
    assert "POCA critic attention, forward and backward, 256 groups of 3" in measurements
    assert measurements.count("POCA update per minibatch, 256 groups of 3") == 4
    poca_vs_sb3 = [row for row in rows if row[0].startswith("POCA update per minibatch, 256 groups of 3 (SB3's PPO")]
    assert [row[0] for row in poca_vs_sb3] == [
        "POCA update per minibatch, 256 groups of 3 (SB3's PPO: 768 agent entries)"
    ] * 2
    assert [[row[1].split(" (")[0], row[3]] for row in poca_vs_sb3] == against_sb3
    poca_products = [row[1] for row in rows if row[0] == "POCA update per minibatch, 256 groups of 3"]
    assert "its matrix products alone (33 per call)" in poca_products  # MA-POCA's minibatch
    assert poca_vs_sb3[1][1] == "covey's matrix products alone (33 per call)"  # recorded from one minibatch
    assert [row[1:4:2] for row in rows if row[0].endswith("256 groups of 3, every slot present")] == [
        ["present agent-steps by reshape", "by boolean index"]
    ]
    assert [row[1:4:2] for row in rows if row[0] == "POCA rollout evaluation, 1024 group-steps of 3"] == [
        ["passes of 256", "one pass"]
    ]
    softmax = "set attention's masked softmax over 6 entities, 256x4x12, forward"
    assert [row[1] for row in rows if row[0] == softmax] == [
        "keys first (6, 256, 4, 12)",
        "exp floored at -30, masked zeroed",
    ]
    assert "float32 linear layer 256x256x256, forward" in measurements
    assert "linear layer 4 -> 256 on 256 samples, forward and backward" in measurements
    assert "PPO update per minibatch, 256x256 MLPs (batch 256)" in measurements
    sde = "PPO update per minibatch, Pendulum with use_sde (4 envs, batch 64)"
    assert [row[1:4:2] for row in rows if row[0] == sde] == [["hand-written gradients", "autograd"]]
    assert not any("torch.compile" in row[1] for row in rows)
    products = [row for row in rows if row[1].startswith("its matrix products alone (")]
    assert [row[0] for row in products] == [
        "PPO update per minibatch, 1 env (batch 64), hand-written",
        "PPO update per minibatch, 8 envs (batch 256), hand-written",
        "SAC gradient step, Pendulum 256x256, hand-written",
        "POCA update per minibatch, 256 groups of 3",
    ]
    for row in products:
        assert int(row[1].split("(")[1].split()[0]) > 0 and row[3] == "the whole of it", row
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    for row in rows:
        for duration in (row[2], row[4]):
            value, unit = duration.split()
            assert float(value) > 0 and unit in units, row
        assert float(row[5]) > 0, row


def test_against_sb3_rows_counts_and_times_the_products_per_unit_of_the_call_they_are_recorded_from():
    """benchmarks.fast_paths.against_sb3_rows: the products are counted and timed per unit of the call they were
    recorded from (:meth:`MatrixProducts.of`: ``step`` itself, or a part of it); every other time per ``per`` units
    of ``step``."""
    from benchmarks.fast_paths import MatrixProducts, Timer, against_sb3_rows

    class FixedTimer(Timer):  # every pair of calls takes 12 and 30 us
        def pair(self, a, b, calls):
            a(), b()
            return 12.0, 30.0

    a = torch.randn(8, 8)

    def products(n: int):
        return lambda: [a @ a for _ in range(n)]

    step, sb3_step = products(4), products(1)  # step: 2 units of 2 products
    own = against_sb3_rows(FixedTimer(1), "what", MatrixProducts.of(step, 2), step, sb3_step, 2, per=2)
    part = against_sb3_rows(FixedTimer(1), "what", MatrixProducts.of(products(3), 3), step, sb3_step, 2, per=2)
    assert own == [
        ("what", "covey", 6.0, "SB3", 15.0),
        ("what", "covey's matrix products alone (2 per call)", 6.0, "SB3's whole of it", 15.0),
    ]
    assert part == [
        ("what", "covey", 6.0, "SB3", 15.0),
        ("what", "covey's matrix products alone (1 per call)", 4.0, "SB3's whole of it", 15.0),
    ]


def test_matrix_products_records_copies_of_the_products_and_replays_them_alone():
    """benchmarks.fast_paths.MatrixProducts: the forward's and backward's products, nothing else, with copies of
    their arguments in the same layouts, run again on their own."""
    import torch

    from benchmarks.fast_paths import MatrixProducts

    x = torch.randn(5, 3, requires_grad=True)
    weight = torch.randn(4, 3)
    products = MatrixProducts()
    with products:
        out = torch.nn.functional.linear(x, weight).relu()  # a product, then an elementwise op
        out.sum().backward()  # x's gradient: one product (the weight takes none)
    assert [func.overloadpacket for func, _, _ in products.calls] == [torch.ops.aten.mm, torch.ops.aten.mm]
    first = products.replay()
    torch.testing.assert_close(first[0], x.detach() @ weight.t())
    torch.testing.assert_close(first[1], (out.detach() > 0).float() @ weight)
    assert products.calls[0][1][1].stride() == weight.t().stride()  # the transposed view's layout, copied
    weight.add_(1.0)  # the recorded arguments are copies
    torch.testing.assert_close(products.replay()[0], first[0])


def test_fast_paths_runs_only_the_chosen_groups_and_names_unknown_ones():
    base = [sys.executable, "-m", "benchmarks.fast_paths", "--repeats", "1", "--calls-scale", "0.05"]
    result = subprocess.run([*base, "--groups", "poca"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    measurements = [line.split("|")[1].strip() for line in result.stdout.splitlines()[2:] if line.startswith("|")]
    assert measurements and all("POCA" in m or "softmax" in m for m in measurements), measurements
    bad = subprocess.run([*base, "--groups", "poca,gpu"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "--groups takes names of ppo, kernels, compile, sac, poca" in bad.stderr


def test_fast_paths_leaves_the_sac_bf16_rows_out_where_bfloat16_products_are_slow(monkeypatch, capsys):
    """Where PyTorch has no fast bfloat16 products, the SAC group times float32 only and says what it left out
    and why (its bfloat16 steps would take most of an hour there)."""
    from benchmarks import fast_paths

    monkeypatch.setattr(fast_paths.linear_module, "fast_bfloat16_products", lambda: False)
    fast_paths.main(["--groups", "sac", "--repeats", "1", "--calls-scale", "0.05"])
    out = capsys.readouterr().out
    rows = table_cells(out)[1:]
    assert rows and not any("bf16" in row[0] or "bf16" in row[1] or "bf16" in row[3] for row in rows), rows
    assert ["SAC gradient step, Pendulum 256x256", "hand-written gradients"] in [row[:2] for row in rows]
    capability = torch.backends.cpu.get_cpu_capability()
    assert (
        "Left out: the SAC rows with bf16_matmuls=True. This CPU has no fast bfloat16 products (PyTorch's CPU "
        f"capability: {capability})" in out
    )


def test_fast_paths_compile_rows():
    """torch.compile's rows: the small MLP's and MA-POCA's critic's, whose first call checks that the compiled critic
    computes covey's values (the row would not print otherwise)."""
    command = [sys.executable, "-m", "benchmarks.fast_paths", "--groups", "compile", "--repeats", "1"]
    result = subprocess.run([*command, "--calls-scale", "0.05"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_cells(result.stdout)[1:]
    critic = "POCA critic forward and backward, 256 groups of 3"
    assert [row[1:4:2] for row in rows if row[0] == critic] == [
        ["torch.compile, first call", "eager (covey)"],
        ["torch.compile, later calls", "eager (covey)"],
    ]
    assert len(rows) == 4


def test_fast_paths_times_the_two_ways_in_alternating_rounds():
    from benchmarks.fast_paths import Timer

    log = []
    t_a, t_b = Timer(repeats=3).pair(lambda: log.append("a"), lambda: log.append("b"), 2)
    # one warm-up call each, then rounds A A B B | B B A A | A A B B
    assert "".join(log) == "ab" + "aabb" + "bbaa" + "aabb"
    assert t_a > 0 and t_b > 0
    assert Timer(repeats=1).versus("x", lambda: None, "y", lambda: None, 1)[::2] == ("x", "y")


def test_profile_smoke():
    """The profile attributes the run's time to phases: one row per task, shares that add up to 100%."""
    tasks = [*TASKS, "poca_simple_spread"]
    command = [sys.executable, "-m", "benchmarks.profile", "--tasks", ",".join(tasks), "--scale", "0.02"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert sorted(rows) == sorted(tasks)
    for task in tasks:
        shares = [float(v.rstrip("%")) for k, v in rows[task].items() if v.endswith("%")]
        assert abs(sum(shares) - 100) <= len(shares)  # rounding of each cell
        assert float(rows[task]["update"].rstrip("%")) > 0
    # POCA's phases are its own methods (group env, group buffer, its batched rollout evaluation).
    for phase in ("env step", "rollout evaluation", "update"):
        assert float(rows["poca_simple_spread"][phase].rstrip("%")) > 0
    assert "\ncode: covey " in result.stdout


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


def test_poca_width_smoke():
    """POCA trains at each attention width asked for; one row per width with a time and a return."""
    command = [sys.executable, "-m", "benchmarks.poca_width", "--widths", "32,64", "--timesteps", "1024"]
    command += ["--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert set(rows) == {"32", "64"}
    for row in rows.values():
        assert number(row["seconds (median)"]) > 0
        assert number(row["per-agent return (median [min, max])"]) <= 0  # simple_spread rewards are <= 0


@pytest.mark.skipif(
    tuple(int(p) for p in version("supersuit").split(".")[:2]) < (3, 11),
    reason="SuperSuit 3.10's concat_vec_envs_v1 fails with num_cpus > 0 itself (missing obs_space, act_space)",
)
def test_poca_processes_smoke():
    """Each learner trains with its copies in one process and in two; covey's two runs are one run, step for step,
    so their returns agree exactly (the script checks and says so)."""
    command = [sys.executable, "-m", "benchmarks.poca_processes", "--timesteps", "1024", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert set(rows) == {
        "covey POCA, 1 process",
        "covey POCA, 2 processes",
        "SB3 PPO + SuperSuit, num_cpus=0",
        "SB3 PPO + SuperSuit, num_cpus=2",
    }
    for row in rows.values():
        assert number(cell(row, "env steps/s")) > 0
        assert number(cell(row, "per-agent return")) <= 0  # simple_spread rewards are <= 0
    returns = {name: row["per-agent return (median [min, max])"] for name, row in rows.items()}
    assert returns["covey POCA, 1 process"] == returns["covey POCA, 2 processes"]
    assert "seed by seed: identical" in result.stdout


def test_lunar_lander_env_smoke():
    """One row per way of stepping LunarLander, each with a speed and the mean length of finished episodes."""
    command = [sys.executable, "-m", "benchmarks.lunar_lander_env", "--seconds", "3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert set(rows) == {
        "random actions",
        "heuristic lander",
        "random actions, render_mode='rgb_array'",
        "heuristic lander, render_mode='rgb_array'",
    }
    for row in rows.values():
        assert number(row["env steps/s"]) > 0
        assert number(row["mean episode length"]) > 0  # episodes end within 3 s of 16 copies


def test_benchmark_envs_are_made_without_rendering():
    """Every single-agent task's env is made with render_mode=None, where LunarLander simulates no engine particles
    (SB3's make_vec_env default, "rgb_array", piles them up in an unrendered episode) and moves the same."""
    import numpy as np
    from stable_baselines3.common.env_util import make_vec_env

    from benchmarks.common import unrendered_vec_env
    from benchmarks.compare import TASKS, make_env

    single_agent = [task for task in TASKS if task.runner is None]
    assert {task.env_id for task in single_agent} >= {"CartPole-v1", "LunarLander-v3", "Pendulum-v1"}
    for task in single_agent:
        env = make_env(task, 2, seed=0)
        assert env.get_attr("render_mode") == [None, None], task.name
        env.close()

    named = unrendered_vec_env("CartPole-v1", 1, 0, {"render_mode": "rgb_array"})  # a render mode asked for stays
    assert named.get_attr("render_mode") == ["rgb_array"]
    named.close()

    task = next(task for task in TASKS if task.name == "sac_lunarlander_continuous")
    unrendered = make_env(task, 1, seed=3)
    sb3_default = make_vec_env(task.env_id, 1, seed=3, env_kwargs=task.env_kwargs)
    main_engine = np.array([[0.5, 0.0]], dtype=np.float32)  # full throttle would leave the screen sooner
    np.testing.assert_array_equal(unrendered.reset(), sb3_default.reset())
    for _ in range(30):
        np.testing.assert_array_equal(unrendered.step(main_engine)[0], sb3_default.step(main_engine)[0])
    assert len(unrendered.envs[0].unwrapped.particles) == 0
    assert len(sb3_default.envs[0].unwrapped.particles) >= 30  # one or more per firing, none removed
    unrendered.close()
    sb3_default.close()


def test_ppo_cnn_smoke():
    """covey's and SB3's CnnPolicy PPO side by side: a time and a ratio to SB3 per learner."""
    command = [sys.executable, "-m", "benchmarks.ppo_cnn", "--timesteps", "512", "--repeats", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert set(rows) == {"covey", "SB3", "covey, batched evaluation"}
    for row in rows.values():
        assert number(row["seconds (median)"]) > 0
    assert rows["SB3"]["time / SB3's (median [min, max] per repeat)"].startswith("1.00")


def test_poca_curve_smoke():
    """Both learners' returns along training, a row per evaluation point, and the time-to-return summary."""
    command = [sys.executable, "-m", "benchmarks.poca_curve"]
    command += ["--timesteps", "2048", "--every", "1024", "--seeds", "1", "--eval-episodes", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert list(rows) == ["1,024", "2,048"]  # one point per 1024 env steps, the last after learn
    for row in rows.values():
        assert float(cell(row, "covey POCA s")) > 0 and float(cell(row, "SB3 PPO + SuperSuit s")) > 0
    assert "SB3 PPO + SuperSuit's final return (median over seeds)" in result.stdout
    assert "- code: covey " in result.stdout


def test_poca_curve_evaluating_along_the_way_leaves_the_run_unchanged():
    """The curve's last point is the run of benchmarks.poca_vs_supersuit (same return and env steps): the
    evaluations in between draw nothing from the training's random generators. Its points' seconds grow."""
    from benchmarks.poca_curve import learning_curve
    from benchmarks.poca_vs_supersuit import run_poca, run_supersuit_ppo

    for name, run in (("covey POCA", run_poca), ("SB3 PPO + SuperSuit", run_supersuit_ppo)):
        _, agent_return, steps = run(3072, 1, 3)
        points = learning_curve(name, 3072, 1, 1024, 3)
        assert [p[0] for p in points] == [1024, 2048, 3072]
        assert points[-1][2] == agent_return and points[-1][0] == steps
        assert 0 < points[0][1] < points[1][1] < points[2][1]


def test_poca_curve_first_reach_and_median_curve():
    from benchmarks.poca_curve import first_reach, median_curve

    a = [(1024, 1.0, -30.0), (2048, 2.0, -20.0), (3072, 3.0, -25.0)]
    b = [(1024, 1.2, -26.0), (2048, 2.4, -28.0), (3072, 3.6, -19.0)]
    c = [(1024, 1.1, -40.0), (2048, 2.2, -21.0)]  # stopped early: the median curve ends with it
    assert first_reach(a, -26.0) == (2048, 2.0, -20.0)  # the first crossing, although it drops after
    assert first_reach(b, -26.0) == (1024, 1.2, -26.0)  # "at least" the target
    assert first_reach(a, -10.0) is None
    assert median_curve([a, b, c]) == [(1024, 1.1, -30.0), (2048, 2.2, -21.0)]


def test_compare_suites_hold_the_tasks_with_a_budget_there(monkeypatch):
    """The gSDE tasks and the custom-policy tasks run in the full suite only; naming one for the quick suite is an
    error that says so."""
    from benchmarks import compare
    from benchmarks.compare import TASKS, parse_args

    monkeypatch.setattr(compare.linear, "fast_bfloat16_products", lambda: True)
    quick, full = parse_args([]).task_list, parse_args(["--suite", "full"]).task_list
    assert full == [task.name for task in TASKS]
    custom = {"ppo_cartpole_8env_custom_policy", "sac_pendulum_custom_policy"}
    assert set(full) - set(quick) == {"ppo_pendulum_sde", "sac_pendulum_sde", *custom}
    command = [sys.executable, "-m", "benchmarks.compare", "--tasks", "sac_pendulum_sde"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "have no quick budget; run them with --suite full" in result.stderr


@pytest.mark.parametrize("fast", [True, False])
def test_compare_leaves_the_bf16_tasks_out_where_bfloat16_products_are_slow(monkeypatch, fast):
    """Where PyTorch has no fast bfloat16 products, a suite leaves out the ``bf16_matmuls`` tasks (hours there)
    and its report says so and why; naming one in --tasks still runs it."""
    from benchmarks import compare

    monkeypatch.setattr(compare.linear, "fast_bfloat16_products", lambda: fast)
    bf16 = [task.name for task in compare.TASKS if task.covey_options.get("bf16_matmuls")]
    assert bf16 == ["sac_pendulum_bf16", "sac_lunarlander_continuous_bf16"]
    for suite in ("quick", "full"):
        args = compare.parse_args(["--suite", suite])
        every = [task.name for task in compare.TASKS if suite in task.budgets]
        assert args.task_list == (every if fast else [name for name in every if name not in bf16])
        assert args.left_out == ([] if fast else bf16)
    named = compare.parse_args(["--tasks", "ppo_cartpole_1env,sac_pendulum_bf16"])
    assert named.task_list == ["ppo_cartpole_1env", "sac_pendulum_bf16"] and named.left_out == []

    def fake_training(framework, task, suite, timesteps, seed):
        return compare.RunResult(framework, seed, 2.0, timesteps, -100.0)

    monkeypatch.setattr(compare, "measure_training", fake_training)
    monkeypatch.setattr(compare, "measure_env_speed", lambda task, seconds: 1000.0)
    args = compare.parse_args(["--tasks", "ppo_cartpole_1env"] if fast else [])
    results = compare.run_group([compare.TASKS_BY_NAME["ppo_cartpole_1env"]], "quick", 1, 1.0, 0.1, print)
    started = datetime.datetime.now().astimezone()
    report = compare.format_report(results, args, "python -m benchmarks.compare", started, (0.0, 0.0, 0.0), "x")
    note = "Left out: sac_pendulum_bf16, sac_lunarlander_continuous_bf16. This CPU has no fast bfloat16 products"
    assert (note in report) is not fast
    if not fast:
        assert "`bf16_matmuls=True` runs tens of times slower than float32" in report and "--tasks" in report


def test_cpu_description_reads_the_first_processor():
    from benchmarks.common import cpu_description

    cpuinfo = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16\n\n"
        "processor\t: 1\nmodel name\t: something else\nflags\t\t: fpu\n"
    )
    text = cpu_description(cpuinfo)
    assert text.startswith("AMD EPYC 9R14, family 25 model 17, AVX-512: yes, AVX-512 BF16: yes, ")
    no_avx512 = cpu_description("model name\t: Old CPU\nflags\t\t: fpu sse2 avx2\n")
    assert no_avx512.startswith("Old CPU, AVX-512: no, AVX-512 BF16: no, torch CPU capability: ")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_code_version_names_the_commit_and_the_changed_files(tmp_path):
    import covey
    from benchmarks.common import code_version

    version = f"covey {covey.__version__}"

    def git(*args: str) -> str:
        identity = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
        command = ["git", *identity, "-C", str(tmp_path), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    assert code_version(tmp_path) == f"{version} (not a git checkout)"
    git("init", "-q")
    assert code_version(tmp_path) == f"{version} (a git checkout without commits)"
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    git("add", "a.py")
    git("commit", "-q", "-m", "a")
    commit = git("rev-parse", "--short=7", "HEAD")
    (tmp_path / "new.py").write_text("untracked files do not count\n")
    assert code_version(tmp_path) == f"{version}, commit `{commit}`"
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == f"{version}, commit `{commit}` with uncommitted changes to 1 tracked file (a.py)"
    # a folder inside a checkout (as site-packages inside a project) is not that checkout's code
    assert code_version(tmp_path / "sub") == f"{version} (not a git checkout)"


def test_code_version_of_this_checkout():
    from benchmarks.common import code_version

    if shutil.which("git") is None:
        pytest.skip("needs git")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert f", commit `{head.stdout.strip()}`" in code_version()


def test_compare_twin_tasks_share_one_sb3_run_per_seed(monkeypatch):
    """A _bf16 task run with its float32 twin: per seed SB3 trains once, between the two covey runs, whose order
    alternates with the seed, and both rows compare with that run."""
    from benchmarks import compare

    calls = []

    def fake_training(framework, task, suite, timesteps, seed):
        calls.append((seed, framework, task.name if framework == "covey" else "sb3"))
        seconds = {"sb3": 10.0, "sac_pendulum": 4.0, "sac_pendulum_bf16": 3.0}.get(calls[-1][2], 2.0) + seed
        return compare.RunResult(framework, seed, seconds, timesteps, -100.0 - len(calls))

    monkeypatch.setattr(compare, "measure_training", fake_training)
    monkeypatch.setattr(compare, "measure_env_speed", lambda task, seconds: 1000.0)
    names = ["sac_pendulum", "ppo_cartpole_1env", "sac_pendulum_bf16"]
    groups = compare.task_groups(names)
    assert [[task.name for task in group] for group in groups] == [
        ["sac_pendulum", "sac_pendulum_bf16"],
        ["ppo_cartpole_1env"],
    ]
    assert [[task.name for task in group] for group in compare.task_groups(["sac_pendulum_bf16"])] == [
        ["sac_pendulum_bf16"]
    ]
    fp32, bf16 = compare.run_group(groups[0], "quick", 2, 1.0, 0.1, lambda message: None)
    assert calls == [
        (0, "covey", "sac_pendulum"),
        (0, "sb3", "sb3"),
        (0, "covey", "sac_pendulum_bf16"),
        (1, "covey", "sac_pendulum_bf16"),
        (1, "sb3", "sb3"),
        (1, "covey", "sac_pendulum"),
    ]
    assert fp32.of("sb3") == bf16.of("sb3") and len(fp32.of("sb3")) == 2
    assert fp32.time_ratios() == [4.0 / 10.0, 5.0 / 11.0] and bf16.time_ratios() == [3.0 / 10.0, 4.0 / 11.0]

    calls.clear()
    (alone,) = compare.run_group(groups[1], "quick", 2, 1.0, 0.1, lambda message: None)
    assert [(seed, framework) for seed, framework, _ in calls] == [(0, "covey"), (0, "sb3"), (1, "sb3"), (1, "covey")]
    with pytest.raises(ValueError, match="do not share SB3's side"):
        compare.run_group(
            [compare.TASKS_BY_NAME["sac_pendulum"], compare.TASKS_BY_NAME["sac_lunarlander_continuous"]],
            "quick",
            1,
            1.0,
            0.1,
            lambda message: None,
        )


def test_compare_twins_have_the_same_sb3_side():
    """Every task that shares another's SB3 runs trains SB3 exactly as that task does, in both suites."""
    from benchmarks.compare import TASKS, TASKS_BY_NAME

    twins = [task for task in TASKS if task.sb3_runs_of is not None]
    assert {task.name for task in twins} == {
        "sac_pendulum_bf16",
        "sac_lunarlander_continuous_bf16",
        "poca_simple_spread_width64",
    }
    for task in twins:
        lead = TASKS_BY_NAME[task.sb3_runs_of]
        assert task.covey_options and task.runner == lead.runner
        for suite in task.budgets:
            assert task.sb3_side(suite) == lead.sb3_side(suite)
            assert task.kwargs(suite, "sb3") == lead.kwargs(suite, "sb3")


def test_compare_poca_twin_trains_covey_at_width_64_and_sb3_alike(monkeypatch):
    """poca_simple_spread_width64 trains covey's POCA with attention_width=64 and SB3 as poca_simple_spread does;
    the lead trains covey's at the default width, 128. A different SB3 side (another runner) cannot share."""
    from benchmarks import compare, poca_vs_supersuit

    widths = []
    make_poca = poca_vs_supersuit.make_poca

    def recording_make_poca(seed, **policy_kwargs):
        model = make_poca(seed, **policy_kwargs)
        widths.append(model.attention_width)
        return model

    monkeypatch.setattr(poca_vs_supersuit, "make_poca", recording_make_poca)
    lead, twin = compare.TASKS_BY_NAME["poca_simple_spread"], compare.TASKS_BY_NAME["poca_simple_spread_width64"]
    runs = [compare.measure_training("covey", task, "quick", 1024, 0) for task in (lead, twin)]
    assert widths == [128, 64]
    assert all(run.timesteps == 1024 and run.eval_return <= 0 for run in runs)
    assert twin.sb3_side("quick") == lead.sb3_side("quick")
    other = compare.Runner(
        train={**lead.runner.train, "sb3": lambda *args: (1.0, 0.0, 1)},
        env_speed=lead.runner.env_speed,
        min_timesteps=lead.runner.min_timesteps,
    )
    assert dataclasses.replace(twin, runner=other).sb3_side("quick") != lead.sb3_side("quick")


def test_manual_vs_autograd_smoke():
    """Both gSDE tasks trained with hand-written gradients and with autograd (the script refuses a task whose
    networks the hand-written step does not cover), one row per task with a positive time ratio; the two
    variants' returns on the same seed stay close (the same losses, rounded differently)."""
    command = [sys.executable, "-m", "benchmarks.manual_vs_autograd", "--scale", "0.02", "--seeds", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert list(rows) == ["ppo_pendulum_sde", "sac_pendulum_sde"]
    for row in rows.values():
        assert number(cell(row, "hand-written s")) > 0 and number(cell(row, "time ratio")) > 0
        manual, autograd = number(cell(row, "hand-written return")), number(cell(row, "autograd return"))
        assert abs(manual - autograd) <= 0.05 * abs(autograd) + 1.0
    assert result.stderr.count("hand-written:") == 2 and result.stderr.count("autograd:") == 2
    bad = subprocess.run([*command[:3], "--tasks", "ppo_cartpole_1env"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "unknown tasks ['ppo_cartpole_1env']" in bad.stderr


def test_threads_times_each_thread_count_in_alternating_rounds_and_restores_the_callers():
    """benchmarks.threads.per_thread_count: every call runs at its round's thread count, the order flips every other
    round, one untimed call follows each switch, and the caller's thread count comes back afterwards."""
    import torch

    from benchmarks.threads import per_thread_count

    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        times = per_thread_count(lambda: seen.append(torch.get_num_threads()), calls=2, repeats=3, threads=(1, 2))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    # rounds 1 2 | 2 1 | 1 2, each count's block 1 untimed + 2 timed calls
    assert seen == [1] * 3 + [2] * 3 + [2] * 3 + [1] * 3 + [1] * 3 + [2] * 3
    assert len(times) == 2 and all(t > 0 for t in times)


def test_threads_smoke():
    """python -m benchmarks.threads: a row per update with covey's and SB3's times at 1 and 2 threads and their
    ratios (the ratio cells are the times' quotients); bad arguments are refused."""
    command = [sys.executable, "-m", "benchmarks.threads", "--repeats", "1"]
    result = subprocess.run([*command, "--calls-scale", "0.01"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    assert [what.split(":")[0] for what in rows] == [
        "PPO CartPole, 8 envs, RL-Zoo settings",
        "SAC Pendulum",
        "MA-POCA simple_spread (covey) against SB3 PPO + SuperSuit",
    ]

    def ms(cell_text: str) -> tuple[float, float]:
        """A time cell in ms, with half a unit of its last printed digit (the cell is rounded)."""
        value, unit = cell_text.split()
        scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
        decimals = len(value.partition(".")[2])
        return float(value) * scale, 0.5 * 10.0**-decimals * scale

    for row in rows.values():
        for learner in ("covey", "SB3"):
            (one, one_error), (two, two_error) = ms(row[f"{learner}, 1 thread"]), ms(row[f"{learner}, 2 threads"])
            assert one > one_error and two > two_error
            # The ratio is of the unrounded times: it lies between the ratios the cells' rounding allows
            # (give or take the ratio's own rounding to two decimals).
            ratio = float(row[f"{learner} 2/1"])
            assert (
                (two - two_error) / (one + one_error) - 0.005 <= ratio <= (two + two_error) / (one - one_error) + 0.005
            )
    assert "command: python -m benchmarks.threads --repeats 1 --calls-scale 0.01" in result.stdout
    bad = subprocess.run([*command, "--calls-scale", "0"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "--calls-scale > 0" in bad.stderr


def test_devices_smoke(capsys):
    """covey and SB3, PPO and SAC, on each device this machine has: a row per round and run, then the ratios."""
    from benchmarks import devices

    devices.main(["--scale", "0.05", "--rounds", "2"])
    output = capsys.readouterr().out
    header, *rows = table_cells(output)
    assert header == ["round", "learner", "library", "device", "env steps", "seconds", "env steps/s"]
    on = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    runs = [(r, agent, lib, dev) for r in "01" for agent in ("PPO", "SAC") for lib in ("covey", "SB3") for dev in on]
    assert [tuple(row[:4]) for row in rows] == runs
    assert all(number(row[5]) > 0 and number(row[4]) == (2048 if row[1] == "PPO" else 108) for row in rows)
    assert "- PPO, covey/SB3 both on cpu: " in output and "- SAC, covey/SB3 both on cpu: " in output
    assert ("- SAC, SB3 on the CPU / on CUDA: " in output) == torch.cuda.is_available()


def test_compare_runs_users_policy_classes_in_both_frameworks():
    """The custom-policy tasks train benchmarks.custom_policy's classes with SB3's PPO and SAC and with covey's."""
    tasks = "ppo_cartpole_8env_custom_policy,sac_pendulum_custom_policy"
    command = [sys.executable, "-m", "benchmarks.compare", "--suite", "full", "--tasks", tasks, "--seeds", "1"]
    result = subprocess.run(
        [*command, "--scale", "0.003", "--env-seconds", "0.2"], capture_output=True, text=True, timeout=180, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table_rows(result.stdout)
    ppo, sac = rows["ppo_cartpole_8env_custom_policy"], rows["sac_pendulum_custom_policy"]
    assert number(cell(ppo, "timesteps")) == 512  # two rollouts of 8 envs x 32 steps: 0.003 x 100k, rounded up
    assert number(cell(sac, "timesteps")) == 356  # the warm-up (100) and a batch (256): the smallest budget
    for row in (ppo, sac):
        assert number(cell(row, "covey/SB3 time ratio")) > 0
    assert "a user's subclass of SB3's ActorCriticPolicy" in result.stdout
    assert "a user's subclass of SB3's SACPolicy" in result.stdout


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--scale", "nan"], "finite numbers > 0"),
        (["--scale", "inf"], "finite numbers > 0"),
        (["--env-seconds", "nan"], "finite numbers > 0"),
        (["--tasks", ","], "--tasks names no task"),
        (["--out", "{tmp}/missing/x.md"], "does not exist; create it first"),
        (["--out", "{tmp}"], "names a folder; name a file in it"),
        (["--out", "{tmp}/new/"], "names a folder; name a file in it"),
        (["--out", "{tmp}/notes.md"], "holds other text, not a report of this command"),
    ],
)
def test_compare_refuses_bad_arguments_before_any_run(arguments, message, tmp_path, capsys):
    """Non-finite budgets, and an --out the report could not go to, are named at once: a bad --out failed with a
    traceback after the whole run (minutes to hours), and an unrelated file would have been overwritten."""
    from benchmarks import compare

    (tmp_path / "notes.md").write_text("my notes\n")
    arguments = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    with pytest.raises(SystemExit) as exit_info:
        compare.parse_args(["--tasks", "ppo_cartpole_1env", *arguments])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert (tmp_path / "notes.md").read_text() == "my notes\n"


def test_compare_interrupted_reports_the_tasks_that_finished(monkeypatch, tmp_path, capsys):
    """Ctrl-C during a run keeps what finished: the report holds the finished tasks (printed and written to --out),
    and the command exits 130, where it ended in a traceback and wrote nothing."""
    from benchmarks import compare

    def fake_group(group, suite, seeds, scale, env_seconds, log):
        for task in group:
            if task.name == "sac_pendulum":
                raise KeyboardInterrupt
            runs = [compare.RunResult(f, 0, 1.0, 1000, 10.0) for f in ("covey", "sb3")]
            yield compare.TaskResult(task, 5000.0, runs)

    monkeypatch.setattr(compare, "run_group", fake_group)
    out = tmp_path / "report.md"
    with pytest.raises(SystemExit) as exit_info:
        compare.main(["--tasks", "ppo_cartpole_1env,sac_pendulum", "--seeds", "1", "--out", str(out)])
    assert exit_info.value.code == 130
    captured = capsys.readouterr()
    assert "interrupted: the report holds the tasks that finished (ppo_cartpole_1env)" in captured.err
    rows = table_rows(captured.out)
    assert list(rows) == ["ppo_cartpole_1env"]
    written = out.read_text()
    assert "| ppo_cartpole_1env |" in written
    assert "- interrupted (Ctrl-C) before these tasks finished, which the table leaves out: sac_pendulum" in written
