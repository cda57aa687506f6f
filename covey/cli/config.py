"""Run configs: a YAML file (or the short form's flags) checked into a typed :class:`RunConfig`.

Everything is checked before any env step is taken: unknown keys (top level, and hyperparameters against
the agent constructor's signature), wrong types, and values the agent's own config refuses. Numbers such
as ``1e6`` are accepted where integers are expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import pathlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml


class CLIError(Exception):
    """A problem with what the user asked for; the command line prints it (no traceback) and exits with 2."""


# ---------------------------------------------------------------------------- YAML with YAML 1.2 numbers
class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading ``1e6`` and ``3e-4`` as floats (YAML 1.1 wants ``1.0e+6``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, what: str) -> Any:
    """Parse YAML text (safe: plain data only); ``what`` names the source in the error."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        raise CLIError(f"{what} is not valid YAML: {_one_line(err)}") from err


def parse_env_kwargs(text: str | None) -> dict[str, Any] | None:
    """``--env-kwargs '{"N": 3}'`` (JSON or YAML) as a dict."""
    if text is None:
        return None
    value = parse_yaml(text, "--env-kwargs")
    if not isinstance(value, dict):
        raise CLIError(f"--env-kwargs must be a mapping such as '{{\"N\": 3}}', got {text!r}.")
    return value


def _one_line(err: yaml.YAMLError) -> str:
    """A YAML error as one line: its problem and where (PyYAML draws the spot over several lines)."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem is None:
        return " ".join(str(err).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(err, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def load_yaml_file(path: str | pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(path)
    if path.is_dir():
        raise CLIError(f"Config file {str(path)!r} is a folder; give the YAML file in it.")
    if not path.is_file():
        raise CLIError(f"Config file {str(path)!r} does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CLIError(
            f"{path} is not UTF-8 text ({err.reason} at byte {err.start}): save it as a UTF-8 YAML file."
        ) from err
    data = parse_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CLIError(
            f"{path} must hold a mapping of keys (agent, env, hyperparameters, ...), not a {type(data).__name__}."
        )
    return data


def apply_sets(raw: dict[str, Any], sets: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set key=value`` overrides (dotted keys, values parsed as YAML) to a copy of ``raw``."""
    out = _deep_copy(raw)
    for item in sets:
        if "=" not in item:
            raise CLIError(f"--set {item!r}: expected key=value, e.g. --set hyperparameters.learning_rate=1e-3.")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise CLIError(f"--set {item!r}: the key {key!r} has an empty part.")
        value = parse_yaml(text, f"--set {key}") if text.strip() else None
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise CLIError(f"--set {item!r}: {'.'.join(parts[: depth + 1])} is not a mapping.")
            node = child
        node[parts[-1]] = value
    return out


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


# ---------------------------------------------------------------------------- the typed config
AGENTS = ("ppo", "sac", "poca")
# SuperSuit names that build vector envs rather than wrap one env copy.
_VECTOR_HELPERS = {
    "concat_vec_envs_v1",
    "gym_vec_env_v0",
    "pettingzoo_env_to_vec_env_v1",
    "stable_baselines3_vec_env_v0",
    "stable_baselines_vec_env_v0",
    "vectorize_aec_env_v0",
}
# Constructor arguments that the run config sets itself (the key to use instead).
_RESERVED = {
    "policy": "the top-level key 'policy'",
    "env": "the top-level keys 'env' and 'env_kwargs'",
    "seed": "the top-level key 'seed'",
    "n_envs": "the top-level key 'n_envs'",
    "tensorboard_log": "nothing: the run folder holds the TensorBoard logs",
    "_init_setup_model": "nothing",
}


# Keys of a finished run's config that --resume may change (the rest would no longer be the same run).
RESUME_OVERRIDABLE = (
    "timesteps",
    "eval_freq",
    "eval_episodes",
    "eval_deterministic",
    "checkpoint_freq",
    "torch_threads",
    "n_processes",
)


