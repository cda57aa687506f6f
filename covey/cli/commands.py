"""The commands that use a trained model or finished runs: eval, enjoy, plot, export, check."""

from __future__ import annotations

import pathlib
import sys
import warnings
from typing import Any

from covey.cli.config import CLIError, RunConfig, apply_sets, load_yaml_file, parse_env_kwargs
from covey.cli.training import RunFolder


def resolve_model(
    target: str, env: str | None, env_kwargs: dict | None, best: bool = False
) -> tuple[pathlib.Path, RunConfig]:
    """A run folder or a model file, as ``(model file, run config)``; a bare model file needs ``env``."""
    path = pathlib.Path(target)
    if path.is_dir():
        folder = RunFolder(path)
        if not folder.is_run():
            raise CLIError(f"{path} is a folder but not a run folder (it has no config.yaml).")
        raw = load_yaml_file(folder.config)
        if env is not None:
            raw["env"] = env
        if env_kwargs is not None:
            raw["env_kwargs"] = env_kwargs
        cfg = RunConfig.from_dict(raw)
        if best:
            if not folder.best_model.is_file():
                raise CLIError(f"{folder.best_model} does not exist (the run has no evaluation yet).")
            return folder.best_model, cfg
        return folder.latest_model(), cfg
    if not path.is_file():
        raise CLIError(f"{target!r} is neither a run folder nor a model file.")
    if best:
        raise CLIError("--best needs a run folder, not a model file.")
    from covey.agents import file_agent

    try:
        agent = file_agent(path).lower()
    except ValueError as err:
        raise CLIError(str(err)) from err
    if env is None:
        example = "mpe2:simple_spread_v3" if agent == "poca" else "CartPole-v1"
        raise CLIError(f"{path} is a bare model file: pass the env it was trained on with --env, e.g. --env {example}.")
    return path, RunConfig.from_dict({"agent": agent, "env": env, "env_kwargs": env_kwargs or {}})


def episode_seed(args: Any, cfg: RunConfig) -> int:
    """``--seed``, or by default the seed the run's own evaluations played (a run folder), or 0 (a model file)."""
    if args.seed is not None:
        return args.seed
    if pathlib.Path(args.target).is_dir() and cfg.seed is not None:
        return int(cfg.seed) + 1000  # as covey train's Evaluator
    return 0


def _trained_with_wrappers(target: str, path: pathlib.Path) -> str:
    """The end of an error for a model that does not fit the env it was given: wrappers it trained with may be why."""
    if pathlib.Path(target).is_dir():
        return (
            f" The run's config.yaml names the env and the wrappers it trained with; --env and --env-kwargs replace "
            f"its env (and keep its wrappers): leave them out to evaluate {target} as it trained."
        )
    for folder in (path.parent, path.parent.parent):  # a run's model, or one of its checkpoints
        if RunFolder(folder).is_run():
            return f" If it trained with wrappers, evaluate its run folder, whose config names them: {folder}."
    return (
        " A model trained with wrappers (SuperSuit's, say) plays only through them: evaluate a run folder whose "
        "config names them, or evaluate in Python on the wrapped env."
    )


def load_model(path: pathlib.Path, cfg: RunConfig, target: str) -> Any:
    """Load with covey.agents.load, and check the model fits the env it will play."""
    import torch

    from covey.agents import load

    torch.set_num_threads(cfg.torch_threads)  # the run's setting; 1 (the default) is fastest for small MLPs

    try:
        model = load(path, device="cpu")
    except ValueError as err:
        raise CLIError(str(err)) from err
    from covey.cli.envs import env_fn

    env = env_fn(cfg)()
    try:
        if cfg.is_group:
            from covey.wrappers.group_env import MixedSpacesError, as_parallel, check_group_spaces

            try:
                obs_space, act_space = check_group_spaces(as_parallel(env))
            except MixedSpacesError as err:  # which the wrappers a model trained with may have made equal
                raise CLIError(
                    f"{cfg.env}: its agents differ in their spaces (a group shares {err.problems}), so no model "
                    f"of one team plays it as it is.{_trained_with_wrappers(target, path)}"
                ) from err
            except ValueError as err:
                raise CLIError(f"{cfg.env}: {err}") from err
        else:
            obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    from covey.spaces import same_space

    if not same_space(model.observation_space, obs_space) or not same_space(model.action_space, act_space):
        raise CLIError(
            f"The model ({path}) was trained with observation space {model.observation_space} and action space "
            f"{model.action_space}; {cfg.env} has {obs_space} and {act_space}. Pass the env it was trained on."
            + _trained_with_wrappers(target, path)
        )
    # SB3's VecNormalize statistics, where SB3 and RL Zoo save them: beside the model (its checkpoints'
    # rl_model_vecnormalize_<N>_steps.pkl too), or in RL Zoo's env folder (beside <env>.zip and best_model.zip)
    folders = (path.parent, path.parent / path.stem, path.parent / str(cfg.env).split(":")[-1])
    for statistics in sorted({found for folder in folders for found in folder.glob("*vecnormalize*.pkl")}):
        if statistics.is_file():
            print(
                f"covey: {statistics} holds SB3's VecNormalize statistics, which this command does not read (a "
                "pickle; covey never unpickles): the model sees the env's raw observations and rewards, and may "
                "score lower than where it trained. Evaluate in Python with VecNormalize.load(path, venv) "
                "(training=False, norm_reward=False) and SB3's evaluate_policy.",
                file=sys.stderr,
            )
            break
    return model


