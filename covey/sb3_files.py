"""Stable-Baselines3 model files, read without unpickling anything.

An SB3 ``.zip`` holds ``data``, a JSON object of the model's settings, and the networks' state dicts
(``policy.pth``, the optimizers', SAC's ``pytorch_variables.pth``). Settings that JSON cannot hold (spaces,
schedules, classes in ``policy_kwargs``) are cloudpickled inside ``data``, and SB3 writes their plain
attributes beside each pickle for people to read. covey reads those attributes and the JSON values, and the
tensors with ``torch.load(weights_only=True)``; it never unpickles, so what a pickle alone holds (a schedule
written as a function, a custom class) is not read: the load says what it left out and how to pass it again.
sb3-contrib's RecurrentPPO writes the same file, with an LSTM per network: covey's PPO reads it as its recurrent
policy of the same name (``MlpLstmPolicy``, ...).

:func:`read_sb3_model` turns a file into covey's settings and parameter groups, which
:meth:`covey.agents.base.BaseAgent.load` then loads like a covey file.
"""

from __future__ import annotations

import ast
import base64
import binascii
import dataclasses
import json
import pickletools
import re
import zipfile
from typing import Any

import numpy as np
from gymnasium import spaces

from covey import serialization
from covey.buffers.her import HER_KWARGS, STRATEGIES
from covey.warning import warn_user

DATA_ENTRY = "data"
POLICY_ENTRY = "policy.pth"
VARIABLES_ENTRY = "pytorch_variables.pth"
OPTIMIZER_ENTRIES = {  # the policy's optimizers' states: PPO's, SAC's
    "policy.optimizer": "policy.optimizer.pth",
    "actor.optimizer": "actor.optimizer.pth",
    "critic.optimizer": "critic.optimizer.pth",
    "ent_coef_optimizer": "ent_coef_optimizer.pth",
}


def is_sb3_file(names: set[str]) -> bool:
    """Whether a zip's entry names are those of an SB3 model file."""
    return DATA_ENTRY in names and POLICY_ENTRY in names


# ------------------------------------------------------------------------------------------------ spaces


def parse_space(text: str) -> spaces.Space:
    """A Gymnasium space from its ``repr`` (``Box(-1.0, 1.0, (3,), float32)``, ``Discrete(3, start=1)``,
    ``MultiDiscrete([3 2])``, ``MultiBinary(4)``, ``Dict('a': ..., 'b': ...)``), nested Dicts included.
    Raises ``ValueError`` for anything else, or for a repr whose arrays NumPy printed summarized (``...``) unless
    every value printed is the same (a Box of equal bounds)."""
    text = text.strip()
    match = re.fullmatch(r"(\w+)\((.*)\)", text, flags=re.DOTALL)
    if match is None:
        raise ValueError(f"not a space's repr: {text[:80]!r}")
    kind, body = match.groups()
    args = _split_top(body)
    if kind == "Box":
        if len(args) != 4:
            raise ValueError(f"a Box repr has 4 parts: {text[:80]!r}")
        shape = tuple(int(n) for n in ast.literal_eval(args[2]))
        dtype = np.dtype(args[3])
        return spaces.Box(_array(args[0], shape, dtype), _array(args[1], shape, dtype), shape, dtype)
    if kind == "Discrete":
        keywords = _keywords(args[1:])
        return spaces.Discrete(int(args[0]), start=int(keywords.get("start", "0")))
    if kind == "MultiDiscrete":
        nvec = np.asarray(_numbers(args[0]), dtype=np.int64)
        keywords = _keywords(args[1:])
        start = np.asarray(_numbers(keywords["start"]), dtype=np.int64) if "start" in keywords else None
        return spaces.MultiDiscrete(nvec, start=start)
    if kind == "MultiBinary":
        return spaces.MultiBinary(_multibinary_n(args[0]))
    if kind == "Dict":
        return spaces.Dict(_parse_items(body))
    raise ValueError(f"covey does not read {kind} spaces from SB3 files.")


def _parse_items(body: str) -> dict[str, spaces.Space]:
    """``'a': Box(...), 'b': Discrete(2)`` (a Dict's repr inside its parentheses, or a dict's inside braces)."""
    items = {}
    for part in _split_top(body):
        key, _, value = part.partition(":")
        items[ast.literal_eval(key.strip())] = parse_space(value)
    return items


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, parentheses, braces and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _keywords(args: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in args)


