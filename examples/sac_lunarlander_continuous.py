"""Train SAC on LunarLanderContinuous (LunarLander-v3 with continuous=True), evaluate it, save it.

    python examples/sac_lunarlander_continuous.py                  # 100k steps (long: ~25 min on 2 cores)
    python examples/sac_lunarlander_continuous.py --timesteps 2000 # smoke run

RL-Zoo settings (buffer 1M, batch 256, lr 7.3e-4, 400x300 networks) except the budget: the zoo trains
500k steps. Needs Box2D (covey's ``[examples]`` extra). A return of 200 counts as solved.
"""

import argparse
import time

import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from covey import SAC


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--save", default="sac_lunarlander_continuous.zip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    # render_mode=None: SB3's make_vec_env makes "rgb_array" envs, under which LunarLander simulates its
    # engines' particles, which pile up in episodes that are never rendered and slow every step down.
    env_kwargs = dict(continuous=True, render_mode=None)
    env = make_vec_env("LunarLander-v3", n_envs=1, seed=args.seed, env_kwargs=env_kwargs)
    model = SAC(
        "MlpPolicy",
        env,
        learning_rate=7.3e-4,
        buffer_size=1_000_000,
        batch_size=256,
        ent_coef="auto",
        gamma=0.99,
        tau=0.01,
        train_freq=1,
        gradient_steps=1,
        learning_starts=min(10_000, args.timesteps // 2),
        policy_kwargs=dict(net_arch=[400, 300]),
        seed=args.seed,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, progress_bar=True)
    elapsed = time.perf_counter() - start

    eval_env = make_vec_env("LunarLander-v3", n_envs=1, seed=args.seed + 1000, env_kwargs=env_kwargs)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)
    model.save(args.save)
    speed = model.num_timesteps / elapsed
    print(f"SAC LunarLanderContinuous: {model.num_timesteps} steps in {elapsed:.1f} s ({speed:.0f} steps/s)")
    print(f"evaluation over 10 episodes: {mean:.1f} +/- {std:.1f} (200 = solved)")


if __name__ == "__main__":
    main()
