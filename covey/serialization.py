"""covey's model file: one zip holding settings as JSON and tensors that load without running code.

Layout of ``model.zip``:
- ``covey.json``: format version, agent class name, hyperparameters, spaces, counters;
- ``tensors.pt``: nested dicts of tensors (state dicts of networks and optimizers), read with
  ``torch.load(weights_only=True)``, which refuses any pickled object that is not plain data.

Writes are atomic: the zip is written to a temporary file next to the target and renamed over it,
so a crash or a full disk during ``save`` leaves the previous file as it was.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import zipfile
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from covey.files import require_binary, write_atomically

FORMAT_VERSION = 1
SETTINGS_ENTRY = "covey.json"
TENSORS_ENTRY = "tensors.pt"


class ModelFileError(ValueError):
    """A file that is not a loadable covey model (corrupt, truncated, foreign or unsafe)."""


def model_path(path: str | os.PathLike) -> pathlib.Path:
    """SB3's rule: a path without a suffix gets ``.zip``."""
    path = pathlib.Path(path)
    return path.with_suffix(".zip") if path.suffix == "" else path


def save_model_file(path: str | os.PathLike | io.BufferedIOBase, settings: dict, tensors: dict) -> None:
    """Write settings and tensors to ``path`` atomically (or to an open binary file object)."""
    settings = {"format_version": FORMAT_VERSION, **settings}
    payload = io.BytesIO()
    torch.save(tensors, payload)
    if not isinstance(path, (str, os.PathLike)):
        require_binary(path, "save to")
        _write_zip(path, settings, payload.getvalue())
        return
    write_atomically(model_path(path), lambda f: _write_zip(f, settings, payload.getvalue()))


def plain_numbers(value: Any) -> Any:
    """``value`` with the NumPy scalars in it, inside lists, tuples and dicts too, as the Python numbers and bools
    they hold (``[np.int64(64)]`` -> ``[64]``), which JSON can hold; anything else as it is."""
    if isinstance(value, np.generic):
        return value.item()
    if type(value) in (list, tuple):
        return type(value)(plain_numbers(v) for v in value)
    if type(value) is dict:
        return {k: plain_numbers(v) for k, v in value.items()}
    return value


