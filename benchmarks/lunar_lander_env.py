"""How fast LunarLander steps under random actions and under a policy that lands, unrendered and as SB3 makes it
from its id: the env cost that bounds ``ppo_lunarlander`` at a learning budget.

    python -m benchmarks.lunar_lander_env                 # 20 s per row
    python -m benchmarks.lunar_lander_env --seconds 1     # smoke run

The vector env of the ``ppo_lunarlander`` task (SB3's ``make_vec_env``, 16 copies) is stepped with random
actions and with Gymnasium's heuristic lander (``gymnasium.envs.box2d.lunar_lander.heuristic``, which lands
most episodes), each made twice: with ``render_mode=None``, as every benchmark makes its envs
(:func:`benchmarks.common.unrendered_vec_env`), and with SB3's default for an env id, ``render_mode="rgb_array"``,
under which LunarLander also simulates its engines' particles, which pile up until the episode ends when nothing
renders. Only ``step`` is timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
from gymnasium.envs.box2d.lunar_lander import heuristic
from stable_baselines3.common.env_util import make_vec_env

from benchmarks.common import unrendered_vec_env

N_ENVS = 16


def stepping_speed(policy: str, seconds: float, sb3_default: bool = False, seed: int = 0) -> tuple[float, float]:
    """Env steps per second of ``venv.step`` alone, and the mean length of the episodes that ended; the env made
    unrendered, or with SB3's default render mode (``sb3_default``)."""
    if sb3_default:
        venv = make_vec_env("LunarLander-v3", N_ENVS, seed=seed)
    else:
        venv = unrendered_vec_env("LunarLander-v3", N_ENVS, seed)
    venv.action_space.seed(seed)
    obs = venv.reset()
    lengths: list[int] = []
    stepping, steps = 0.0, 0
    while stepping < seconds:
        if policy == "random":
            actions = np.array([venv.action_space.sample() for _ in range(N_ENVS)])
        else:
            actions = np.array([heuristic(env.unwrapped, o) for env, o in zip(venv.envs, obs)])
        start = time.perf_counter()
        obs, _, dones, infos = venv.step(actions)
        stepping += time.perf_counter() - start
        steps += N_ENVS
        lengths += [info["episode"]["l"] for info, done in zip(infos, dones) if done]
    venv.close()
    return steps / stepping, float(np.mean(lengths)) if lengths else float("nan")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lunar_lander_env", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of stepping per row")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [
        ("random actions", "random", False),
        ("heuristic lander", "heuristic", False),
        ("random actions, render_mode='rgb_array'", "random", True),
        ("heuristic lander, render_mode='rgb_array'", "heuristic", True),
    ]
    print(f"LunarLander-v3, {N_ENVS} copies (SB3 make_vec_env), {args.seconds:g} s of stepping per row\n")
    print("| actions | env steps/s | mean episode length |")
    print("|---|---:|---:|")
    for name, policy, sb3_default in rows:
        speed, length = stepping_speed(policy, args.seconds, sb3_default)
        print(f"| {name} | {speed:,.0f} | {length:.0f} |")
    print(f"\ncommand: python -m benchmarks.lunar_lander_env {' '.join(sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