def cmd_eval(args: Any) -> int:
    from covey.cli.evaluation import Evaluator

    path, cfg = resolve_model(args.target, args.env, parse_env_kwargs(args.env_kwargs), args.best)
    model = load_model(path, cfg, args.target)
    if args.episodes < 1:
        raise CLIError("--episodes must be >= 1.")
    evaluator = Evaluator(cfg, args.episodes, deterministic=not args.stochastic, seed=episode_seed(args, cfg))
    mean, std = evaluator(model)
    evaluator.close()
    kind = "stochastic" if args.stochastic else "deterministic"
    what = "group return (sum over the team)" if cfg.is_group else "return"
    print(f"{path} on {cfg.env}: {args.episodes} episodes, {kind} actions")
    print(f"mean {what}: {mean:.2f} +/- {std:.2f}")
    return 0


def cmd_enjoy(args: Any) -> int:
    import gymnasium as gym

    from covey.cli.evaluation import record_gif

    path, cfg = resolve_model(args.target, args.env, parse_env_kwargs(args.env_kwargs), args.best)
    model = load_model(path, cfg, args.target)
    for flag, value in (("--episodes", args.episodes), ("--fps", args.fps), ("--max-frames", args.max_frames)):
        if value < 1:
            raise CLIError(f"{flag} must be >= 1, got {value}.")
    out = args.gif
    if out is None:
        base = pathlib.Path(args.target) if pathlib.Path(args.target).is_dir() else path.parent
        out = base / f"{path.stem}.gif"
    try:
        gif, n_frames, returns = record_gif(
            model,
            cfg,
            out,
            episodes=args.episodes,
            deterministic=not args.stochastic,
            seed=episode_seed(args, cfg),
            fps=args.fps,
            max_frames=args.max_frames,
        )
    except (ValueError, ImportError, OSError, gym.error.Error) as err:  # e.g. no RGB rendering, pygame missing,
        raise CLIError(f"Cannot record {cfg.env}: {err}") from err  # or --gif naming a folder
    shown = ", ".join(f"{r:.2f}" for r in returns)
    print(f"wrote {gif}: {len(returns)} episode(s), {n_frames} frames; returns: {shown}")
    if n_frames >= args.max_frames:
        print(
            f"covey: the recording reached --max-frames {args.max_frames} ({len(returns)} of {args.episodes} "
            "episode(s) played): the last may be cut short, and its return with it. Raise --max-frames for whole "
            "episodes.",
            file=sys.stderr,
        )
    return 0


def cmd_plot(args: Any) -> int:
    from covey.plotting import plot_runs

    for run in args.runs:
        if not (pathlib.Path(run) / "progress.csv").is_file():
            raise CLIError(f"{run} is not a run folder with a progress.csv.")
    try:
        out = plot_runs([pathlib.Path(r) for r in args.runs], args.out)
    except (ValueError, OSError) as err:  # e.g. --out naming a folder
        raise CLIError(str(err)) from err
    print(f"wrote {out}")
    return 0


