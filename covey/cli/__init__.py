"""The ``covey`` command line: train (from a YAML config or flags), resume, eval, enjoy, plot, export, demo.

    covey train configs/ppo_cartpole.yaml --set hyperparameters.learning_rate=1e-3
    covey train poca --env mpe2:simple_spread_v3 --timesteps 1e6 --n-envs 8 --env-kwargs '{"N": 3}'
    covey train --resume runs/poca-simple_spread_v3-20250101-120000
    covey eval RUN_DIR --episodes 20
    covey enjoy RUN_DIR --gif team.gif
    covey demo

Heavy imports (torch, the agents, the envs) happen inside the commands, so ``covey --help`` is quick.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from covey.cli.config import (
    AGENTS,
    RESUME_OVERRIDABLE,
    CLIError,
    apply_sets,
    load_yaml_file,
    parse_env_kwargs,
    parse_yaml,
)
from covey.version import __version__

__all__ = ["CLIError", "main"]


def _cmd_train(args: Any) -> int:
    from covey.cli.config import RunConfig

    if args.resume is not None:
        given = [
            flag
            for flag, value in (
                ("a config or agent", args.target),
                ("--env", args.env),
                ("--env-kwargs", args.env_kwargs),
                ("--n-envs", args.n_envs),
                ("--seed", args.seed),
                ("--policy", args.policy),
                ("--run-dir", args.run_dir),
            )
            if value is not None
        ]
        if given:
            raise CLIError(f"--resume continues a run with its own config; drop {', '.join(given)}.")
        return _resume(args.resume, args)
    if args.target is None:
        swallowed = [item for item in args.set or [] if "=" not in item]
        if swallowed:
            sets = " ".join(item for item in args.set if "=" in item) or "timesteps=2000"
            raise CLIError(
                f"--set took {swallowed[0]!r} as a KEY=VALUE item (it reads every word after it): put the config "
                f"or agent name before --set, e.g. covey train {swallowed[0]} --set {sets}."
            )
        raise CLIError(
            "train needs a config file (covey train configs/ppo_cartpole.yaml) or an agent name "
            "(covey train ppo --env CartPole-v1), or --resume RUN_DIR."
        )
    target = args.target
    if target.lower() in AGENTS and not pathlib.Path(target).is_file():
        if args.env is None:
            raise CLIError(
                f"covey train {target} needs --env, e.g. --env "
                f"{'mpe2:simple_spread_v3' if target.lower() == 'poca' else 'CartPole-v1'}."
            )
        raw: dict[str, Any] = {"agent": target.lower()}
    elif pathlib.Path(target).is_file() or target.endswith((".yaml", ".yml")):
        raw = load_yaml_file(target)
    elif (pathlib.Path(target) / "config.yaml").is_file():
        raise CLIError(f"{target!r} is a run folder: go on training it with covey resume {target}.")
    else:
        raise CLIError(f"{target!r} is neither a config file nor an agent name ({', '.join(AGENTS)}).")
    _given_once(args, ("env", "policy", "timesteps", "n_envs", "seed", "env_kwargs"))
    flags = {"env": args.env, "policy": args.policy}
    raw.update({k: v for k, v in flags.items() if v is not None})
    for key, text in (("timesteps", args.timesteps), ("n_envs", args.n_envs), ("seed", args.seed)):
        if text is not None:
            raw[key] = parse_yaml(text, f"--{key.replace('_', '-')}")  # 1e6 is a number, null a random seed
    if args.env_kwargs is not None:
        raw["env_kwargs"] = parse_env_kwargs(args.env_kwargs)
    cfg = RunConfig.from_dict(apply_sets(raw, args.set or []))
    from covey.cli.training import start

    return start(cfg, args.run_dir, quiet=args.quiet)


def _given_once(args: Any, keys: tuple[str, ...]) -> None:
    """Refuse a config key given both by its flag and by --set (which of them would win is no one's guess)."""
    set_keys = {item.split("=", 1)[0].strip() for item in args.set or []}
    for key in keys:
        if getattr(args, key, None) is not None and key in set_keys:
            flag = "--" + key.replace("_", "-")
            raise CLIError(f"{flag} and --set {key}=... both give {key}: give it once.")


def _resume(run_dir: str, args: Any) -> int:
    from covey.cli.training import resume

    _given_once(args, ("timesteps",))
    sets = list(args.set or [])
    if args.timesteps is not None:
        sets.append(f"timesteps={args.timesteps}")
    return resume(run_dir, sets, quiet=args.quiet)


def _cmd_resume(args: Any) -> int:
    return _resume(args.run_dir, args)


def _cmd_demo(args: Any) -> int:
    from covey.cli.demo import run_demo

    return run_demo(args.scale, args.out, args.threads)


def _run(name: str):
    def command(args: Any) -> int:
        from covey.cli import commands

        return getattr(commands, name)(args)

    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="covey", description="Train, resume, score and watch covey agents (PPO, SAC, POCA)."
    )
    parser.add_argument("--version", action="version", version=f"covey {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train from a YAML config or an agent name",
        description="Train from a YAML config (covey train CONFIG.yaml) or from flags (covey train poca --env "
        "mpe2:simple_spread_v3 ...). Writes one run folder: config.yaml, progress.csv, TensorBoard events, "
        "evaluations.csv, checkpoints/, model.zip, curve.png. Ctrl-C (or SIGTERM) saves a checkpoint; --resume "
        "continues.",
    )
    train.add_argument("target", nargs="?", help="a config file (.yaml) or an agent: ppo, sac, poca")
    train.add_argument("--env", help="Gymnasium id (ppo, sac) or PettingZoo module:name (poca)")
    train.add_argument("--env-kwargs", help="keyword arguments of the env as JSON/YAML, e.g. '{\"N\": 3}'")
    train.add_argument("--timesteps", help="budget in env steps (1e6 is fine)")
    train.add_argument("--n-envs", help="env copies")
    train.add_argument("--seed", help="seed (default 0; null: a random one, recorded in config.yaml)")
    train.add_argument("--policy", help="policy name (default MlpPolicy)")
    _add_set(train)
    train.add_argument("--run-dir", help="run folder (default runs/<agent>-<env>-<YYYYmmdd-HHMMSS>)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its latest checkpoint")
    train.add_argument("--quiet", action="store_true", help="no summary lines (the progress bar stays)")
    train.set_defaults(func=_cmd_train)

    resume = sub.add_parser(
        "resume",
        help="continue a run from its latest checkpoint (= train --resume)",
        description="Continue a run from its latest checkpoint with its own config: the step count, the logs and "
        "the schedules go on. A finished run is left as it is unless --timesteps extends it.",
    )
    resume.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (covey train's --run-dir)")
    resume.add_argument("--timesteps", help="a new total budget (to extend a run)")
    _add_set(resume, "only " + ", ".join(RESUME_OVERRIDABLE), example="eval_episodes=20 torch_threads=2")
    resume.add_argument("--quiet", action="store_true", help="no summary lines (the progress bar stays)")
    resume.set_defaults(func=_cmd_resume)

    for name, help_text in (
        ("eval", "print the mean and std of the return of a saved model"),
        ("enjoy", "record episodes of a saved model to a GIF"),
    ):
        cmd = sub.add_parser(name, help=help_text, description=help_text + ".")
        cmd.add_argument("target", metavar="RUN_DIR_OR_MODEL", help="a run folder (its env is used) or a model file")
        cmd.add_argument("--env", help="the env (needed for a bare model file)")
        cmd.add_argument("--env-kwargs", help="env keyword arguments as JSON/YAML")
        cmd.add_argument(
            "--episodes", type=int, default=20 if name == "eval" else 1, help=f"default {20 if name == 'eval' else 1}"
        )
        cmd.add_argument("--stochastic", action="store_true", help="sample actions (default: the most likely one)")
        cmd.add_argument(
            "--seed",
            type=int,
            help="seed of the first episode (default: for a run folder, its evaluations' seed, the run's seed + 1000, "
            "so that eval replays the episodes the run's evaluations played; for a model file, 0)",
        )
        cmd.add_argument("--best", action="store_true", help="use the run's checkpoints/best_model.zip")
        if name == "enjoy":
            cmd.add_argument("--gif", help="output GIF (default: <run folder>/<model>.gif)")
            cmd.add_argument("--fps", type=int, default=30, help="frames per second of the GIF (default 30)")
            cmd.add_argument("--max-frames", type=int, default=1000, help="stop recording after (default 1000)")
        cmd.set_defaults(func=_run(f"cmd_{name}"))

    plot_help = (
        "overlay the learning curves of runs (runs whose configs differ only in seed, budget or evaluation "
        "schedule: mean and spread; others: one line each, labelled with the settings that differ)"
    )
    plot = sub.add_parser("plot", help=plot_help, description=plot_help[0].upper() + plot_help[1:] + ".")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (progress.csv is read)")
    plot.add_argument("--out", default="curves.png", help="output PNG (default curves.png)")
    plot.set_defaults(func=_run("cmd_plot"))

    export_help = "export a model's policy to ONNX (or the model to SB3's file) and verify it against torch"
    export = sub.add_parser("export", help=export_help, description=export_help[0].upper() + export_help[1:] + ".")
    export.add_argument("target", metavar="MODEL_OR_RUN_DIR", help="a run folder (its latest model) or a model file")
    export.add_argument("--onnx", help="output file (default: <run folder>/model.onnx or <model>.onnx)")
    export.add_argument(
        "--sb3",
        nargs="?",
        const="",
        metavar="FILE",
        help="write a Stable-Baselines3 model file instead, which stable_baselines3.PPO/SAC.load reads "
        "(sb3_contrib.RecurrentPPO.load for a PPO with LSTM memory; default file: <run folder>/model_sb3.zip or "
        "<model>_sb3.zip)",
    )
    export.set_defaults(func=_run("cmd_export"))

    check_help = "check configs: load them and build their agents, without training"
    check = sub.add_parser("check", help=check_help, description=check_help[0].upper() + check_help[1:] + ".")
    check.add_argument("configs", nargs="+", metavar="CONFIG", help="config files (.yaml)")
    _add_set(check)
    check.set_defaults(func=_run("cmd_check"))

    demo = sub.add_parser(
        "demo",
        help="train PPO on CartPole-v1 and a POCA team on simple_spread in a few minutes",
        description="Train PPO on CartPole-v1 (50k steps) and POCA on mpe2 simple_spread (150k env steps), "
        "print a table against random play, and leave both run folders and a GIF of the trained team.",
    )
    demo.add_argument("--scale", type=float, default=1.0, help="multiply the budgets (default 1)")
    demo.add_argument("--out", help="folder for the demo's runs (default runs/demo-<YYYYmmdd-HHMMSS>)")
    demo.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _add_set(
    parser: argparse.ArgumentParser, note: str = "", example: str = "hyperparameters.learning_rate=1e-3 timesteps=2000"
) -> None:
    parser.add_argument(
        "--set",
        action="extend",
        nargs="+",
        metavar="KEY=VALUE",
        help=f"override config keys, dotted, values as YAML: {example}" + (f" ({note})" if note else ""),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (2: bad input, 130: interrupted, 143: stopped by SIGTERM).
    Called from Python, it gives torch back the thread count it found (a run sets its ``torch_threads``)."""
    args = build_parser().parse_args(argv)
    torch = sys.modules.get("torch")  # imported already: the caller's threads to give back
    threads = None if torch is None else torch.get_num_threads()
    try:
        return int(args.func(args))
    except CLIError as err:
        print(f"covey: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ncovey: interrupted.", file=sys.stderr)
        return 130
    finally:
        if threads is not None and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