def _write_zip(f, settings: dict, tensor_bytes: bytes) -> None:
    """The settings compressed; the tensors stored as they are, as SB3 stores its files' (float weights hardly
    compress: deflating them took most of a SAC model's save, and of its copy, for a quarter off the size)."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(SETTINGS_ENTRY, json.dumps(plain_numbers(settings), indent=1, sort_keys=True))
        zf.writestr(TENSORS_ENTRY, tensor_bytes, compress_type=zipfile.ZIP_STORED)


def read_settings(path: str | os.PathLike | io.BufferedIOBase) -> dict:
    """Only the settings (``covey.json``) of a model file, e.g. to see which agent saved it."""
    settings = _read_entries(path)[1]
    if hasattr(path, "seek"):
        path.seek(0)
    return settings


def resolve_model_path(path: str | os.PathLike | io.BufferedIOBase) -> tuple[str, Any]:
    """``(name for messages, what zipfile opens)``: a path as given, or with ``.zip`` added when only that
    exists (SB3's rule), or a binary file object."""
    if not isinstance(path, (str, os.PathLike)):
        require_binary(path, "load from")
        return "the given file object", path
    source = pathlib.Path(path)
    if not source.exists() and model_path(source).exists():
        source = model_path(source)
    if not source.exists():
        raise FileNotFoundError(f"No model file at {str(path)!r} (nor with a .zip suffix).")
    if source.is_dir():
        raise IsADirectoryError(f"{source} is a folder, not a model file: name the .zip file in it.")
    return str(source), source


def zip_entry_names(path: str | os.PathLike | io.BufferedIOBase) -> set[str]:
    """The entry names of a zip file (empty when it is not a readable zip); a file object is rewound after."""
    _, source = resolve_model_path(path)
    try:
        with zipfile.ZipFile(source) as zf:
            return set(zf.namelist())
    except (zipfile.BadZipFile, EOFError, OSError):
        return set()
    finally:
        if hasattr(source, "seek"):
            source.seek(0)


def _read_entries(path: str | os.PathLike | io.BufferedIOBase) -> tuple[str, dict, bytes]:
    """``(name, settings, tensor bytes)`` of a model file, after checking its structure and version."""
    name, source = resolve_model_path(path)
    try:
        with zipfile.ZipFile(source) as zf:
            names = set(zf.namelist())
            if any(entry.endswith("/data.pkl") for entry in names):
                raise ModelFileError(
                    f"{name} is a PyTorch archive (what torch.save and SB3's policy.save write; the entries of a "
                    "truncated SB3 model file read as one too), not a model file. covey loads SB3's model files "
                    "(model.save) with PPO.load or SAC.load, and its own policy files (model.policy.save) with "
                    "its policy classes' load; an SB3 policy file does not load: load the SB3 model, and take its "
                    ".policy."
                )
            if SETTINGS_ENTRY not in names or TENSORS_ENTRY not in names:
                raise ModelFileError(
                    f"{name} is a zip file but not a covey model (it lacks {SETTINGS_ENTRY} or {TENSORS_ENTRY}). "
                    "A Stable-Baselines3 PPO or SAC file loads with covey's PPO.load or SAC.load, which read it "
                    "without unpickling."
                )
            settings = json.loads(zf.read(SETTINGS_ENTRY))
            _check_version(name, settings)
            tensor_bytes = read_tensor_entry(zf, TENSORS_ENTRY, name, "covey model file")
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
        raise ModelFileError(f"{name} is not a readable covey model file (corrupt or truncated zip: {err}).") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFileError(f"{name} has corrupt settings ({SETTINGS_ENTRY}: {err}).") from err
    except (OSError, RuntimeError) as err:  # CRC errors, bad compressed data
        raise ModelFileError(f"{name} is corrupt ({err}).") from err
    return name, settings, tensor_bytes


def _check_version(name: str, settings: Any) -> None:
    version = settings.get("format_version") if isinstance(settings, dict) else None
    if isinstance(version, bool) or not isinstance(version, int):
        raise ModelFileError(
            f"{name}'s settings ({SETTINGS_ENTRY}) hold no format version (an int): the file is damaged, or was "
            "edited, or was not written by covey's save."
        )
    if version > FORMAT_VERSION:
        raise ModelFileError(
            f"{name} has model format version {version!r}; this covey reads versions up to {FORMAT_VERSION}. "
            "Upgrade covey to load it."
        )


def load_model_file(
    path: str | os.PathLike | io.BufferedIOBase, device: torch.device | str = "cpu"
) -> tuple[dict, dict]:
    """Read ``(settings, tensors)`` from a covey model file, with clear errors for bad files."""
    name, settings, tensor_bytes = _read_entries(path)
    check_settings(name, settings)
    return settings, load_tensors(tensor_bytes, name, TENSORS_ENTRY, "covey model file", device)


# The settings every covey model file holds, and the JSON types of those a load reads when present.
_REQUIRED_SETTINGS = {
    "agent": str,
    "policy": str,
    "hyperparameters": dict,
    "policy_kwargs": dict,
    "observation_space": dict,
    "action_space": dict,
}
_OPTIONAL_SETTINGS = {
    "n_envs": int,
    "num_timesteps": int,
    "total_timesteps": int,
    "n_updates": int,
    "episode_num": int,
    "seed": (int, type(None)),
    "verbose": int,
    "tensorboard_log": (str, type(None)),
    "unread": list,
    "ep_info_buffer": list,
    "ep_success_buffer": list,
    "current_progress_remaining": (int, float),
}


def check_settings(name: str, settings: dict) -> None:
    """A ModelFileError naming the first setting of a covey model file that is missing or of another JSON type
    than save writes (a hand-edited or damaged ``covey.json``), and the spaces that do not read as spaces: load
    failed with Python's KeyError or AttributeError on them, or took defaults for hyperparameters silently."""
    for key, kind in {**_REQUIRED_SETTINGS, **_OPTIONAL_SETTINGS}.items():
        if key not in settings:
            if key in _REQUIRED_SETTINGS:
                raise ModelFileError(
                    f"{name}'s settings ({SETTINGS_ENTRY}) lack {key!r}, which every covey model file holds: the "
                    "file is damaged, or was edited. Save the model again from a trusted copy."
                )
            continue
        value = settings[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            what = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise ModelFileError(
                f"{name}'s settings ({SETTINGS_ENTRY}) hold {key}={value!r}, where save writes {what} (in JSON): the "
                "file is damaged, or was edited."
            )
    for key in ("observation_space", "action_space"):
        try:
            space_from_json(settings[key])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            settings[key] = unreadable_space(
                f"{name}'s settings ({SETTINGS_ENTRY}) hold an {key} that is not a space ({type(err).__name__}: "
                f"{err}): the file is damaged, or was edited."
            )


UNREADABLE = "unreadable"
"""A space entry of a file's settings that could not be read: ``{"type": UNREADABLE, "reason": ...}``. ``load``
raises with the reason unless ``custom_objects`` gives the space (the weights need no space to load)."""


def unreadable_space(reason: str) -> dict:
    return {"type": UNREADABLE, "reason": reason}


_TORCH_ARCHIVE = b"PK\x03\x04"  # how every file torch.save writes begins (a zip archive, since torch 1.6)


def read_tensor_entry(zf: zipfile.ZipFile, entry: str, name: str, kind: str) -> bytes:
    """The bytes of the entry ``entry`` of the model file ``name`` (a ``kind``, open as ``zf``) that torch.save
    wrote, read whole only once its first bytes show a torch archive: an entry crafted to inflate to gigabytes (of
    zeros, or of anything else) is refused before it takes the memory."""
    with zf.open(entry) as f:
        head = f.read(len(_TORCH_ARCHIVE))
        if not head:
            raise ModelFileError(f"{name} is a corrupt {kind}: its {entry} cannot be read (empty).")
        if head != _TORCH_ARCHIVE:
            raise _not_plain_tensors(name, entry)
        return head + f.read()


def _not_plain_tensors(name: str, entry: str, detail: str = "") -> ModelFileError:
    return ModelFileError(
        f"Refusing to load {name}: its {entry} is not a plain tensor file. It is corrupt, or it names Python objects "
        f"that could run code when unpickled, which covey never does. Re-save the model from a trusted source.{detail}"
    )


def load_tensors(data: bytes, name: str, entry: str, kind: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The dict of tensors in entry ``entry`` of the file ``name`` (a ``kind``: covey's or SB3's model file),
    read with ``weights_only``, so that it never runs code; clear errors for a crafted or a corrupt entry."""
    try:
        tensors = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        # weights_only refuses every pickled object that is not tensors and plain data, so a crafted file
        # never runs code here; it is reported together with plain corruption, which looks the same to it.
        detail = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line or "operand" in line]
        raise _not_plain_tensors(name, entry, f" ({detail[0]})" if detail else "") from err
    except (RuntimeError, EOFError, ValueError) as err:
        problem = str(err).strip().splitlines()[0] if str(err).strip() else "empty"
        raise ModelFileError(f"{name} is a corrupt {kind}: its {entry} cannot be read ({problem}).") from err
    if not isinstance(tensors, dict):
        raise ModelFileError(f"{name}'s {entry} holds a {type(tensors).__name__}, not a dict of tensors.")
    return tensors


def space_to_json(space: spaces.Space) -> dict:
    """A JSON description of a Box, Discrete, MultiDiscrete, MultiBinary or Dict space."""
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_json(s) for k, s in space.spaces.items()}}
    raise ValueError(f"Cannot save space {space}: unsupported type.")


def space_from_json(data: dict) -> spaces.Space:
    kind = data.get("type")
    if kind == "Box":
        dtype = np.dtype(data["dtype"])
        return spaces.Box(np.array(data["low"], dtype=dtype), np.array(data["high"], dtype=dtype), dtype=dtype)
    if kind == "Discrete":
        return spaces.Discrete(data["n"], start=data.get("start", 0))
    if kind == "MultiDiscrete":
        return spaces.MultiDiscrete(data["nvec"], dtype=np.dtype(data["dtype"]), start=data.get("start"))
    if kind == "MultiBinary":
        return spaces.MultiBinary(data["n"])
    if kind == "Dict":
        return spaces.Dict({k: space_from_json(v) for k, v in data["spaces"].items()})
    raise ModelFileError(f"Unknown space type {kind!r} in model file.")