def _numbers(text: str) -> Any:
    """A number or a (nested) list of numbers as NumPy prints them (``[-1. 2.5 inf]``, ``[[1 2]\\n [3 4]]``)."""
    text = text.strip()
    if "..." in text:
        raise ValueError("the array was printed summarized (too many elements to print in full)")
    text = re.sub(r"(?<![\w.])(-?)inf\b", r"\1Infinity", text)
    text = re.sub(r"\bnan\b", "NaN", text)
    text = re.sub(r"(\d)\.(?![\d])", r"\1.0", text)  # "1." -> "1.0"
    text = re.sub(r"(?<=[\d\]a-zA-Z])\s+(?=[-\d\[IN])", ",", text)  # whitespace between elements -> commas
    text = re.sub(r"\[\s+", "[", text)
    return json.loads(text)


def _multibinary_n(text: str) -> int | list[int]:
    """MultiBinary's ``n``: ``4``, ``(2, 3)`` or ``[2 3]``."""
    text = text.strip()
    n = ast.literal_eval(text) if text.startswith("(") else _numbers(text)
    return [int(k) for k in n] if isinstance(n, (list, tuple)) else int(n)


def _array(text: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A Box bound: a scalar for all elements, or an array of ``shape``. NumPy prints an array of over 1,000
    elements summarized (its first and last rows and columns around ``...``): one whose printed elements all hold
    one value (an image's 0 or 255) is read as that value everywhere; any other is refused."""
    text = text.strip()
    if "..." in text:
        shown = set(re.findall(r"-?[\w.+]+", text.replace("...", " ")))
        if len(shown) != 1:
            raise ValueError("a bound printed summarized (too many elements to print in full) with several values")
        text = shown.pop()
    values = np.asarray(_numbers(text))
    if not (np.issubdtype(dtype, np.integer) and values.dtype.kind in "iu"):  # integers as read: 2**63 - 1 is exact
        values = values.astype(np.float64)
    if values.ndim == 0:
        values = np.full(shape, values)
    if values.shape != shape:
        raise ValueError(f"a bound of shape {values.shape} for a Box of shape {shape}")
    return values.astype(dtype)


def _space_repr(kind: str, entry: dict) -> str:
    """The space's repr, as :func:`parse_space` reads it, from the attributes SB3 wrote beside its pickle."""
    if kind == "Box":
        # low_repr / high_repr: one number when every element has it, else the array (as low / high are)
        low, high = (entry.get(f"{bound}_repr") or entry[bound] for bound in ("low", "high"))
        return f"Box({low}, {high}, {tuple(int(n) for n in entry['_shape'])}, {entry['dtype']})"
    if kind == "Discrete":
        return f"Discrete({entry['n']}, start={entry.get('start', 0)})"
    if kind == "MultiDiscrete":
        start = f", start={entry['start']}" if "start" in entry else ""
        return f"MultiDiscrete({entry['nvec']}{start})"
    if kind == "MultiBinary":
        return f"MultiBinary({entry['n']})"
    if kind == "Dict":  # a dict's str, {'a': Box(...), ...}; gymnasium before 1.0 (and gym) wrote an OrderedDict's
        text = entry["spaces"].strip()
        ordered = re.fullmatch(r"OrderedDict\(\[(.*)\]\)", text, flags=re.DOTALL)
        if ordered:  # OrderedDict([('a', Box(...)), ...])
            pairs = [_split_top(pair.strip().removeprefix("(").removesuffix(")")) for pair in _split_top(ordered[1])]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError(f"not a Dict space's items: {text[:80]!r}")
            return f"Dict({', '.join(f'{key}: {space}' for key, space in pairs)})"
        return f"Dict({text.removeprefix('{').removesuffix('}')})"
    raise ValueError(f"covey does not read {kind} spaces from SB3 files")


def _space_kind(entry: Any) -> str | None:
    """The class name of a space SB3 pickled (``Box``, ``Dict``), from the type written beside the pickle."""
    if not isinstance(entry, dict) or ":type:" not in entry:
        return None
    kind = re.search(r"\.(\w+)'>$", str(entry[":type:"]))
    return kind.group(1) if kind else str(entry[":type:"])


def _space_entry(entry: Any, what: str, name: str) -> spaces.Space | str:
    """A space from its entry in ``data``: the pickle's type and its attributes written beside it; where those do
    not tell the space, why (``load`` raises with it unless ``custom_objects`` gives the space)."""
    kind = _space_kind(entry)
    if kind is None:
        return f"{name} has no readable {what}."
    try:
        return parse_space(_space_repr(kind, entry))
    except (KeyError, ValueError, TypeError, SyntaxError) as err:
        return f"Could not read the {what} of {name} from what SB3 wrote beside its pickle ({err})."


# ------------------------------------------------------------------------------------------------ the file

_ALGORITHMS = {  # the module of SB3's policy class -> the algorithm
    "stable_baselines3.sac.": "SAC",
    "stable_baselines3.td3.": "TD3 or DDPG",
    "stable_baselines3.dqn.": "DQN",
    "sb3_contrib.": "sb3-contrib",
}
_CONTRIB = {  # where sb3-contrib defines a policy class -> the algorithm that uses it
    "common.recurrent": "RecurrentPPO",
    "ppo_recurrent": "RecurrentPPO",
    "common.maskable": "MaskablePPO",
    "ppo_mask": "MaskablePPO",
    "qrdqn": "QRDQN",
    "tqc": "TQC",
    "ars": "ARS",
    "crossq": "CrossQ",
}
_COVEY_AGENTS = {"PPO": "PPO", "SAC": "SAC", "sb3-contrib RecurrentPPO": "PPO"}
"""The algorithms of the files covey reads -> covey's agent of them."""
_SETTING_NAMES = {"stats_window_size": "_stats_window_size"}
"""covey's hyperparameter -> SB3's attribute, where they differ."""


def read_sb3_model(path: Any, agent: str, config_class: type) -> tuple[dict, dict]:
    """covey's ``(settings, tensors)`` (what :func:`covey.serialization.load_model_file` returns) for the SB3
    model file at ``path`` (or a binary file object), which must hold an ``agent`` ("PPO" or "SAC") model whose
    hyperparameters are the fields of ``config_class``.

    ``settings["unread"]`` names the settings that only SB3's pickles hold (schedules written as functions,
    classes in ``replay_buffer_class``): the model takes covey's defaults for them."""
    name, source = serialization.resolve_model_path(path)
    try:
        with zipfile.ZipFile(source) as zf:
            data = json.loads(zf.read(DATA_ENTRY))
            policy = _load_tensors(zf, POLICY_ENTRY, name)
            names = set(zf.namelist())
            user_class = _user_policy_module(data, agent)
            # SB3's optimizers' states: a user's class trains its own parameters, in SB3's order, so they fit as
            # saved; covey's networks take them moved to covey's order (the model's set_parameters)
            optimizers = {
                group: _load_tensors(zf, entry, name) for group, entry in OPTIMIZER_ENTRIES.items() if entry in names
            }
            variables = _load_tensors(zf, VARIABLES_ENTRY, name) if VARIABLES_ENTRY in names else {}
            version = zf.read("_stable_baselines3_version").decode() if "_stable_baselines3_version" in names else "?"
    except (zipfile.BadZipFile, EOFError, OSError, RuntimeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise serialization.ModelFileError(f"{name} is a corrupt Stable-Baselines3 model file ({err}).") from err
    found = _algorithm(data)
    if _COVEY_AGENTS.get(found) != agent:
        if found in _COVEY_AGENTS:
            what = f"an {found}" if found.startswith("sb3-contrib") else f"a Stable-Baselines3 {found}"
            raise serialization.ModelFileError(
                f"{name} holds {what} model; load it with covey.{_COVEY_AGENTS[found]}.load."
            )
        raise _not_covey(name, found)
    policy_kwargs = _policy_kwargs(data.get("policy_kwargs"))
    policy_name = _policy_name(_space_kind(data.get("observation_space")), policy)
    if found == "sb3-contrib RecurrentPPO":
        policy_name = policy_name.replace("Policy", "LstmPolicy")
        policy_kwargs["lstm_hidden_size"] = _recurrent_hidden_size(name, policy, policy_kwargs)
    observation_space = _space_entry(data.get("observation_space"), "observation space", name)
    action_space = _space_entry(data.get("action_space"), "action space", name)
    if isinstance(action_space, spaces.Space) and np.any(getattr(action_space, "start", 0) != 0):
        warn_user(
            f"{name}: the action space {action_space} has a start, which SB3 ignores: this model acted from 0 in "
            f"SB3 (outside the space), and acts in the space in covey, each action shifted by start. If the env "
            "took SB3's actions as they were, give covey's model an env whose space starts at 0."
        )
    hyperparameters, unread = _hyperparameters(data, agent, config_class)
    noise = _action_noise(data.get("action_noise")) if agent == "SAC" else None
    if noise is False:
        unread.append("action_noise")
    tensors: dict[str, Any] = {"policy": policy}
    if (
        agent == "SAC"
        and "log_ent_coef" in variables
        and str(hyperparameters.get("ent_coef", "auto")).startswith("auto")
    ):
        tensors["ent_coef"] = {"log_ent_coef": variables["log_ent_coef"].reshape(1)}
    elif agent == "SAC" and "ent_coef_tensor" in variables and "ent_coef" in hyperparameters:
        # a fixed temperature: the one in force (a callback may have changed model.ent_coef_tensor)
        hyperparameters["ent_coef"] = float(variables["ent_coef_tensor"].reshape(()))
    settings = {
        "agent": agent,
        "policy": policy_name,
        "policy_kwargs": policy_kwargs,
        "hyperparameters": hyperparameters,
        **{
            key: serialization.space_to_json(space)
            if isinstance(space, spaces.Space)
            else serialization.unreadable_space(space)
            for key, space in (("observation_space", observation_space), ("action_space", action_space))
        },
        "n_envs": int(data.get("n_envs") or 1),
        "num_timesteps": int(data.get("num_timesteps") or 0),
        "total_timesteps": int(data.get("_total_timesteps") or 0),
        "n_updates": int(data.get("_n_updates") or 0),
        "current_progress_remaining": _plain(data.get("_current_progress_remaining"), float, 1.0),
        "seed": data.get("seed"),
        # plain JSON in SB3's file, kept as SB3's load keeps them (learn(reset_num_timesteps=False) goes on)
        "verbose": _plain(data.get("verbose"), int, 0),
        "tensorboard_log": _plain(data.get("tensorboard_log"), str, None),
        "episode_num": _plain(data.get("_episode_num"), int, 0),
        "system_info": {"Stable-Baselines3": version},
        "unread": unread,
        "sb3_file": True,
    }
    if noise:
        settings["action_noise"] = noise
    if user_class:  # SB3 pickled the class without its name: PPO builds it from the class given at load
        settings["policy"] = f"of the module {user_class}"
        settings["sb3_policy_class"] = True
    tensors.update(optimizers)
    return settings, tensors


def file_algorithm(path: Any) -> str:
    """The algorithm of the SB3 model file at ``path``: "PPO" or "SAC"; any other raises, naming it."""
    name, source = serialization.resolve_model_path(path)
    try:
        with zipfile.ZipFile(source) as zf:
            data = json.loads(zf.read(DATA_ENTRY))
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise serialization.ModelFileError(f"{name} is a corrupt Stable-Baselines3 model file ({err}).") from err
    finally:
        if hasattr(source, "seek"):
            source.seek(0)
    found = _algorithm(data)
    if found not in _COVEY_AGENTS:
        raise _not_covey(name, found)
    return _COVEY_AGENTS[found]


def _not_covey(name: str, found: str) -> serialization.ModelFileError:
    """The error for a file of an algorithm covey does not read, naming the loader that reads it."""
    if found.startswith("sb3-contrib"):
        algorithm = found.split(" ", 1)[1] if " " in found else None
        what = f"an {found}" if algorithm else "an sb3-contrib"
        where = f"sb3_contrib.{algorithm}.load" if algorithm else "sb3_contrib"
    else:
        what = f"a Stable-Baselines3 {found}"
        where = f"stable_baselines3.{found}.load" if found in ("DQN", "A2C") else "stable_baselines3"
    return serialization.ModelFileError(
        f"{name} holds {what} model; load it with {where}. covey loads SB3's PPO and SAC files and sb3-contrib's "
        "RecurrentPPO files."
    )


def _recurrent_hidden_size(name: str, policy: dict, policy_kwargs: dict) -> int:
    """The LSTMs' size of an sb3-contrib RecurrentPPO file, read off its weights (its ``policy_kwargs`` hold only
    what the user gave, and sb3-contrib's default size is 256, covey's 128); a file of settings covey's recurrent
    PPO does not have (two layers or more, no memory of the critic's own, LSTM arguments) is refused, naming them."""
    why = None
    if any(key.startswith(("lstm_actor.", "lstm_critic.")) and not key.endswith("_l0") for key in policy):
        why = "n_lstm_layers > 1: covey's memory has one layer"
    elif "lstm_actor.weight_hh_l0" not in policy:
        why = "no LSTM weights (lstm_actor.weight_hh_l0)"
    elif "lstm_critic.weight_hh_l0" not in policy:
        setting = "enable_critic_lstm=False" if "critic.weight" in policy else "shared_lstm=True"
        why = f"{setting}: covey's recurrent critic has a memory of its own"
    elif policy_kwargs.get("lstm_kwargs") not in (None, {}):
        why = f"lstm_kwargs={policy_kwargs['lstm_kwargs']!r}: covey's LSTM takes no other arguments"
    if why is not None:
        raise serialization.ModelFileError(
            f"{name} holds an sb3-contrib RecurrentPPO model with {why}. Load it with sb3_contrib.RecurrentPPO.load."
        )
    return int(policy["lstm_actor.weight_hh_l0"].shape[1])


def _load_tensors(zf: zipfile.ZipFile, entry: str, name: str) -> dict:
    kind = "Stable-Baselines3 model file"
    return serialization.load_tensors(serialization.read_tensor_entry(zf, entry, name, kind), name, entry, kind)


def _policy_module(data: dict) -> str:
    """The module of the file's policy class, as SB3 writes it beside the class's pickle ("" where it is not)."""
    policy_class = data.get("policy_class")
    module = policy_class.get("__module__", "") if isinstance(policy_class, dict) else ""
    return module if isinstance(module, str) else ""


def _user_policy_module(data: dict, agent: str) -> str:
    """The module of a PPO or SAC file's policy class where it is a user's (not SB3's or sb3-contrib's), else ""."""
    module = _policy_module(data)
    own = module.split(".")[0] in ("stable_baselines3", "sb3_contrib")
    return module if agent in ("PPO", "SAC") and module and not own else ""


def _algorithm(data: dict) -> str:
    module = _policy_module(data)
    for prefix, algorithm in _ALGORITHMS.items():
        if module.startswith(prefix):
            if algorithm == "sb3-contrib":
                parts = module.split(".")[1:]
                found = _CONTRIB.get(".".join(parts[:2])) or _CONTRIB.get(parts[0] if parts else "")
                return f"sb3-contrib {found}" if found else algorithm
            return algorithm
    if "n_epochs" in data and "clip_range" in data:
        return "PPO"
    if "buffer_size" in data and "target_entropy" in data:  # a user's policy class: SAC's own settings say it
        return "SAC"
    if "cg_max_steps" in data or "cg_damping" in data:  # sb3-contrib's TRPO takes SB3's own policy classes
        return "sb3-contrib TRPO"
    return "A2C" if "n_steps" in data and "rollout_buffer_class" in data else f"unknown ({module or 'no policy class'})"


def _policy_name(observation_kind: str | None, policy: dict) -> str:
    if observation_kind == "Dict":
        return "MultiInputPolicy"
    return "CnnPolicy" if any("features_extractor.cnn." in key for key in policy) else "MlpPolicy"


def _readable(entry: Any) -> Any:
    """A value of ``data``: itself when JSON held it, else the attributes SB3 wrote beside its pickle."""
    if isinstance(entry, dict) and ":serialized:" in entry:
        return {key: value for key, value in entry.items() if not key.startswith(":")}
    return entry


def _policy_kwargs(entry: Any) -> dict:
    """``policy_kwargs`` in covey's JSON form: classes (which SB3 pickled, writing their names beside) as
    ``{"class": "torch.nn.ReLU"}``; covey's load imports only the classes it knows."""
    out = {}
    for key, value in (_readable(entry) or {}).items():
        match = re.fullmatch(r"<class '([\w.]+)'>", value) if isinstance(value, str) else None
        out[key] = {"class": _class_name(match.group(1))} if match else value
    out.pop("use_sde", None)  # SB3's off-policy agents write their own use_sde here
    return out


def _class_name(path: str) -> str:
    """``torch.nn.modules.activation.ReLU`` -> ``torch.nn.ReLU``, ``torch.optim.adam.Adam`` -> ``torch.optim.Adam``
    (the names covey's files use); other classes keep their full path."""
    for package in ("torch.nn.", "torch.optim."):
        if path.startswith(package):
            return package + path.rsplit(".", 1)[1]
    return path


def _hyperparameters(data: dict, agent: str, config_class: type) -> tuple[dict, list[str]]:
    """covey's constructor settings (the fields of ``config_class``) from ``data``, and the names of those only
    a pickle holds."""
    hyper, unread = {}, []
    for field in dataclasses.fields(config_class):
        key = _SETTING_NAMES.get(field.name, field.name)
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, dict) and ":serialized:" in value:
            value = _pickled_setting(field.name, value)
            if value is None:
                unread.append(field.name)
                continue
        hyper[field.name] = value
    if agent == "SAC":
        buffer = _class_of(data.get("replay_buffer_class"))
        kwargs = data.get("replay_buffer_kwargs") or {}
        readable = isinstance(kwargs, dict) and ":serialized:" not in kwargs  # SB3 pickles a dict with an object
        if buffer == "HerReplayBuffer":  # hindsight replay, with the file's settings: covey's takes SB3's
            hyper["replay_buffer_class"] = "HerReplayBuffer"
            settings = _her_settings(kwargs) if isinstance(kwargs, dict) else None
            if settings is not None:
                hyper["replay_buffer_kwargs"] = settings
            else:
                unread.append("replay_buffer_kwargs")
        elif buffer not in _OWN_BUFFERS:
            unread.append("replay_buffer_class")
        elif readable and "handle_timeout_termination" in kwargs:
            hyper["replay_buffer_kwargs"] = {"handle_timeout_termination": kwargs["handle_timeout_termination"]}
    return hyper, unread


_HER_SETTINGS = {*HER_KWARGS, "handle_timeout_termination"}
"""SB3's HerReplayBuffer arguments that covey's takes (its others, such as device, are the model's)."""


def _her_settings(kwargs: dict) -> dict | None:
    """covey's HER settings from SB3's ``replay_buffer_kwargs``: plain JSON, or (a GoalSelectionStrategy in them
    made SB3 pickle the dict) the entries SB3 writes beside the pickle, the strategy as its text
    (``"GoalSelectionStrategy.FINAL"``). None where an entry cannot be read so."""
    kinds = {"n_sampled_goal": int, "copy_info_dict": bool, "handle_timeout_termination": bool}
    settings = {}
    for key, value in kwargs.items():
        if key not in _HER_SETTINGS:
            continue
        if key == "goal_selection_strategy":
            if not isinstance(value, str):
                return None
            value = value.rsplit(".", 1)[-1].lower()  # "GoalSelectionStrategy.FINAL" -> "final"
            if value not in STRATEGIES:
                return None
        elif type(value) is not kinds[key]:
            return None
        settings[key] = value
    return settings


_OWN_BUFFERS = {None, "ReplayBuffer", "DictReplayBuffer", "NStepReplayBuffer"}
"""SB3's replay buffers that covey's SAC picks by itself (from the observation space and ``n_steps``)."""


def _class_of(entry: Any) -> str | None:
    """The name of a class SB3 pickled, from the name of its ``__init__`` written beside (None for None)."""
    if entry is None:
        return None
    match = re.match(r"<function (\w+)\.__init__", str(_readable(entry).get("__init__", "")))
    return match.group(1) if match else "unknown"


def _pickled_setting(name: str, entry: dict) -> Any:
    """A setting SB3 pickled, from the attributes written beside it, or None where they do not tell it: a
    constant schedule (``FloatSchedule`` of ``ConstantSchedule(val=0.2)``) is its value, a linear one SB3's
    ``LinearSchedule`` (RL-Zoo's ``SimpleLinearSchedule``, of its ``lin_`` hyperparameters, SB3's
    ``LinearSchedule`` to 0); a function is code, and not read. SAC's ``train_freq`` (a ``TrainFreq``, which has no
    attributes to write) is read from the pickle's opcodes, without running them (:func:`_train_freq`)."""
    if name == "train_freq":
        return _train_freq(entry[":serialized:"])
    kind = str(entry.get(":type:", ""))
    if re.fullmatch(r"<class 'numpy\.(float|int|uint)\d+'>", kind):  # a NumPy number (SB3 1.x: target_entropy)
        return _numpy_number(entry[":serialized:"])
    if name in ("learning_rate", "clip_range", "clip_range_vf") and kind == "<class 'function'>":
        return _sb3_schedule_function(entry[":serialized:"])
    if name in ("learning_rate", "clip_range", "clip_range_vf"):
        # a FloatSchedule writes its inner schedule's repr; a schedule object given directly, its own attributes
        text = str(entry.get("value_schedule", ""))
        kind = re.search(r"\.(\w+)'>$", entry.get(":type:", ""))
        zoo = entry.get(":type:") == "<class 'rl_zoo3.utils.SimpleLinearSchedule'>"
        if kind and (kind.group(1) in ("ConstantSchedule", "LinearSchedule") or zoo):
            attributes = ", ".join(f"{key}={value}" for key, value in entry.items() if not key.startswith(":"))
            text = f"{kind.group(1)}({attributes})"
        constant = re.fullmatch(r"ConstantSchedule\(val=([-+\w.]+)\)", text)
        if constant:
            return float(constant.group(1))
        linear = re.fullmatch(r"LinearSchedule\(start=([-+\w.]+), end=([-+\w.]+), end_fraction=([-+\w.]+)\)", text)
        zoo_linear = re.fullmatch(r"SimpleLinearSchedule\(initial_value=([-+\w.]+)\)", text)
        if linear or zoo_linear:
            from stable_baselines3.common.utils import LinearSchedule

            start, end, end_fraction = linear.groups() if linear else (zoo_linear.group(1), 0.0, 1.0)
            return LinearSchedule(float(start), float(end), float(end_fraction))
    return None


_NOISE_TYPE = re.compile(r"<class 'stable_baselines3\.common\.noise\.(\w+)'>")
_NOISE_REPR = re.compile(r"(NormalActionNoise|OrnsteinUhlenbeckActionNoise)\(mu=(.*), sigma=(.*)\)", flags=re.DOTALL)


def _action_noise(entry: Any) -> dict | None | bool:
    """SAC's ``action_noise`` in covey's JSON form (:func:`covey.noise.noise_to_json`), from the attributes SB3
    wrote beside its pickle: None for no noise, False where they do not tell it (a user's own noise class, an
    array NumPy printed summarized, a VectorizedActionNoise of Ornstein-Uhlenbeck noise, whose repr, the one
    thing SB3 writes of its base noise, leaves out theta and dt)."""
    if entry is None:
        return None
    kind = _NOISE_TYPE.fullmatch(str(entry.get(":type:", ""))) if isinstance(entry, dict) else None
    if kind is None:
        return False
    try:
        if kind.group(1) == "VectorizedActionNoise":
            base = _NOISE_REPR.fullmatch(str(entry.get("_base_noise", entry.get("base_noise", ""))))
            n_envs = entry.get("n_envs")
            if base is None or base.group(1) != "NormalActionNoise" or not isinstance(n_envs, int):
                return False
            mean, sigma = (_numbers(text) for text in base.group(2, 3))
            normal = {"class": "NormalActionNoise", "mean": mean, "sigma": sigma, "dtype": "float32"}
            return {"class": "VectorizedActionNoise", "base_noise": normal, "n_envs": n_envs}
        dtype = re.fullmatch(r"<class 'numpy\.(\w+)'>", str(entry.get("_dtype", "<class 'numpy.float32'>")))
        noise = {
            "class": kind.group(1),
            "mean": _number_entry(entry["_mu"]),
            "sigma": _number_entry(entry["_sigma"]),
            "dtype": str(np.dtype(dtype.group(1))) if dtype else "float32",
        }
        if kind.group(1) == "OrnsteinUhlenbeckActionNoise":
            initial = entry.get("initial_noise")
            noise.update(
                theta=float(entry["_theta"]),
                dt=float(entry["_dt"]),
                initial_noise=None if initial is None else _number_entry(initial),
            )
        elif kind.group(1) != "NormalActionNoise":
            return False
    except (AttributeError, KeyError, TypeError, ValueError, json.JSONDecodeError):
        return False
    return noise


def _number_entry(value: Any) -> Any:
    """A number or an array SB3 wrote beside a pickle: as JSON held it (a float, a list, where the object held
    one), or as NumPy printed it (``[0.1 0.2]``, to its printed precision)."""
    if isinstance(value, (int, float, list)) and not isinstance(value, bool):
        return value
    return _numbers(value)


def _opcodes(serialized: str) -> list | None:
    """A pickle's opcodes as ``(name, argument)`` pairs, listed by :func:`pickletools.genops` (nothing is called or
    built); None for what is not a pickle."""
    try:
        return [(op.name, arg) for op, arg, _ in pickletools.genops(base64.b64decode(serialized))]
    except (ValueError, TypeError, binascii.Error):
        return None


def _numpy_number(serialized: str) -> float | int | None:
    """A pickled NumPy scalar (``numpy.float32(-1.0)``): its dtype's code and its bytes, read from the opcodes."""
    ops = _opcodes(serialized)
    if ops is None:
        return None
    strings = [arg for _, arg in ops if isinstance(arg, str)]
    data = [arg for _, arg in ops if isinstance(arg, bytes)]
    modules = {"numpy.core.multiarray", "numpy._core.multiarray", "numpy"}
    codes = [text for text in strings if re.fullmatch(r"f[248]|[iu][1248]", text)]
    order = [text for text in strings if text in ("<", ">", "|", "=")]
    if set(strings) - modules - {"scalar", "dtype", *codes, *order} or len(codes) != 1 or len(data) != 1:
        return None
    dtype = np.dtype(codes[0]).newbyteorder(order[0] if order and order[0] in "<>" else "=")
    if len(data[0]) != dtype.itemsize:
        return None
    return np.frombuffer(data[0], dtype=dtype)[0].item()


_SB3_SCHEDULES = {"constant_fn.<locals>.func", "get_linear_fn.<locals>.func", "get_schedule_fn.<locals>.<lambda>"}
"""The functions SB3 before 2.5 made its schedules of (``get_schedule_fn`` wrapped a number in ``constant_fn``;
2.4 wrapped that in a lambda); it pickled them by value into its files."""


def _sb3_schedule_function(serialized: str) -> float | Any | None:
    """A schedule an SB3 before 2.5 saved as one of its own functions (:data:`_SB3_SCHEDULES`, in its
    ``common/utils.py`` and nowhere else): ``constant_fn(val)`` is its number, ``get_linear_fn(start, end,
    end_fraction)`` SB3's ``LinearSchedule`` of the same numbers, read from the closure's values in the opcodes
    (nothing runs). A closure pickles its values in the order of the names of its free variables, which CPython
    sorts: ``end, end_fraction, start``. None for any other function."""
    ops = _opcodes(serialized)
    if ops is None:
        return None
    strings = {arg for _, arg in ops if isinstance(arg, str)}
    floats = [arg for name, arg in ops if name in ("BINFLOAT", "FLOAT")]
    functions = {text for text in strings if ".<locals>." in text}
    files = {text for text in strings if text.endswith(".py")}
    own = all(re.search(r"stable_baselines3[/\\]common[/\\]utils\.py$", text) for text in files)
    if not functions or functions - _SB3_SCHEDULES or not own or "__main__" in strings:
        return None
    if "get_linear_fn.<locals>.func" in functions:
        if len(floats) != 3 or "constant_fn.<locals>.func" in functions:
            return None
        from stable_baselines3.common.utils import LinearSchedule

        end, end_fraction, start = floats
        return LinearSchedule(start, end, end_fraction)
    return floats[0] if len(floats) == 1 and "constant_fn.<locals>.func" in functions else None


_INT_OPCODES = {"INT", "LONG", "BININT", "BININT1", "BININT2", "LONG1", "LONG4"}


def _train_freq(serialized: str) -> list | None:
    """SAC's ``TrainFreq(frequency, unit)`` as ``[frequency, "step" | "episode"]``, read from its pickle by listing
    the opcodes (:func:`_opcodes`). None unless the pickle is SB3's ``TrainFreq`` of one integer and a
    ``TrainFrequencyUnit``, and nothing else."""
    ops = _opcodes(serialized)
    if ops is None:
        return None
    strings = {arg for _, arg in ops if isinstance(arg, str)}
    ints = [arg for name, arg in ops if name in _INT_OPCODES]
    units = strings & {"step", "episode"}
    names = {"stable_baselines3.common.type_aliases", "TrainFreq", "TrainFrequencyUnit"}
    if len(units) != 1 or strings != names | units or len(ints) != 1:
        return None
    return [int(ints[0]), units.pop()]


def _plain(value: Any, kind: type, default: Any) -> Any:
    """``value`` where SB3 wrote it as plain JSON of ``kind`` (not a bool for an int), else ``default``."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else default