def cmd_export(args: Any) -> int:
    path = pathlib.Path(args.target)
    sb3 = args.sb3
    if sb3 is not None and args.onnx:
        raise CLIError("--onnx and --sb3 write different files; give one of them.")
    if path.is_dir():
        model_path = RunFolder(path).latest_model()
        default = path / ("model_sb3.zip" if sb3 is not None else "model.onnx")
    elif path.is_file():
        model_path = path
        default = path.with_name(f"{path.stem}_sb3.zip") if sb3 is not None else path.with_suffix(".onnx")
    else:
        raise CLIError(f"{args.target!r} is neither a run folder nor a model file.")
    out = pathlib.Path(sb3 or args.onnx or default)
    import torch

    from covey.agents import load

    torch.set_num_threads(1)

    try:
        model = load(model_path, device="cpu")
    except ValueError as err:
        raise CLIError(str(err)) from err
    if sb3 is not None:
        return _export_sb3(model, model_path, out)
    try:
        from covey.export import export_onnx

        with warnings.catch_warnings():  # a failed verification is reported below, once
            warnings.filterwarnings("ignore", message="The ONNX export at", category=RuntimeWarning)
            result = export_onnx(model, out)
    except (ImportError, ValueError, RuntimeError, OSError) as err:  # export_onnx's errors say what to do
        raise CLIError(str(err)) from err
    return _report_export(
        f"{result.get('path', out)} from {model_path}",
        bool(result.get("verified")),
        f"onnxruntime against model.predict on {result.get('n_samples')} sampled observations, max abs difference "
        f"{result.get('max_abs_diff')}",
        "the ONNX model's outputs do not match the torch model's.",
    )


def _report_export(wrote: str, verified: bool, how: str, mismatch: str) -> int:
    """What ``covey export`` wrote and how it was verified (stdout), the mismatch on stderr; the exit status."""
    print(f"wrote {wrote}")
    print(f"verified: {verified} ({how})")
    if not verified:
        print(f"covey: {mismatch}", file=sys.stderr)
        return 1
    return 0


def _export_sb3(model: Any, model_path: pathlib.Path, out: pathlib.Path) -> int:
    """``covey export --sb3``: the model as SB3's file (:meth:`~covey.agents.base.BaseAgent.to_sb3_model`; sb3-contrib's
    RecurrentPPO for a PPO with memory), written atomically; its bytes, read back by that class's own ``load``, are
    checked to act as covey's model (a model with memory over a few steps, its memories carried)."""
    import io

    import numpy as np
    from gymnasium import spaces

    from covey.agents.sb3_policy import action_start
    from covey.export import compare_actions, sample_observations
    from covey.files import write_atomically

    out = out if out.suffix == ".zip" else out.with_name(out.name + ".zip")  # as SB3's save names it
    try:
        sb3_model = model.to_sb3_model()
    except ValueError as err:
        raise CLIError(f"Cannot write {model_path} as an SB3 model: {err}") from err
    data = io.BytesIO()
    sb3_model.save(data)
    try:
        write_atomically(out, lambda f: f.write(data.getvalue()))
    except OSError as err:
        raise CLIError(str(err)) from err
    sb3_class = type(sb3_model)
    library = sb3_class.__module__.split(".")[0]  # stable_baselines3, or sb3_contrib
    loaded = sb3_class.load(io.BytesIO(data.getvalue()), device="cpu")  # as written
    steps = 1 if model._memory() is None else 4
    ours, theirs, ours_state, theirs_state = [], [], None, None
    for step in range(steps):  # a memory's later steps read what the first ones left in it
        obs = sample_observations(model.observation_space, 32, seed=step)
        kwargs = {} if steps == 1 else {"episode_start": np.full(32, step == 0)}
        action, ours_state = model.predict(obs, state=ours_state, deterministic=True, **kwargs)
        ours.append(action)
        action, theirs_state = loaded.predict(obs, state=theirs_state, deterministic=True, **kwargs)
        theirs.append(action)
    ours, theirs = np.concatenate(ours), np.concatenate(theirs)
    start = action_start(model.action_space)  # SB3 acts from 0 whatever the start (to_sb3_model warned of it)
    ours, against = (ours, "model.predict") if start is None else (ours - start, "model.predict minus the start")
    verified, difference = compare_actions(ours, theirs, discrete=not isinstance(model.action_space, spaces.Box))
    what = "32 sampled observations" if steps == 1 else f"{steps} steps of 32 sampled observations, memories carried"
    name = {"stable_baselines3": "Stable-Baselines3", "sb3_contrib": "sb3-contrib"}.get(library, library)
    return _report_export(
        f"{out} ({name} {sb3_class.__name__}) from {model_path}",
        verified,
        f"{library}.{sb3_class.__name__}.load of it against {against} on {what}, max abs difference {difference:.3g}",
        f"{name}'s model of the file does not act as the covey model.",
    )


def cmd_check(args: Any) -> int:
    from covey.cli.training import prepare

    failed = 0
    for name in args.configs:
        try:
            cfg = RunConfig.from_dict(apply_sets(load_yaml_file(name), args.set or []))
            env, _ = prepare(cfg)
            env.close()
        except CLIError as err:
            failed += 1
            print(f"FAIL {name}: {err}")
            continue
        print(f"ok   {name}: {cfg.agent} on {cfg.env}, {cfg.n_envs} env(s), {cfg.timesteps:,} steps")
    return 2 if failed else 0