@dataclass
class RunConfig:
    """What ``covey train`` runs: one agent, one env, a budget, and how to evaluate and checkpoint.

    >>> cfg = RunConfig.from_dict({"agent": "ppo", "env": "CartPole-v1", "timesteps": "1e4"})
    >>> cfg.timesteps
    10000
    """

    agent: str
    """Algorithm: ppo, sac (Gymnasium envs) or poca (PettingZoo teams)."""
    env: str
    """Gymnasium id (``CartPole-v1``) for ppo/sac; ``module:name`` PettingZoo env for poca."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gym.make`` or ``<module>.<name>.parallel_env``."""
    n_envs: int = 1
    """Env copies stepped together."""
    n_processes: int = 1
    """poca: processes that step the copies, in blocks (``SubprocGroupVecEnv(..., n_processes)``; 1: all in the
    training process)."""
    wrappers: list[dict[str, Any]] = field(default_factory=list)
    """SuperSuit wrappers applied to each env copy, in order: ``{name: clip_reward_v0, kwargs: {...}}``."""
    policy: str = "MlpPolicy"
    """Policy name: MlpPolicy, CnnPolicy, MultiInputPolicy, MlpLstmPolicy, ..."""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent's constructor (SB3 names), incl. policy_kwargs."""
    timesteps: int = 100_000
    """Training budget in env steps (all copies together)."""
    seed: int | None = 0
    """Seed of agent and envs (null: a random one, recorded in the run's config.yaml)."""
    eval_freq: int = 10_000
    """Evaluate every this many env steps and at the end (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation (0: no evaluation at all)."""
    eval_deterministic: bool = True
    """Evaluate the most likely action (true) or sampled actions (false)."""
    checkpoint_freq: int = 50_000
    """Save a resumable checkpoint every this many env steps (0: only at the end or on Ctrl-C)."""
    torch_threads: int = 1
    """torch.set_num_threads for the run (1 is fastest for small MLPs)."""

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        """Check and convert a raw mapping (from YAML and flags); raises :class:`CLIError` naming the key."""
        unknown = [k for k in raw if k not in cls.keys()]
        if unknown:
            raise CLIError(_unknown_message("config key", unknown[0], cls.keys()))
        for key in ("agent", "env"):
            if raw.get(key) in (None, ""):
                raise CLIError(f"The config needs '{key}'{_field_doc(key)}.")
        agent = raw["agent"]
        if not isinstance(agent, str) or agent.lower() not in AGENTS:
            raise CLIError(f"agent: {agent!r} is not one of {', '.join(AGENTS)}.")
        values: dict[str, Any] = {"agent": agent.lower()}
        values["env"] = _expect(raw, "env", str)
        values["policy"] = _expect(raw, "policy", str, "MlpPolicy")
        values["env_kwargs"] = dict(_expect(raw, "env_kwargs", dict, {}) or {})
        values["hyperparameters"] = dict(_expect(raw, "hyperparameters", dict, {}) or {})
        values["wrappers"] = _wrappers(raw.get("wrappers"))
        defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        for key, low in (
            ("n_envs", 1),
            ("n_processes", 1),
            ("timesteps", 1),
            ("eval_freq", 0),
            ("eval_episodes", 0),
            ("checkpoint_freq", 0),
            ("torch_threads", 1),
        ):
            value = to_int(raw.get(key, defaults[key]), key)
            if value < low:
                raise CLIError(f"{key}={value} is invalid: it must be >= {low}{_field_doc(key)}.")
            values[key] = value
        seed = raw.get("seed", 0)
        values["seed"] = None if seed is None else to_int(seed, "seed")
        deterministic = raw.get("eval_deterministic", True)
        if not isinstance(deterministic, bool):
            raise CLIError(f"eval_deterministic={deterministic!r} is invalid: use true or false.")
        values["eval_deterministic"] = deterministic
        if values["n_processes"] > 1 and values["agent"] != "poca":
            raise CLIError(
                f"n_processes={values['n_processes']} is for poca, whose copies can step in several processes; "
                f"{values['agent']} steps its copies in the training process. Drop n_processes."
            )
        if values["n_processes"] > values["n_envs"]:
            raise CLIError(
                f"n_processes={values['n_processes']} is more than the {values['n_envs']} env copies (n_envs) it "
                "would split into blocks: raise n_envs or lower n_processes."
            )
        cfg = cls(**values)
        check_hyperparameters(cfg.agent, cfg.hyperparameters)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def is_group(self) -> bool:
        """POCA trains a PettingZoo team; PPO and SAC a Gymnasium env."""
        return self.agent == "poca"


def _field_doc(name: str) -> str:
    """`` (what the key is)`` for an error message, from RunConfig's docstring of it; empty where it has none."""
    doc = _FIELD_DOCS.get(name, "")
    if doc.endswith(".") and not doc.endswith("..."):
        doc = doc[:-1]
    return f" ({doc})" if doc else ""


def _expect(raw: dict, key: str, kind: type, default: Any = None) -> Any:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise CLIError(f"{key}: expected a {kind.__name__}, got {value!r}{_field_doc(key)}.")
    return value


