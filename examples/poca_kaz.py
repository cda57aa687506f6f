"""MA-POCA on Knights-Archers-Zombies (PettingZoo butterfly): archers and knights die when zombies reach
them and leave the episode; the team earns a point per zombie killed.

    python examples/poca_kaz.py                    # 30k env steps, about 4 minutes on 2 cores
    python examples/poca_kaz.py --timesteps 2000   # smoke run

Observations are KAZ's vector state: one row per entity (27 rows of 5 numbers), encoded with entity
attention (``policy_kwargs=dict(entity_encoder=True)``). Prints the group return against random play: with
seed 0 the team kills 7.5 zombies per episode against 2.8 for random actions, and lives longer (234 vs
164 steps; 10 episodes, sampled actions; 223 s on a 2-core AMD EPYC).
"""

import argparse
import time

import torch
from pettingzoo.butterfly import knights_archers_zombies_v11

from covey import POCA
from covey.evaluation import evaluate_group


def make_env():
    return knights_archers_zombies_v11.parallel_env(obs_method="vector", max_cycles=400)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save", default="poca_kaz.zip")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = POCA(
        "MlpPolicy",
        make_env,
        n_envs=4,
        n_steps=256,
        batch_size=256,
        n_epochs=4,
        learning_rate=3e-4,
        policy_kwargs=dict(entity_encoder=True),
        seed=args.seed,
    )
    start = time.perf_counter()
    model.learn(args.timesteps, progress_bar=True)
    elapsed = time.perf_counter() - start
    model.save(args.save)

    # KAZ's sampled policy is what was trained; its argmax tends to freeze the heroes early in training.
    trained = evaluate_group(model, make_env, n_eval_episodes=10, seed=1000, deterministic=False)
    random = evaluate_group(None, make_env, n_eval_episodes=10, seed=1000)
    print(f"POCA KAZ: {model.num_timesteps} env steps ({model.agent_steps} agent-steps) in {elapsed:.0f} s")
    print(
        f"group return (zombies killed, sampled actions): trained {trained['group_return']:.1f}, "
        f"random {random['group_return']:.1f}; episode length {trained['episode_length']:.0f} vs "
        f"{random['episode_length']:.0f}"
    )


if __name__ == "__main__":
    main()