COVEY_WRAPPERS = ("one_side",)
"""covey's own env wrappers a config's ``wrappers`` may name beside SuperSuit's (:mod:`covey.wrappers`)."""


def _wrappers(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CLIError("wrappers: expected a list such as [{name: clip_reward_v0, kwargs: {lower_bound: -1}}].")
    import supersuit

    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise CLIError(f"wrappers[{i}]: expected {{name: <SuperSuit wrapper>, kwargs: {{...}}}}, got {item!r}.")
        extra = set(item) - {"name", "kwargs"}
        if extra:
            raise CLIError(f"wrappers[{i}]: unknown key {sorted(extra)[0]!r}; a wrapper has 'name' and 'kwargs'.")
        name = item["name"]
        known = sorted(n for n in dir(supersuit) if re.search(r"_v\d+$", n) and n not in _VECTOR_HELPERS)
        if name not in known and name not in COVEY_WRAPPERS:
            raise CLIError(f"wrappers[{i}]: " + _unknown_message("SuperSuit wrapper", name, [*known, *COVEY_WRAPPERS]))
        kwargs = item.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise CLIError(f"wrappers[{i}] ({name}): kwargs must be a mapping, got {kwargs!r}.")
        out.append({"name": name, "kwargs": dict(kwargs)})
    return out


def _unknown_message(kind: str, name: str, known: Iterable[str]) -> str:
    known = list(known)
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"Unknown {kind} {name!r}.{hint} Known: {', '.join(known)}."


def to_int(value: Any, key: str) -> int:
    """An integer from an int, an integral float (``1e6``) or such a string; else a CLIError naming ``key``."""
    if isinstance(value, bool):
        raise CLIError(f"{key}={value!r} is invalid: expected an integer.")
    if isinstance(value, str):
        try:
            value = float(value.replace("_", ""))
        except ValueError:
            raise CLIError(f"{key}={value!r} is invalid: expected an integer such as 100000 or 1e5.") from None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise CLIError(f"{key}={value!r} is invalid: expected a whole number.")
        return int(value)
    if isinstance(value, int):
        return value
    raise CLIError(f"{key}={value!r} is invalid: expected an integer.")


_FIELD_DOCS: dict[str, str] = {}


def _read_field_docs() -> None:
    """The attribute docstrings of RunConfig (the line under each field), for error messages."""
    source = inspect.getsource(RunConfig)
    for match in re.finditer(r"^    (\w+): [^\n]+\n    \"\"\"(.+?)\"\"\"", source, flags=re.M | re.S):
        _FIELD_DOCS[match.group(1)] = " ".join(match.group(2).replace("``", "").split())  # one line, no markup


try:
    _read_field_docs()
except (OSError, TypeError):  # no source available (e.g. a frozen build): messages just lose their hint
    pass


# ---------------------------------------------------------------------------- hyperparameters
def agent_signature(agent: str) -> dict[str, inspect.Parameter]:
    """The agent constructor's keyword parameters a config may set."""
    from covey.agents import agent_class

    params = inspect.signature(agent_class(agent).__init__).parameters
    return {name: p for name, p in params.items() if name != "self" and name not in _RESERVED}


def check_hyperparameters(agent: str, hyper: dict[str, Any]) -> None:
    """Names against the constructor's signature, and simple types from its annotations (ints accept 1e6).

    Converts integral floats to ints in place where the constructor wants an int. Ranges are left to the
    agent's own config, which refuses bad values with a message naming the field.
    """
    from covey.agents import agent_class

    cls = agent_class(agent)
    allowed = agent_signature(agent)
    for name in list(hyper):
        if name in _RESERVED:
            raise CLIError(f"hyperparameters.{name} cannot be set here: use {_RESERVED[name]}.")
        if name not in allowed:
            raise CLIError("hyperparameters: " + _unknown_message(f"{cls.__name__} argument", name, sorted(allowed)))
        hyper[name] = _check_type(f"hyperparameters.{name}", hyper[name], str(allowed[name].annotation), cls)


def _alternatives(annotation: str) -> list[str]:
    """Top-level alternatives of a union annotation string: ``"int | tuple[int, str]"`` -> two items."""
    parts, depth, current = [], 0, ""
    for ch in annotation:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return parts


def _check_type(key: str, value: Any, annotation: str, cls: type) -> Any:
    name = key.split(".")[-1]
    kinds = set(_alternatives(annotation))
    if value is None:
        if "None" in kinds:
            return None
        raise CLIError(f"{key} cannot be null.")
    if name in getattr(cls, "schedule_keys", ()) and isinstance(value, str) and value.strip().startswith("lin_"):
        parse_schedule(key, value)  # checked here, built when the agent is made
        return value
    if kinds & {"int", "float", "Schedule"} and isinstance(value, str) and not kinds & {"str"}:
        try:
            value = float(value)
        except ValueError:
            extra = " or a linear schedule such as lin_0.001" if "Schedule" in kinds else ""
            raise CLIError(f"{key}={value!r} is invalid: expected a number{extra}.") from None
    if "int" in kinds and "float" not in kinds and "Schedule" not in kinds and isinstance(value, float):
        return to_int(value, key)
    if kinds == {"bool"} and not isinstance(value, bool):
        raise CLIError(f"{key}={value!r} is invalid: use true or false.")
    if (kinds <= {"float", "Schedule"} or kinds <= {"float", "None"}) and not (
        isinstance(value, (int, float)) and not isinstance(value, bool)
    ):
        raise CLIError(f"{key}={value!r} is invalid: expected a number.")
    return value


def parse_schedule(key: str, text: str) -> float:
    """``lin_<initial>``: a value falling linearly from ``initial`` to 0 over the run (RL-Zoo's notation)."""
    match = re.fullmatch(r"lin_(\+?[0-9.]+(?:[eE][-+]?[0-9]+)?)", text.strip())
    if match is None:
        raise CLIError(
            f"{key}={text!r} is invalid: expected a number or a linear schedule written lin_<initial value>, "
            "e.g. lin_0.001."
        )
    return float(match.group(1))


def linear_schedule(initial: float) -> Callable[[float], float]:
    """A linear decay from ``initial`` to 0 over the whole run. A resumed run continues it: its ``learn`` call
    (``reset_num_timesteps=False``, from the checkpoint's step count) passes the run's progress remaining."""

    def schedule(progress_remaining: float) -> float:
        return initial * progress_remaining

    return schedule


_CLASS_KEYS = ("activation_fn", "optimizer_class")


def agent_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The agent constructor's keyword arguments for ``cfg`` (schedules and class names resolved)."""
    import torch

    from covey.agents import agent_class

    cls = agent_class(cfg.agent)
    kwargs = _deep_copy(cfg.hyperparameters)
    for key in getattr(cls, "schedule_keys", ()):
        if isinstance(kwargs.get(key), str):
            kwargs[key] = linear_schedule(parse_schedule(f"hyperparameters.{key}", kwargs[key]))
    noise = kwargs.get("action_noise")
    if isinstance(noise, dict):  # SB3's noise by its class name and arguments, as SAC's model file keeps it
        from covey.noise import noise_from_json

        try:
            kwargs["action_noise"] = noise_from_json(noise)
        except (KeyError, TypeError, ValueError) as err:
            raise CLIError(
                f"hyperparameters.action_noise={noise!r} is invalid ({err!r}): give class: NormalActionNoise with "
                "mean and sigma (one number per action dimension), or class: OrnsteinUhlenbeckActionNoise with "
                "mean, sigma, theta and dt."
            ) from err
    policy_kwargs = kwargs.get("policy_kwargs")
    if policy_kwargs is not None:
        if not isinstance(policy_kwargs, dict):
            raise CLIError(f"hyperparameters.policy_kwargs must be a mapping, got {policy_kwargs!r}.")
        for key in _CLASS_KEYS:
            value = policy_kwargs.get(key)
            if isinstance(value, str):
                module = torch.optim if key == "optimizer_class" else torch.nn
                base = torch.optim.Optimizer if key == "optimizer_class" else torch.nn.Module
                name = value.rsplit(".", 1)[-1]
                found = getattr(module, name, None)
                if not (isinstance(found, type) and issubclass(found, base)):
                    where = "torch.optim" if key == "optimizer_class" else "torch.nn"
                    raise CLIError(
                        f"hyperparameters.policy_kwargs.{key}={value!r} is not a class in {where} "
                        f"(e.g. {'Adam' if key == 'optimizer_class' else 'Tanh'})."
                    )
                policy_kwargs[key] = found
    return kwargs


def schedule_objects(cfg: RunConfig) -> dict[str, Any]:
    """Schedules to hand back to ``load`` (a model file keeps only their current value)."""
    kwargs = agent_kwargs(cfg)
    return {k: v for k, v in kwargs.items() if callable(v) and not isinstance(v, type)}
