"""The small base every covey agent shares: env handling, seeding, the callback and logging plumbing,
``predict``, and saving/loading. Algorithms subclass it once and implement ``_setup_model``,
``learn`` and the pieces of their state that go into a model file.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import io
import json
import math
import numbers
import operator
import os
import platform
import random
import time
import types
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from gymnasium import spaces
from gymnasium.utils import EzPickle
from stable_baselines3.common import torch_layers
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    ConvertCallback,
    ProgressBarCallback,
)
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.utils import ConstantSchedule as SB3ConstantSchedule
from stable_baselines3.common.utils import FloatSchedule, LinearSchedule, configure_logger, safe_mean
from stable_baselines3.common.vec_env import SubprocVecEnv, VecEnv, VecTransposeImage, unwrap_vec_normalize
from torch.nn.modules import module as _module_module
from torch.optim import optimizer as _optimizer_module

from covey import sb3_files, serialization
from covey.agents.sb3_policy import (
    action_start,
    build_policy,
    class_path,
    optimizer_owners,
    sb3_observation_problem,
    sb3_policy_class,
)
from covey.agents.sb3_policy import wrap_env as sb3_wrap_env
from covey.heap import raise_heap_thresholds
from covey.networks.actor_critic import (
    LSTM_POLICIES,
    ParameterMismatchError,
    policy_kwargs_dict,
    policy_name,
    positive_int,
)
from covey.networks.encoders import FlattenEncoder, NatureCNN, NormalizedEncoder
from covey.networks.sb3_names import move_optimizer_state, to_sb3
from covey.spaces import (
    channels_last,
    check_action_space,
    check_observation_space,
    is_image_space,
    same_space,
    space_mismatch_advice,
    warn_masking_env,
    warn_unmasked_actions,
)
from covey.version import __version__
from covey.warning import warn_user
from covey.wrappers.vec_env import VecImageLayout, as_vec_env, image_layout_moves

# Classes a model file may name in policy_kwargs; anything else needs ``custom_objects`` at load.
_ALLOWED_CLASSES: dict[str, type] = {
    **{
        f"torch.nn.{n}": getattr(torch.nn, n)
        for n in (
            "Tanh",
            "ReLU",
            "ELU",
            "LeakyReLU",
            "GELU",
            "SiLU",
            "Mish",
            "Sigmoid",
            "Softplus",
            "Identity",
            "SELU",
            "CELU",
        )
    },
    **{
        f"torch.optim.{n}": getattr(torch.optim, n)
        for n in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")
    },
    # SB3's own features extractors and its TF-like RMSprop, which scripts name in policy_kwargs
    **{
        f"stable_baselines3.common.torch_layers.{n}": getattr(torch_layers, n)
        for n in ("FlattenExtractor", "NatureCNN", "CombinedExtractor")
    },
    "stable_baselines3.common.sb2_compat.rmsprop_tf_like.RMSpropTFLike": RMSpropTFLike,
}


Schedule = float | Callable[[float], float]
"""A constant, or a function of the remaining progress (1 at the start of learn, 0 at the end)."""


def require(ok: bool, agent: str, name: str, value: Any, rule: str) -> None:
    """Raise a ValueError naming the hyperparameter, its value and the rule it breaks."""
    if not ok:
        raise ValueError(f"{agent}: {name}={value!r} is invalid: {rule}.")


def require_numbers(config: Any, agent: str) -> None:
    """A ValueError naming the first field of the dataclass ``config`` annotated ``int``, ``float`` or
    ``Schedule`` that holds no number (nor, for a schedule, a function), e.g. a string read from a file. A whole
    float in an ``int`` field (``buffer_size=1e6``, as YAML files write it) becomes the int; another is named.
    A NumPy scalar in any field (``np.random.choice([64, 128])``, ``np.float32(0.99)``, ``np.bool_``) becomes the
    Python number or bool it holds, which a model file's JSON can hold. A ``bool`` field takes True, False, 0 or 1
    (``use_sde="no"`` would have read as True)."""
    for f in dataclasses.fields(config):
        if isinstance(getattr(config, f.name), np.generic):
            setattr(config, f.name, getattr(config, f.name).item())
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind == "bool":
            value = getattr(config, f.name)
            if not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
                raise ValueError(f"{agent}: {f.name}={value!r} is invalid: it must be True or False.")
            setattr(config, f.name, bool(value))
            continue
        if kind not in ("int", "float", "Schedule"):
            continue
        value = getattr(config, f.name)
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        if not (number or (kind == "Schedule" and callable(value))):
            what = "a number or a schedule (a function of the progress remaining)" if kind == "Schedule" else "a number"
            raise ValueError(f"{agent}: {f.name}={value!r} is invalid: it must be {what}, not {type(value).__name__}.")
        if kind == "int" and isinstance(value, (float, np.floating)):
            if not whole_number(value):
                raise ValueError(f"{agent}: {f.name}={value!r} is invalid: it must be a whole number.")
            setattr(config, f.name, int(value))


_SAVED_ATTRIBUTES = frozenset(
    {
        "num_timesteps",
        "_total_timesteps",
        "_n_updates",
        "seed",
        "verbose",
        "tensorboard_log",
        "_episode_num",
        "ep_info_buffer",
        "ep_success_buffer",
        "_stats_window_size",
        "observation_space",
        "action_space",
        "n_envs",
        "policy_kwargs",
        "policy_class",
    }
)
"""SB3's names for what covey's model file holds beside the hyperparameters and parameter groups."""


def whole_number(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int, or a float without a fraction (not a bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    return bool(math.isfinite(value) and float(value).is_integer())


def as_device(device: torch.device | str | int) -> torch.device:
    """``torch.device(device)``, with a ValueError that names the argument and the values it takes. An int ``N`` is
    the N-th accelerator, as torch reads it (``"cuda:N"`` on CUDA machines)."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)):
        if device < 0:
            raise ValueError(f"device={device!r} is not a torch device: an accelerator's index is 0 or more.")
        accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
        return torch.device(accelerator.type if accelerator is not None else "cuda", int(device))
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device={device!r} is not a torch device: use 'auto' (CUDA where there is one), 'cpu', 'cuda' or 'cuda:N'."
        ) from err


def get_device(device: torch.device | str | int = "auto") -> torch.device:
    """``"auto"`` means CUDA when available, else CPU. A CUDA device on a machine without CUDA falls back to the
    CPU with a warning, as SB3 falls back (silently there)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = as_device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        warn_user(f"device={str(device)!r} was asked for, but CUDA is not available: using the CPU.")
        return torch.device("cpu")
    return device


class ConstantSchedule:
    """A schedule that stays at ``value`` (a class, not a closure, so that a model holding one pickles)."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def __call__(self, _progress_remaining: float) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"ConstantSchedule({self.value})"


def as_schedule(value: float | Callable[[float], float]) -> Callable[[float], float]:
    """A constant or a function of the remaining progress (1 at the start, 0 at the end) as a function."""
    if callable(value):
        return value
    return ConstantSchedule(value)


def scheduled(schedule: Callable[[float], float], progress: float, agent: str, name: str) -> float:
    """``schedule(progress)`` as a float, or a ValueError naming the setting where it is no finite number >= 0 (a
    negative step size would climb the loss, a negative clip range invert the clipping). A run's last rollout may
    overshoot its budget, taking the progress remaining below 0 (SB3's count, which the model keeps): the schedule
    is read at 0 there, its end, where SB3 reads SB3's documented ``progress_remaining * initial_value`` past its
    end, to a negative step size."""
    progress = min(max(progress, 0.0), 1.0)
    value = schedule(progress)
    try:  # as SB3's FloatSchedule reads it: what float() takes (a NumPy or torch scalar too), but text or a bool
        number = None if isinstance(value, (str, bytes, bool, np.bool_)) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not (math.isfinite(number) and number >= 0):
        raise ValueError(
            f"{agent}: the {name} schedule returned {value!r} at progress_remaining={progress:g}: it must return a "
            "finite number >= 0 at every progress from 1 (the start of learn) to 0 (its end)."
        )
    return number


def schedule_to_json(schedule: Callable[[float], float], progress: float) -> float | dict[str, Any]:
    """A schedule as a model file keeps it: a constant schedule (SB3's or covey's) as its number; SB3's
    ``LinearSchedule`` (inside SB3's ``FloatSchedule`` too) whole; any other function, which is code, as its
    value at ``progress`` and its first value (load stands them in: :func:`schedule_from_json`)."""
    inner = schedule.value_schedule if isinstance(schedule, FloatSchedule) else schedule
    if isinstance(inner, (ConstantSchedule, SB3ConstantSchedule)):
        return float(inner(1.0))
    entry = {"schedule_value": float(schedule(progress)), "schedule_initial": float(schedule(1.0))}
    if type(inner) is LinearSchedule:
        entry["linear"] = {"start": inner.start, "end": inner.end, "end_fraction": inner.end_fraction}
    elif _zoo_linear(inner):  # RL-Zoo's lin_ schedules: SB3's LinearSchedule to 0 over the whole run
        entry["linear"] = {"start": inner.initial_value, "end": 0.0, "end_fraction": 1.0}
    return entry


def _zoo_linear(schedule: Any) -> bool:
    """Whether ``schedule`` is RL-Zoo's ``SimpleLinearSchedule`` (``progress_remaining * initial_value``, what its
    hyperparameter files' ``lin_3e-4`` make), checked on its values, not only its name."""
    kind = type(schedule)
    if kind.__name__ != "SimpleLinearSchedule" or not kind.__module__.startswith("rl_zoo3"):
        return False
    initial = getattr(schedule, "initial_value", None)
    if not isinstance(initial, float) or not math.isfinite(initial):
        return False
    return all(schedule(p) == p * initial for p in (1.0, 0.75, 0.5, 0.25, 0.0))


def schedule_from_json(entry: dict[str, Any]) -> float | LinearSchedule:
    """A schedule kept by :func:`schedule_to_json`: SB3's ``LinearSchedule`` as it was, or the number kept of a
    function. A function that had fallen to 0 by the end of training would leave nothing to train with: its first
    value stands in then (as SB3 restarts a schedule from its start when training starts over)."""
    if "linear" in entry:
        return LinearSchedule(**{key: float(value) for key, value in entry["linear"].items()})
    current = entry["schedule_value"]
    return current if current > 0 else entry.get("schedule_initial", current)


def check_seed(seed: Any) -> int | None:
    """``seed`` as an int (NumPy's integers too), or None; anything else named, as NumPy's and torch's seeding
    would fail without naming it."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and 0 <= seed < 2**32:
        return int(seed)
    raise ValueError(f"seed={seed!r} is invalid: pass a whole number from 0 to 2**32 - 1, or None for a random one.")


def set_random_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_train_mode(module: torch.nn.Module, mode: bool) -> None:
    """``module.train(mode)``, skipped when the module is in that mode already (the call walks every submodule,
    tens of microseconds per rollout or update)."""
    if module.training != mode:
        module.train(mode)


def _has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether step hooks (the optimizer's own or global ones) are registered, or ``step`` itself was replaced on
    the optimizer (a script's wrapper of it; an LR scheduler's step counter): they run only in ``step()``. The
    ``step`` :meth:`FlatParameters.attach` puts there is not a replacement."""
    step = vars(optimizer).get("step")
    return bool(
        (step is not None and getattr(step, "__func__", None) is not _script_step)
        or getattr(optimizer, "_optimizer_step_pre_hooks", True)
        or getattr(optimizer, "_optimizer_step_post_hooks", True)
        or getattr(_optimizer_module, "_global_optimizer_pre_hooks", True)
        or getattr(_optimizer_module, "_global_optimizer_post_hooks", True)
    )


_MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def has_hooks(*modules: torch.nn.Module) -> bool:
    """Whether a forward or backward hook is registered on a submodule of ``modules`` (or on every module), or a
    gradient hook on one of their parameters (``p.register_hook``: a gradient clipped or masked, wandb's
    ``watch``): the hand-written passes, which call no module and write the gradients themselves, would skip it,
    so training takes the modules' own then, through autograd. So it does where autograd's anomaly detection is on
    (``torch.autograd.set_detect_anomaly(True)``), whose checks (the operation that gave a NaN, before the
    optimizer's step) the hand-written passes would skip."""
    global_hooks = (getattr(_module_module, "_global" + name, None) for name in _MODULE_HOOKS)
    if any(global_hooks) or torch.is_anomaly_enabled():
        return True
    if any(getattr(m, name, None) for module in modules for m in module.modules() for name in _MODULE_HOOKS):
        return True
    return any(getattr(p, name, None) for module in modules for p in module.parameters() for name in _TENSOR_HOOKS)


FLUSH_DENORMALS = True
"""Whether optimizer steps on the CPU flush denormal numbers to zero (:meth:`FlatParameters.step`)."""
_SMALLEST_DOUBLE = 5e-324  # denormal: read as zero while this thread flushes denormals
_ONE = 1.0


def flushing_denormals() -> bool:
    """Whether this thread flushes denormal numbers to zero now (``torch.set_flush_denormal(True)``, which sets
    the CPU's flags for the calling thread; Python's own float arithmetic follows them too)."""
    return _SMALLEST_DOUBLE * _ONE == 0.0


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _script_zero_grad(optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
    """``zero_grad`` of an optimizer over a flat buffer (:meth:`FlatParameters.attach`), for a script's own steps."""
    optimizer.flat_parameters.script_zero_grad(set_to_none)


def _script_step(optimizer: torch.optim.Optimizer, closure: Callable | None = None) -> Any:
    """``step`` of an optimizer over a flat buffer (:meth:`FlatParameters.attach`), for a script's own steps."""
    flat = optimizer.flat_parameters
    if flat.stepping:  # FlatParameters.step calling the optimizer's step (through any wrapper a script put there)
        return type(optimizer).step(optimizer, closure)
    return flat.script_step(optimizer, closure)


class FlatParameters:
    """Parameters laid out in one contiguous buffer, and their gradients in a second one.

    Every parameter stays the same object with the same shape (modules, state dicts and saved files do
    not change), but its data becomes a view into :attr:`data` and its ``.grad`` a view into :attr:`grad`.
    An optimizer over ``[data]`` then updates all of them as one tensor, and zeroing and clipping the
    gradients are one operation each. Gradients are zeroed, not set to None: a parameter that a loss does
    not reach gets a zero gradient (Adam still moves it by its momentum), where ``zero_grad(set_to_none=True)``
    would have left it out of the step. covey's losses reach every parameter of their optimizer, but for those a
    user froze (``requires_grad=False``): as an optimizer over the parameters leaves them out (their ``.grad`` is
    None), their gradients count in no clipping and a step changes neither them nor their optimizer state.

    >>> a, b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)
    >>> flat = FlatParameters([*a.parameters(), *b.parameters()])
    >>> flat.data.shape, a.weight.data_ptr() == flat.data.data_ptr()
    (torch.Size([13]), True)
    """

    def __init__(self, params: list[torch.Tensor], with_grad: bool = True) -> None:
        self.params = list({id(p): p for p in params}.values())
        self.with_grad = with_grad
        self._direct: tuple | None = None  # what step() needs to call a fused Adam kernel directly
        self._direct_ok = True
        self.stepping = False  # inside step(), which calls the optimizer's own step where it takes no direct one
        if not self.params:
            raise ValueError("FlatParameters needs a non-empty list of parameters.")
        first = self.params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in self.params):
            raise ValueError("FlatParameters needs parameters of one dtype on one device.")
        self._flush = first.device.type == "cpu"  # see step()
        self.offsets: dict[int, int] = {}
        if len(self.params) == 1 and first.is_contiguous():
            # One parameter is already one tensor: the optimizer keeps it (and its identity).
            self.offsets[id(first)] = 0
            self.data = first
            self.grad = torch.zeros_like(first) if with_grad else None
            self.relink()
            return
        total = sum(p.numel() for p in self.params)
        data = torch.empty(total, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(data) if with_grad else None
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                data[offset : offset + n].copy_(p.reshape(-1))
                p.data = data[offset : offset + n].view_as(p)
                self.offsets[id(p)] = offset
                offset += n
        self.data = data.requires_grad_(with_grad)
        self.relink()

    def view(self, p: torch.Tensor, of: torch.Tensor | None = None) -> torch.Tensor:
        """The slice of ``of`` (default: :attr:`grad`) that belongs to parameter ``p``, shaped like it."""
        offset = self.offsets[id(p)]
        return (self.grad if of is None else of).reshape(-1)[offset : offset + p.numel()].view_as(p)

    def relink(self) -> None:
        """Point every parameter's ``.grad`` at its slice of :attr:`grad` again (after a ``zero_grad`` that set
        them to None, say), and take back a parameter whose ``.data`` was replaced (SB3's
        ``policy.load_from_vector``, ``p.data = ...``, ``share_memory()``): its values are copied into its slice
        of :attr:`data` and it becomes a view of that slice again, so the optimizer, and every view made of the
        buffer (NumPy acting, the hand-written updates), see them."""
        if not hasattr(self, "_links"):
            self._links = [(p, p.data, self.view(p) if self.with_grad else None) for p in self.params]
        for p, slot, grad in self._links:
            if p.data_ptr() != slot.data_ptr():
                self._take_back(p, slot)
            if grad is not None and p.grad is not grad:
                p.grad = grad
        if self.with_grad:
            self.data.grad = self.grad

    def take_back_replaced(self) -> None:
        """The data half of :meth:`relink`, cheap enough to run between env steps (about 3 us for PPO's 12
        parameters): take back each parameter whose ``.data`` was replaced."""
        if not hasattr(self, "_links"):
            self.relink()
        for p, slot, _ in self._links:
            if p.data_ptr() != slot.data_ptr():
                self._take_back(p, slot)

    @staticmethod
    def _take_back(p: torch.Tensor, slot: torch.Tensor) -> None:
        if p.shape != slot.shape or p.dtype != slot.dtype or p.device != slot.device:
            raise RuntimeError(
                f"A parameter of shape {tuple(slot.shape)} ({slot.dtype}, {slot.device}) was replaced by one of "
                f"shape {tuple(p.shape)} ({p.dtype}, {p.device}), e.g. by .to(device) or .double() after the "
                "model was built. Build the model on the device it trains on (device=...), and change parameters' "
                "values in place (load_state_dict, set_parameters, policy.load_from_vector)."
            )
        with torch.no_grad():
            slot.copy_(p.data)
        p.data = slot

    def zero_grad(self) -> None:
        self.grad.zero_()

    def script_zero_grad(self, set_to_none: bool = True) -> None:
        """The attached optimizer's ``zero_grad``, as a script calls it around its own ``backward`` (SB3's
        ``train()``, behaviour cloning): the buffer is zeroed, and with ``set_to_none`` every ``.grad`` is None
        until a backward writes it, as over the parameters, so that :meth:`script_step` can leave out those no
        loss reached."""
        self.grad.zero_()
        if set_to_none:
            for p in self.params:
                p.grad = None
            # The buffer's gradient fills as the backward reaches each parameter, so that a script that clips or
            # reads the optimizer's own parameters (optimizer.param_groups[0]["params"], the buffer) between its
            # backward and its step finds the gradients there.
            self.data.grad = self.grad
            self._watch_backward()
        else:
            self.relink()

    def _watch_backward(self) -> None:
        """Until the next :meth:`script_step`: each parameter the backward reaches has its fresh ``.grad`` taken
        into its slice of :attr:`grad` (and becomes a view of it again); one it does not reach keeps None."""
        if getattr(self, "_hooks", None):
            return
        if not hasattr(self, "_links"):
            self.relink()

        def take_in(p: torch.Tensor, slot: torch.Tensor) -> None:
            if p.grad is not slot:
                slot.copy_(p.grad)
                p.grad = slot

        self._hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(take_in, slot=grad))
            for p, _, grad in self._links
            if grad is not None
        ]

    def _unwatch_backward(self) -> None:
        for hook in getattr(self, "_hooks", None) or []:
            hook.remove()
        self._hooks = []

    def gather_grads(self) -> list[slice]:
        """Take the gradients a backward wrote outside the buffer (after a ``zero_grad`` that set the parameters'
        ``.grad`` to None, the optimizer's or a module's) into their slices, relink every ``.grad`` to its slice,
        and return the slices of the parameters with no gradient (None), which are zeroed. Replaced ``.data`` is
        taken back too (:meth:`relink`)."""
        if not hasattr(self, "_links"):
            self.relink()
        absent = []
        for p, slot, grad in self._links:
            if p.data_ptr() != slot.data_ptr():
                self._take_back(p, slot)
            found = p.grad
            if found is grad or found is self.grad:
                continue
            if found is None:
                grad.zero_()
                offset = self.offsets[id(p)]
                absent.append(slice(offset, offset + p.numel()))
            else:
                grad.copy_(found)
            p.grad = grad
        self.data.grad = self.grad
        return absent

    def script_step(self, optimizer: torch.optim.Optimizer, closure: Callable | None = None) -> Any:
        """The attached optimizer's ``step``, as a script calls it: the gradients a backward wrote outside the
        buffer are taken in first (:meth:`gather_grads`), and the parameters without a gradient keep their values
        and optimizer state, as an optimizer over the parameters skips them. Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._unwatch_backward()
        self.step(optimizer, skip=self.gather_grads())
        return loss

    def frozen(self) -> list[slice]:
        """The slices of :attr:`data` (and :attr:`grad`) of the parameters a user froze (``requires_grad=False``)."""
        if all(map(_REQUIRES_GRAD, self.params)):  # the common case: about 1 us for PPO's 12 parameters
            return []
        return [slice(self.offsets[id(p)], self.offsets[id(p)] + p.numel()) for p in self.params if not p.requires_grad]

    def step(self, optimizer: torch.optim.Optimizer, skip: list[slice] | tuple = ()) -> None:
        """``optimizer.step()`` for the optimizer over :attr:`data`. A fused Adam/AdamW calls its kernel
        directly once its state exists: the same update, without ~15 us of Python around one kernel.

        On the CPU the step flushes denormal numbers to zero (a thread that does not flush them already does so
        for the step only). A weight whose gradient stays 0 (into or out of a ReLU unit that no
        sample activates) has its Adam momentum shrink by ``beta1`` per step into the denormal range (below
        ~1.2e-38) and on to 0, and some CPUs take a slow path for every denormal: after 1,400 SAC steps on
        Pendulum a fifth of the critics' momenta were denormal, and their Adam step took 5x its time on an
        Intel Xeon. Flushed, those momenta become 0 some 150 steps before Adam would have taken them there; the
        update they make, at most ~1e-30 times the learning rate, rounds away either way.

        Frozen parameters (:meth:`frozen`) keep their values and their slices of the optimizer's state (a state
        the step makes first starts at 0 there), as an optimizer over the parameters would skip them; its step
        count is one for the whole buffer. So do the slices in ``skip``."""
        frozen = self.frozen() + list(skip)
        kept = self._keep(frozen, optimizer) if frozen else None
        if not (self._flush and FLUSH_DENORMALS) or flushing_denormals():
            self._step(optimizer)
        else:
            torch.set_flush_denormal(True)
            try:
                self._step(optimizer)
            finally:
                torch.set_flush_denormal(False)
        if kept is not None:
            self._restore(frozen, optimizer, kept)

    def _buffers_of(self, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """:attr:`data` (under "") and the optimizer's state tensors that hold one number per element of it, flat."""
        state = optimizer.state.get(self.data, {})
        numel = self.data.numel()
        buffers = {"": self.data.detach().reshape(-1)}
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.numel() == numel:
                buffers[key] = value.reshape(-1)
        return buffers

    def _keep(self, frozen: list[slice], optimizer: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:
        return {key: [t[part].clone() for part in frozen] for key, t in self._buffers_of(optimizer).items()}

    def _restore(self, frozen: list[slice], optimizer: torch.optim.Optimizer, kept: dict) -> None:
        with torch.no_grad():
            for key, t in self._buffers_of(optimizer).items():
                # a buffer the step made (Adam's moments at its first step) starts at 0 for the frozen slices
                for part, values in zip(frozen, kept.get(key, [None] * len(frozen))):
                    t[part] = 0.0 if values is None else values

    def _step(self, optimizer: torch.optim.Optimizer) -> None:
        direct = self._direct
        if (
            direct is None
            or direct[0] is not optimizer
            or optimizer.state.get(self.data) is not direct[2]  # a load_state_dict replaces the state
            or optimizer.param_groups[0] is not direct[3]
            or torch.is_tensor(direct[3]["lr"])
            or _has_step_hooks(optimizer)
        ):
            direct = self._direct = self._fused_adam(optimizer)
            if direct is None:
                self._optimizer_step(optimizer)
                return
        _, kernel, state, group = direct
        state["step"].add_(1)
        try:
            kernel(
                [self.data.detach()],
                [self.grad],
                [state["exp_avg"]],
                [state["exp_avg_sq"]],
                [],
                [state["step"]],
                amsgrad=False,
                lr=group["lr"],
                beta1=group["betas"][0],
                beta2=group["betas"][1],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
            )
        except TypeError:
            # A torch whose private kernel takes other arguments: step through the optimizer from now on.
            state["step"].sub_(1)
            self._direct_ok = False
            self._direct = None
            self._optimizer_step(optimizer)

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``: through whatever a script put there (a wrapper, an LR scheduler's counter), down
        to the optimizer's own step."""
        self.stepping = True
        try:
            optimizer.step()
        finally:
            self.stepping = False

    def _fused_adam(self, optimizer: torch.optim.Optimizer):
        """(optimizer, kernel, state, group) when ``optimizer`` is a plain fused Adam/AdamW over :attr:`data`
        whose state exists; else None."""
        if not self._direct_ok or type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
            return None
        if len(optimizer.param_groups) != 1:
            return None
        group = optimizer.param_groups[0]
        state = optimizer.state.get(self.data)
        plain = (
            group.get("fused")
            and not group["amsgrad"]
            and not group.get("capturable")
            and not group.get("differentiable")
            and not torch.is_tensor(group["lr"])
            and not _has_step_hooks(optimizer)
        )
        if not plain or not state or len(group["params"]) != 1 or group["params"][0] is not self.data:
            return None
        decoupled = group.get("decoupled_weight_decay", type(optimizer) is torch.optim.AdamW)
        kernel = getattr(torch, "_fused_adamw_" if decoupled else "_fused_adam_", None)
        return None if kernel is None else (optimizer, kernel, state, group)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that their global 2-norm is at most ``max_norm`` (as
        ``torch.nn.utils.clip_grad_norm_``); returns the norm before clipping. Frozen parameters' gradients are
        zeroed first: they count in no norm (a hand-written backward writes them; autograd leaves them 0)."""
        for part in self.frozen():
            self.grad[part] = 0.0
        norm = torch.linalg.vector_norm(self.grad)
        if self.grad.device.type == "cpu":
            # Reading the norm waits for no device here, and it spares the multiply when nothing is clipped.
            scale = max_norm / (norm.item() + 1e-6)
            if scale < 1.0:
                self.grad.mul_(scale)
            return norm
        self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    # -- the optimizer's state dict, per parameter as an optimizer over ``params`` writes it
    def attach(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make ``optimizer`` (built over ``[self.data]``) save and load its state per parameter, in the
        layout an optimizer over ``self.params`` has: model files stay the same."""
        optimizer.register_state_dict_post_hook(lambda _opt, state: self._split_state(state))
        optimizer.register_load_state_dict_pre_hook(lambda _opt, state: self._join_state(state))
        optimizer.flat_parameters = self
        # A script's zero_grad / backward / step (SB3's train(), a behaviour-cloning loop) steps the buffer with
        # the gradients it wrote: torch's zero_grad would set the buffer's .grad to None, and a step then skips it.
        optimizer.zero_grad = types.MethodType(_script_zero_grad, optimizer)
        optimizer.step = types.MethodType(_script_step, optimizer)
        return optimizer

    def _split_state(self, state_dict: dict) -> dict:
        group, *added = state_dict["param_groups"]
        flat_state = state_dict["state"].get(group["params"][0])
        state = {}
        if flat_state is not None:
            for i, p in enumerate(self.params):
                state[i] = {
                    key: self._slice_state(key, value, p) if torch.is_tensor(value) else value
                    for key, value in flat_state.items()
                }
        groups = [{**group, "params": list(range(len(self.params)))}]
        return {
            "state": state,
            "param_groups": groups + _renumbered(added, state_dict["state"], state, len(self.params)),
        }

    def _slice_state(self, key: str, value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        if key != "step" and value.shape == self.data.shape:
            return self.view(p, value).clone()
        return value.clone()

    def _join_state(self, state_dict: dict) -> dict:
        groups = state_dict["param_groups"]
        if not groups or len(groups[0]["params"]) != len(self.params):
            raise ValueError(
                f"The optimizer state holds {[len(g['params']) for g in groups]} parameters per group; this "
                f"optimizer's first group has {len(self.params)}. Load a state saved by the same model."
            )
        index = groups[0]["params"]
        saved = state_dict["state"]
        present = [(p, saved[i]) for p, i in zip(self.params, index) if i in saved]
        state = {}
        if present:
            joined = {}
            for key, value in present[0][1].items():
                if key != "step" and torch.is_tensor(value) and value.shape == present[0][0].shape:
                    flat = torch.zeros_like(self.data, dtype=value.dtype, device=value.device)
                    for p, entry in present:
                        self.view(p, flat).copy_(entry[key])
                    joined[key] = flat
                else:
                    joined[key] = value.clone() if torch.is_tensor(value) else value  # never alias the source
            state[0] = joined
        return {
            "state": state,
            "param_groups": [{**groups[0], "params": [0]}, *_renumbered(groups[1:], saved, state, 1)],
        }


def _renumbered(groups: list[dict], saved: dict, state: dict, first: int) -> list[dict]:
    """Parameter groups added to an optimizer over a flat buffer (``optimizer.add_param_group``, a subclass's extra
    network) with their parameters numbered from ``first`` on, each one's state in ``saved`` copied into ``state``
    under its new number: as an optimizer's state dict numbers its parameters, group after group."""
    out = []
    for group in groups:
        numbers = list(range(first, first + len(group["params"])))
        for old, new in zip(group["params"], numbers):
            if old in saved:
                state[new] = saved[old]
        out.append({**group, "params": numbers})
        first += len(numbers)
    return out


def _optimizer_parameter_names(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """Every parameter ``optimizer`` steps, in its order (covey's flat optimizers: their parameters' order), by
    its names in ``module.state_dict()`` (a shared parameter has several)."""
    names: dict[int, list[str]] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        names.setdefault(id(tensor), []).append(key)
    flat = getattr(optimizer, "flat_parameters", None)
    if flat is None and len(optimizer.param_groups) != 1:
        raise ValueError(f"the optimizer has {len(optimizer.param_groups)} parameter groups, not one")
    params = flat.params if flat is not None else optimizer.param_groups[0]["params"]
    order = [names.get(id(p)) for p in params]
    if any(found is None for found in order):
        raise ValueError("the optimizer steps a parameter outside the policy")
    return order


class _PolicyAttribute:
    """``model.policy``, kept in the model's ``__dict__`` as a plain attribute is. Set to a ``torch.compile`` of
    the policy (SB3's docs do that to speed up training), it keeps the policy itself, with a warning: covey acts and
    trains through its own passes over the policy's layers, which would never call the compiled module, and a
    compiled module's weights are saved under other names (``_orig_mod.``), which ``load`` would refuse."""

    def __get__(self, model: Any, owner: type | None = None) -> Any:
        if model is None:
            return self
        try:
            return model.__dict__["policy"]
        except KeyError:
            raise AttributeError(f"{type(model).__name__!r} object has no attribute 'policy'") from None

    def __set__(self, model: Any, policy: Any) -> None:
        compiled = getattr(policy, "_orig_mod", None) if type(policy).__name__ == "OptimizedModule" else None
        if isinstance(compiled, torch.nn.Module):
            warn_user(
                "model.policy = torch.compile(model.policy) keeps the policy uncompiled: covey acts and trains "
                "through its own passes over the policy's layers (on these small networks torch.compile measured "
                "no faster: benchmarks/RESULTS.md), which would never call the compiled module. Leave the line out."
            )
            policy = compiled
        model.__dict__["policy"] = policy

    def __delete__(self, model: Any) -> None:
        try:
            del model.__dict__["policy"]
        except KeyError:
            raise AttributeError("policy") from None


def outside_inference_mode(learn: Callable) -> Callable:
    """``learn`` run outside the caller's ``torch.inference_mode()`` (as inside its ``torch.no_grad()``): the
    buffers a rollout fills and the updates' tensors are ordinary ones, which autograd can save for backward;
    acting enters inference mode itself, step by step."""

    @functools.wraps(learn)
    def outside(*args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode(False):
            return learn(*args, **kwargs)

    return outside


class BaseAgent:
    """learn/predict/save/load shared by covey's agents; see :class:`covey.PPO` for a user's view."""

    policy = _PolicyAttribute()

    agent_name: ClassVar[str] = "Base"
    has_memory: ClassVar[bool] = True
    """Whether the agent's policies may have recurrent memory (the *LstmPolicy names, ``policy_kwargs`` memory)."""
    supported_action_spaces: ClassVar[tuple[type, ...]] = (
        spaces.Box,
        spaces.Discrete,
        spaces.MultiDiscrete,
        spaces.MultiBinary,
    )
    # Keys of the settings that hold schedules (float or callable of progress remaining).
    schedule_keys: ClassVar[tuple[str, ...]] = ("learning_rate",)
    config_class: ClassVar[type | None] = None
    """The agent's hyperparameters (a dataclass, ``model.config``). Each field is also an attribute of the
    model, as in SB3 (``model.gamma``, ``model.n_epochs``), that reads and writes the config: what training
    uses and what ``save`` writes."""
    own_attributes: ClassVar[frozenset[str]] = frozenset()
    """Config fields whose model attribute is in SB3's form. For one of :attr:`schedule_keys` it is the
    schedule built from the setting (PPO's ``clip_range``): an assignment, a number or a schedule, is checked
    as the constructor checks it and kept in the config. The agent keeps the others itself (SAC's
    ``target_entropy``, the number in force)."""
    _sb3_policy_class: type | None = None
    """A user's SB3 policy class that PPO or SAC runs through SB3's calls (:mod:`covey.agents.sb3_policy`)."""
    built_from: ClassVar[dict[str, str]] = {}
    """Config fields read only when the networks and buffers are built, and what they shape: once the model is
    set up they are fixed (an assignment is refused with the fix, instead of being ignored or breaking
    training)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        config_class = cls.__dict__.get("config_class")
        if config_class is None:
            return
        for field in dataclasses.fields(config_class):
            if field.name in cls.own_attributes:
                if field.name in cls.schedule_keys:
                    setattr(cls, field.name, _schedule_setting(field.name))
            elif field.name not in cls.__dict__:
                setattr(cls, field.name, _setting(field.name))

    def _set_setting(self, name: str, value: Any) -> None:
        """``model.<name> = value`` for a config field: checked and converted by the config's own rules."""
        if name in self.built_from and getattr(self, "policy", None) is not None:
            agent = type(self).__name__
            raise ValueError(
                f"{name} shapes {self.built_from[name]}, built when the model was made, so it cannot change "
                f"afterwards. Pass {name}=... to {agent}(...), or to {agent}.load(path, env, {name}=...) to "
                "rebuild a saved model with it."
            )
        checked = dataclasses.replace(self.config, **{name: value})  # the config's checks, e.g. of a range
        setattr(self.config, name, getattr(checked, name))
        if name in self.__dict__:
            self.__dict__[name] = getattr(self, name)

    def _list_settings(self) -> None:
        """Put each hyperparameter's value in the instance's ``__dict__`` too, where SB3's model keeps it, for
        tools that read ``vars(model)``: W&B's ``WandbCallback`` makes its run's config from it when ``learn``
        starts its callbacks. ``model.gamma`` still reads the config (a property goes before the instance's
        ``__dict__``); these entries are what such tools see, written at each ``learn`` and each assignment."""
        cls = type(self)
        for field in dataclasses.fields(self.config):
            if isinstance(getattr(cls, field.name, None), property):
                self.__dict__[field.name] = getattr(self, field.name)

    def _setup_lr_schedule(self) -> None:
        """SB3's ``_setup_lr_schedule``: the learning rate in force becomes ``model.learning_rate`` (after
        ``model.learning_rate = ...``, which alone, as in SB3, leaves the schedule in force unchanged)."""
        self.lr_schedule = as_schedule(self.learning_rate)

    def __init__(
        self,
        policy: str,
        env: Any,
        learning_rate: float | Any,
        policy_kwargs: dict | None,
        stats_window_size: int,
        tensorboard_log: str | None,
        verbose: int,
        device: torch.device | str,
        seed: int | None,
    ) -> None:
        self.policy_name = (
            policy_name(policy, None if self.has_memory else self.agent_name)
            if self._sb3_policy_class is None
            else class_path(self._sb3_policy_class)  # what the file names, and load asks for in custom_objects
        )
        self.policy_kwargs = policy_kwargs_dict(policy_kwargs)
        self.learning_rate = learning_rate
        self.lr_schedule = as_schedule(learning_rate)
        self.tensorboard_log = tensorboard_log
        self.verbose = verbose = check_verbose(verbose)
        cpu_only = self._cpu_only()
        asked = None if isinstance(device, str) and device == "auto" else as_device(device)
        if cpu_only is not None and asked is not None and asked.type != "cpu":
            fix = "Pass device='cpu' (or device='auto', which picks the CPU for it)."
            if asked.type != "cuda" or torch.cuda.is_available():
                raise ValueError(f"{cpu_only}, so it runs on the CPU only; got device={device!r}. {fix}")
            # as get_device falls back, saying too that a machine with CUDA refuses it: the script would fail there
            warn_user(
                f"device={str(asked)!r} was asked for, but CUDA is not available: using the CPU. {cpu_only}, so it "
                f"runs on the CPU only, and where CUDA is available device={str(asked)!r} is refused. {fix}"
            )
            self.device = torch.device("cpu")
        else:
            self.device = get_device(device) if cpu_only is None else torch.device("cpu")
        if verbose >= 1:
            print(f"Using {self.device} device")  # as SB3 says it
        self.seed = check_seed(seed)
        if not whole_number(stats_window_size) or stats_window_size < 1:
            raise ValueError(f"stats_window_size={stats_window_size!r} is invalid: it must be a whole number >= 1.")
        self.stats_window_size = stats_window_size = int(stats_window_size)
        self.num_timesteps = 0
        self._total_timesteps = 0
        self._num_timesteps_at_start = 0
        self._n_updates = 0
        self._episode_num = 0
        self._current_progress_remaining = 1.0
        self._schedule_stand_ins: dict[str, float] = {}  # see _warn_schedule_stand_ins
        self.ep_info_buffer: deque = deque(maxlen=stats_window_size)
        self.ep_success_buffer: deque = deque(maxlen=stats_window_size)
        self._last_obs: Any = None
        self._last_episode_starts: np.ndarray | None = None
        self._logger: Logger | None = None
        self._custom_logger = False
        self.start_time = 0.0
        self.env: VecEnv | None = None
        self.observation_space: spaces.Space | None = None
        self.action_space: spaces.Space | None = None
        self.n_envs = 1
        if env is not None:
            self._attach_env(self._wrap_env(env))

    # ------------------------------------------------------------------ environment
    def _cpu_only(self) -> str | None:
        """Why this model runs on the CPU only (``device='auto'`` then picks the CPU), or None."""
        return None

    def _wrap_env(self, env: Any) -> Any:
        """What the user passed as ``env``, as the kind of env this agent steps (an SB3 VecEnv here); for a user's
        SB3 policy class, wrapped as SB3 wraps it (channel-last images moved to channels first)."""
        venv = as_vec_env(env, verbose=self.verbose)
        return venv if self._sb3_policy_class is None else sb3_wrap_env(venv, self.verbose)

    def _reset_env(self) -> None:
        """Start fresh episodes in every env copy (seeded as asked) and keep the first observations."""
        pending = getattr(self, "_pending_reset_seed", None)
        self._pending_reset_seed = None
        self._last_episode_starts = np.ones((self.env.num_envs,), dtype=bool)
        if pending is not None:
            # A VecEnv without seed() (e.g. SuperSuit's concat_vec_envs_v1): seed the Gymnasium-style vector env
            # it wraps, below any VecEnv wrappers (VecMonitor, VecNormalize), through its reset(seed=...).
            holder, inner = self.env, getattr(self.env, "venv", None)
            while isinstance(inner, VecEnv):
                holder, inner = inner, getattr(inner, "venv", None)
            if inner is None:
                warn_user(
                    f"seed={pending} was not applied to the env: {type(self.env).__name__}.seed() failed and no "
                    "vector env below it takes reset(seed=...). Seed the env yourself before training."
                )
            elif holder is self.env:
                self._last_obs, self.env.reset_infos = inner.reset(seed=pending)
                return
            else:  # the wrappers between reset too; the seeded vector env's next episodes follow from its seed
                inner.reset(seed=pending)
        self._last_obs = self.env.reset()

    @property
    def policy_class(self) -> type:
        """SB3's ``policy_class``: the class of ``model.policy``."""
        return type(self.policy)

    def _require_spaces(self) -> None:
        if self.observation_space is None or self.action_space is None:
            raise ValueError(
                f"{type(self).__name__} needs an env to build its networks: pass env=... (an env id, a Gymnasium "
                "env or a VecEnv), or use load() to restore a saved model without one."
            )

    def _attach_env(self, env: VecEnv) -> None:
        check_observation_space(env.observation_space)
        check_action_space(env.action_space, self.supported_action_spaces)
        warn_unmasked_actions(env.observation_space)
        warn_masking_env(env)
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.n_envs = env.num_envs

    @property
    def _stats_window_size(self) -> int:
        """SB3's name for :attr:`stats_window_size` (read and set)."""
        return self.stats_window_size

    @_stats_window_size.setter
    def _stats_window_size(self, value: int) -> None:
        self.stats_window_size = value

    def get_env(self) -> VecEnv | None:
        return self.env

    def get_vec_normalize_env(self):
        return unwrap_vec_normalize(self.env) if self.env is not None else None

    @property
    def _vec_normalize_env(self):
        """SB3's attribute for :meth:`get_vec_normalize_env` (e.g. ``replay_buffer.sample(n, env=...)``)."""
        return self.get_vec_normalize_env()

    def _fit_image_layout(self, venv: Any) -> Any:
        """``venv`` as it is, or, where its images keep their channels on the other side than the model's
        (HWC vs CHW, e.g. under SB3's ``VecTransposeImage``), wrapped to give them in the model's layout."""
        if isinstance(venv, VecEnv) and image_layout_moves(venv.observation_space, self.observation_space):
            return VecImageLayout(venv, self.observation_space)
        return venv

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Use a new env (same observation and action spaces) for further training."""
        venv = self._fit_image_layout(self._wrap_env(env))
        self._check_spaces(venv.observation_space, venv.action_space)
        if venv.num_envs != self.n_envs:
            raise ValueError(
                f"The new env has {venv.num_envs} copies, the model's buffers were built for {self.n_envs}. "
                f"Use an env with {self.n_envs} copies, or save the model and load it with the new env."
            )
        self._attach_env(venv)
        if force_reset:
            self._last_obs = None

    def _check_spaces(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        if not same_space(self.observation_space, observation_space):
            raise ValueError(
                f"Observation spaces do not match: the model has {self.observation_space}, "
                f"the env has {observation_space}. " + space_mismatch_advice(self.observation_space, observation_space)
            )
        if not same_space(self.action_space, action_space):
            raise ValueError(
                f"Action spaces do not match: the model has {self.action_space}, the env has {action_space}. "
                + space_mismatch_advice(self.action_space, action_space)
            )

    # ------------------------------------------------------------------ seeding
    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed Python, NumPy, torch, the action space and the env's next reset."""
        seed = check_seed(seed)
        if seed is None:
            return
        set_random_seed(seed)
        if self.action_space is not None:
            self.action_space.seed(seed)
        if self.env is not None:
            try:
                self.env.seed(seed)
            except (AttributeError, NotImplementedError):
                # Some vector envs (e.g. SuperSuit's) have no seed(); they are seeded at reset instead.
                self._pending_reset_seed = seed

    # ------------------------------------------------------------------ logging and callbacks
    @property
    def logger(self) -> Logger:
        if self._logger is None:
            self._logger = configure_logger(self.verbose, None, "", True)
        return self._logger

    def set_logger(self, logger: Logger) -> None:
        self._logger = logger
        self._custom_logger = True

    @staticmethod
    def _runs_user_code(callback: BaseCallback) -> bool:
        """Whether ``callback`` (as :meth:`_init_callback` made it) calls code of the user's: not for no callback,
        or only SB3's progress bar."""
        if isinstance(callback, CallbackList):
            return any(map(BaseAgent._runs_user_code, callback.callbacks))
        if isinstance(callback, ConvertCallback):
            return callback.callback is not None
        return not isinstance(callback, ProgressBarCallback)

    def _init_callback(self, callback: Any, progress_bar: bool) -> BaseCallback:
        given = callback if isinstance(callback, (list, tuple)) else [callback]
        wrong = [c for c in given if not (c is None or isinstance(c, BaseCallback) or callable(c))]
        if wrong or (isinstance(callback, (list, tuple)) and None in callback):
            raise ValueError(
                f"callback={callback!r} is invalid: pass an SB3 BaseCallback, a list of them, or a function of "
                "(locals, globals) that returns False to stop training."
            )
        if isinstance(callback, (list, tuple)):
            callback = CallbackList(list(callback))
        if not isinstance(callback, BaseCallback):
            callback = ConvertCallback(callback)
        if progress_bar:
            callback = CallbackList([callback, ProgressBarCallback()])
        callback.init_callback(self)
        return callback

    # ------------------------------------------------------------------ copies (copy.deepcopy, pickle)
    # What a copy takes over beside the model file: the env's place in training and the buffers of experience.
    _RUNTIME = (
        "_last_obs",
        "_last_episode_starts",
        "_last_original_obs",
        "_last_mask",
        "_last_slot_starts",
        "agent_steps",
        "action_noise",
        "replay_buffer",
        "lr_schedule",
        "_current_progress_remaining",
        "_total_timesteps",
        "_num_timesteps_at_start",
    )

    def _snapshot(self, with_env: bool = True) -> dict[str, Any]:
        """What :func:`_rebuild_agent` makes an equal model of: the model file (networks, optimizer states,
        hyperparameters, counters), schedules as given, the env and the runtime state."""
        file = io.BytesIO()
        policy_class = self._sb3_policy_class
        with warnings.catch_warnings():  # policy_kwargs the file cannot hold travel beside it
            warnings.simplefilter("ignore")
            self.save(file)
        config = getattr(self, "config", None)
        return {
            "file": file.getvalue(),
            "device": str(self.device),
            "env": self.env if with_env else None,
            "schedules": {k: getattr(config, k) for k in self.schedule_keys if callable(getattr(config, k, None))},
            # a user's SB3 policy class, which the file names only, and policy_kwargs as given (classes and values
            # the file cannot hold)
            "policy_class": policy_class,
            "policy_kwargs": self.policy_kwargs,
            # and that class's optimizer, which a script may have replaced (its state is in the file)
            "policy_optimizers": {
                path: (type(owner.optimizer), owner.optimizer.defaults)
                for path, owner in optimizer_owners(self.policy).items()
            }
            if policy_class
            else None,
            "runtime": {k: self.__dict__[k] for k in self._RUNTIME if with_env and k in self.__dict__},
            # a subclass's own constructor arguments, those the file cannot hold too (a function, say)
            "subclass_arguments": {k: getattr(self, k) for k in self._subclass_parameters() if hasattr(self, k)},
            # a recurrent policy's memories of the episodes its env is in
            "memories": (recurrent.actor_state, recurrent.critic_state)
            if with_env and (recurrent := getattr(self, "recurrent", None)) is not None
            else None,
        }

    def __reduce__(self):
        # A model's parameters live in flat buffers that its optimizers, NumPy acting and hand-written updates
        # view; a copy of its attributes would break those views. It is rebuilt from its file instead.
        if self.observation_space is None or getattr(self, "policy", None) is None:
            return super().__reduce__()
        self._refuse_copying_worker_processes()
        return _rebuild_agent, (type(self), self._snapshot())

    def _refuse_copying_worker_processes(self) -> None:
        """A TypeError, before anything is copied, where the model's env keeps its copies in worker processes
        (SB3's ``SubprocVecEnv``, Gymnasium's ``AsyncVectorEnv``): copying one fails on its pipes, and closes the
        original's ends of them on the way (its next step fails with 'Bad file descriptor')."""
        env = self.env
        for _ in range(64):  # down the wrappers: SB3's VecEnv wrappers' venv, Gymnasium's wrappers' env
            if env is None:
                return
            if isinstance(env, (SubprocVecEnv, gym.vector.AsyncVectorEnv)):
                raise TypeError(
                    f"This model's env is a {type(env).__name__}, whose env copies live in worker processes, which "
                    f"cannot be copied or pickled. To copy the model, save it and load it with an env of its own: "
                    f"model.save(path); {type(self).__name__}.load(path, env=...)."
                )
            env = getattr(env, "venv", None) or getattr(env, "env", None)

    def __copy__(self) -> BaseAgent:
        # A shallow copy shares everything, flat buffers included, as any object's does.
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo: dict) -> BaseAgent:
        if self.observation_space is None or getattr(self, "policy", None) is None:
            clone = type(self).__new__(type(self))
            memo[id(self)] = clone
            clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
            return clone
        self._refuse_copying_worker_processes()
        clone = _rebuild_agent(type(self), copy.deepcopy(self._snapshot(), memo))
        memo[id(self)] = clone
        return clone

    def _optimizer_slots(self) -> list[tuple[str, Any, Any]]:
        """``(SB3's name, the object there now, the optimizer covey steps)`` for each place SB3 keeps one."""
        return []

    @staticmethod
    def _check_log_interval(log_interval: Any) -> None:
        # SB3 logs where count % log_interval == 0: -1 and 1.0 log every time, as 1 does
        if log_interval is not None and not (whole_number(log_interval) and log_interval != 0):
            raise ValueError(
                f"log_interval={log_interval!r} is invalid: it must be a whole number other than 0 (logs are written "
                "when the count of iterations, or of SAC's episodes, is a multiple of it), or None for no logs."
            )

    def _warn_schedule_stand_ins(self) -> None:
        """Once, at the first ``learn`` after :meth:`load`: which schedules the file held as a number only (a
        function is code, which a covey file never keeps), so training goes on at a constant rate where SB3's,
        holding the function, goes on with the schedule."""
        stand_ins, self._schedule_stand_ins = self._schedule_stand_ins, {}
        # less those the script set again since (model.clip_range = schedule)
        stand_ins = {key: value for key, value in stand_ins.items() if not callable(getattr(self.config, key, None))}
        if stand_ins:
            names = ", ".join(f"{key}={value:g}" for key, value in stand_ins.items())
            given = ", ".join(f"{key!r}: <your schedule>" for key in stand_ins)
            warn_user(
                f"This model was saved with schedules that are functions, which a covey file keeps as their value "
                f"at save time only (their first value where they had fallen to 0): it trains at {names}, constant. "
                f"To go on with the schedules, pass them at load: {type(self).__name__}.load(path, "
                f"custom_objects={{{given}}}). SB3's LinearSchedule is kept in the file whole."
            )

    def _warn_normalized_entities(self) -> None:
        """The entity encoder reads all-zero rows as absent entities; VecNormalize's ``norm_obs`` moves them off
        zero, so padding would be attended to as entities, without a word."""
        config = getattr(self, "policy_config", None)
        normalize = self.get_vec_normalize_env()
        if config is None or not config.entity_encoder or normalize is None or not normalize.norm_obs:
            return
        warn_user(
            "policy_kwargs entity_encoder=True reads all-zero rows of the observation as absent entities (padding), "
            "and this model's env is a VecNormalize with norm_obs=True, which moves those rows off zero: the "
            "encoder then attends to padding as entities. If the env pads absent entities with zeros, use "
            "VecNormalize(norm_obs=False) (rewards may still be normalized)."
        )

    def _check_optimizers(self) -> None:
        for name, found, own in self._optimizer_slots():
            if found is not own:
                raise ValueError(
                    f"model.{name} was replaced (by {type(found).__name__}), but covey steps the optimizer it built "
                    "(one fused step over a flat buffer of the parameters), so the new one would never be used. "
                    "Choose the optimizer with policy_kwargs=dict(optimizer_class=..., optimizer_kwargs=...) when "
                    "building the model (load takes them in custom_objects); change the learning rate with "
                    "learning_rate (a number or a schedule), or model.learning_rate = x then "
                    "model._setup_lr_schedule()."
                )

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: Any,
        reset_num_timesteps: bool,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, BaseCallback]:
        if self.env is None:
            raise ValueError("This model has no env: pass one to the constructor, to load(env=...) or to set_env().")
        if (
            isinstance(total_timesteps, bool)
            or not isinstance(total_timesteps, numbers.Real)
            or not math.isfinite(total_timesteps)
            or total_timesteps < 0
        ):
            raise ValueError(
                f"total_timesteps must be a finite number >= 0 (the env steps to train for), got {total_timesteps!r}."
            )
        self._warn_schedule_stand_ins()
        self._warn_normalized_entities()
        self._check_schedules()
        raise_heap_thresholds()
        self.start_time = time.time_ns()
        if self.ep_info_buffer.maxlen != self.stats_window_size or reset_num_timesteps:
            self.ep_info_buffer = deque(maxlen=self.stats_window_size)
            self.ep_success_buffer = deque(maxlen=self.stats_window_size)
        if reset_num_timesteps:
            self.num_timesteps = 0
            self._episode_num = 0
            self._reset_own_counts()
        else:
            total_timesteps += self.num_timesteps
        self._total_timesteps = int(total_timesteps)
        self._num_timesteps_at_start = self.num_timesteps
        if reset_num_timesteps or self._last_obs is None:
            self._reset_env()
        self._check_optimizers()
        self._relink_parameters()
        self._check_weights_finite(after_update=False)
        if not self._custom_logger:
            if self._logger is not None:
                # the last learn's outputs: each TensorBoard writer holds a thread and a file, and SB3's loop
                # leaves one more of them open per learn call
                self._logger.close()
            self._logger = configure_logger(self.verbose, self.tensorboard_log, tb_log_name, reset_num_timesteps)
            # and this one once nothing can write to it any more (a sweep's dropped models kept a thread each)
            weakref.finalize(self._logger, _close_outputs, list(self._logger.output_formats))
        self._list_settings()
        return self._total_timesteps, self._init_callback(callback, progress_bar)

    def _reset_own_counts(self) -> None:
        """Counts of a subclass's own that start again with ``num_timesteps`` (at once: a reset of the env cut
        short afterwards leaves them agreeing)."""

    @outside_inference_mode
    def _learn_on_policy(
        self,
        total_timesteps: int,
        callback: Any,
        log_interval: int | None,
        tb_log_name: str,
        reset_num_timesteps: bool,
        progress_bar: bool,
    ):
        """The on-policy loop (PPO, POCA): collect a rollout, log, update; until the budget is spent or a
        callback stops training. Returns self."""
        self._check_log_interval(log_interval)
        # SB3's call, which a subclass's override of _setup_learn takes
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        iteration = 0  # before on_training_start, which passes it to callbacks (as SB3 does)
        callback.on_training_start(locals(), globals())
        while self.num_timesteps < total_timesteps:
            self._before_rollout()
            if not self.collect_rollouts(self.env, callback, self.rollout_buffer, n_rollout_steps=self.config.n_steps):
                break
            iteration += 1
            # SB3's calls, which a subclass's overrides take
            self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
            if log_interval is not None and iteration % log_interval == 0:
                self.dump_logs(iteration)
            # whatever grad mode the caller's code (or an interrupt inside a no_grad block) left the process in
            with torch.enable_grad():
                self.train()
            self._check_weights_finite(after_update=True)
            if self._normalizes_observations():  # the next rollout acts on them; this one's update did not move
                self._update_observation_statistics(self._rollout_observations())
        callback.on_training_end()
        return self

    def _before_rollout(self) -> None:
        """What the on-policy loop does before each ``collect_rollouts`` (its own, or a subclass's)."""

    def _check_collection(self, env: Any, buffer: Any, buffer_name: str, steps: int | None = None) -> None:
        """SB3's ``collect_rollouts`` takes the env, the buffer and the steps as arguments; covey's collects from
        the model's own env into its own buffer (sized for them), so those are the ones it takes."""
        if (
            env is not self.env
            or buffer is not getattr(self, buffer_name)
            or (steps is not None and steps != self.config.n_steps)
        ):
            raise ValueError(
                f"collect_rollouts() collects from the model's own env and {buffer_name}"
                + ("" if steps is None else f", n_steps={self.config.n_steps} steps")
                + f": pass model.env, model.{buffer_name}"
                + ("" if steps is None else " and model.n_steps")
                + " (as learn() does; set_env() changes the env)."
            )

    def _update_current_progress_remaining(
        self, num_timesteps: int | None = None, total_timesteps: int | None = None
    ) -> None:
        """Schedules' progress remaining, 1 -> 0 over the budget counted from step 0 (as SB3 counts it): a
        ``learn(n, reset_num_timesteps=False)`` that continues a run continues its schedules too. SB3's
        signature: the counts default to the model's."""
        done = self.num_timesteps if num_timesteps is None else num_timesteps
        total = self._total_timesteps if total_timesteps is None else total_timesteps
        self._current_progress_remaining = 1.0 - float(done) / max(total, 1)

    def _update_info_buffer(self, infos: list[dict], dones: np.ndarray) -> None:
        for i, info in enumerate(infos):
            episode = info.get("episode")
            if episode is not None:
                self.ep_info_buffer.append(episode)
            success = info.get("is_success")
            if success is not None and dones[i]:
                self.ep_success_buffer.append(success)

    def dump_logs(self, iteration: int = 0) -> None:
        """Write one row of logs now, as training does every ``log_interval`` iterations (SB3's public method,
        which its ``LogEveryNTimesteps`` callback calls); an ``iteration`` above 0 is logged as ``time/iterations``."""
        self._dump_logs(iteration, "time/iterations" if iteration > 0 else None)

    def _dump_logs(self, iteration: int, counter: str | None = "time/iterations") -> None:
        """Record SB3's ``time/*`` and ``rollout/*`` keys (``counter``: ``iteration``'s key, if any) and write one
        row of logs."""
        elapsed = max((time.time_ns() - self.start_time) / 1e9, 1e-9)
        fps = int((self.num_timesteps - self._num_timesteps_at_start) / elapsed)
        logger = self.logger
        if counter is not None:
            logger.record(counter, iteration, exclude="tensorboard")
        if self.ep_info_buffer:
            logger.record("rollout/ep_rew_mean", safe_mean([ep["r"] for ep in self.ep_info_buffer]))
            logger.record("rollout/ep_len_mean", safe_mean([ep["l"] for ep in self.ep_info_buffer]))
        if self.ep_success_buffer:
            logger.record("rollout/success_rate", safe_mean(list(self.ep_success_buffer)))
        logger.record("time/fps", fps)
        logger.record("time/time_elapsed", int(elapsed), exclude="tensorboard")
        logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        logger.dump(step=self.num_timesteps)

    # ------------------------------------------------------------------ acting
    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Actions for a single or batched observation, as SB3's ``predict``; returns ``(action, state)``."""
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError(
                "predict() got a tuple (observation, info): Gymnasium's env.reset() returns both. "
                "Use `obs, info = env.reset()` and pass `obs`."
            )
        actions, state = self.policy.predict(observation, state, episode_start, deterministic)
        trainer = getattr(self, "_sb3_trainer", None)  # a user's SB3 policy class acts from 0: into the space
        return (actions if trainer is None else trainer.shifted(actions)), state

    def _check_schedules(self) -> None:
        """Each schedule's value at the start of a run (:func:`scheduled`), so that one returning no number fails
        at ``learn``, not after the first rollout; each update checks the value it reads too."""
        for key in self.schedule_keys:
            schedule = self.lr_schedule if key == "learning_rate" else getattr(self, key, None)
            if schedule is not None:
                scheduled(schedule, 1.0, type(self).__name__, key)

    def _update_learning_rate(self, optimizers: Any = None) -> float:
        """Set every optimizer's step size (``optimizers``' only, an optimizer or a list, where given: SB3's
        signature) from the schedule at the current progress, and log it as ``train/learning_rate``, as SB3 does;
        returns it. Called once per update, it also relinks the parameters with their flat buffers (a user's
        ``module.zero_grad()`` sets their gradients to None; SB3's ``policy.load_from_vector`` replaces their
        data)."""
        lr = scheduled(self.lr_schedule, self._current_progress_remaining, type(self).__name__, "learning_rate")
        if optimizers is None:
            optimizers = list(self._optimizers().values())
        elif not isinstance(optimizers, (list, tuple)):
            optimizers = [optimizers]
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        self.logger.record("train/learning_rate", lr)
        self._relink_parameters()
        return lr

    def _flat_parameters(self) -> list[FlatParameters]:
        """The flat buffers the model's parameters live in (:class:`FlatParameters`)."""
        flats = (getattr(optimizer, "flat_parameters", None) for optimizer in self._optimizers().values())
        return [flat for flat in flats if flat is not None]

    def _take_back_replaced_parameters(self) -> None:
        """:meth:`FlatParameters.take_back_replaced` for every buffer: between env steps, after a callback that
        may have replaced a parameter's ``.data`` (``vector_to_parameters``), so the rest of the rollout acts with
        the new values, as SB3's does."""
        for flat in self._flat_parameters():
            flat.take_back_replaced()

    def _relink_parameters(self) -> None:
        """:meth:`FlatParameters.relink` for every buffer: before the first rollout of ``learn`` and before every
        update, so a parameter's replaced ``.data`` trains from its new values. A parameter object replaced in its
        module is refused (:meth:`_check_parameter_objects`)."""
        flats = self._flat_parameters()
        for flat in flats:
            flat.relink()
        self._check_parameter_objects(flats)

    def _check_weights_finite(self, after_update: bool) -> None:
        """Raise where a weight holds NaN or an infinity, at ``learn``'s start and after each update: a model in
        that state acts on garbage (NaN actions into the env, or always the first of its Discrete actions) and
        never recovers, where SB3's fails at its next step with torch's distribution error. After an update, the
        sums of :meth:`_watched_flats` are tested (a NaN or an infinity makes a sum one; about 20 us per 100k
        weights, where ``isfinite().all()`` took 15 times that); every parameter where one is not finite."""
        flats = self._watched_flats() if after_update else self._flat_parameters()
        if flats and all(bool(torch.isfinite(flat.data.sum())) for flat in flats):
            return
        networks = {name: m for name, m in self._networks().items() if isinstance(m, torch.nn.Module)}
        bad = [
            f"{group}.{name}"
            for group, module in networks.items()
            for name, p in module.named_parameters()
            if p.is_floating_point() and not bool(torch.isfinite(p).all())
        ]
        bad += [name for name, p in self._parameters_outside_networks().items() if not bool(torch.isfinite(p).all())]
        if not bad:
            return
        names = f"{', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}"
        if after_update:
            raise ValueError(
                f"Training diverged: after {self._n_updates} updates (train/n_updates), {len(bad)} of this model's "
                f"weights hold NaN or infinite values ({names}). Lower learning_rate, clip the gradients with "
                "max_grad_norm, or scale the rewards and observations (VecNormalize)."
            )
        raise ValueError(
            f"{len(bad)} of this model's weights hold NaN or infinite values ({names}) before training: set them "
            "from finite values (set_parameters, load_state_dict, or a model file saved before they diverged)."
        )

    def _warn_batch_layout(self) -> None:
        """Warn where minibatches do not tile what the model trains on (PPO's and POCA's rollouts): from the
        constructor, and from ``load`` where its arguments change the layout."""

    def _watched_flats(self) -> list[FlatParameters]:
        """The flat buffers :meth:`_check_weights_finite` tests after each update: all of them."""
        return self._flat_parameters()

    def _parameters_outside_networks(self) -> dict[str, torch.Tensor]:
        """Parameters an optimizer trains that no network holds, by their attribute names on the model (SAC's
        learned temperature)."""
        return {}

    def _check_parameter_objects(self, flats: list[FlatParameters]) -> None:
        """Refuse a parameter object replaced in a network (``policy.action_net.bias = nn.Parameter(...)``): the
        optimizer, NumPy acting and the hand-written updates hold the one the model was built with, so the new one
        would act in ``predict`` only, untrained. (``.data`` replaced, ``load_state_dict`` and in-place changes
        are taken.)"""
        links = getattr(self, "_module_links", None)
        if links is not None and links[0] == [id(flat) for flat in flats]:
            # What held the parameters when they were last found in place is unchanged: nothing was replaced (a few
            # microseconds, where finding them takes tens; SAC relinks at every train() call).
            if all(entries.get(name) is obj for entries, name, obj in links[1]):
                return
        groups = {name: m for name, m in self._parameter_groups().items() if isinstance(m, torch.nn.Module)}
        held = {id(p) for m in groups.values() for p in m.parameters()}
        outside = self._parameters_outside_networks()
        held |= {id(p) for p in outside.values()}
        lost = [p for flat in flats for p in flat.params if id(p) not in held]
        if not lost:
            modules = {id(m): m for group in groups.values() for m in group.modules()}.values()
            self._module_links = (
                [id(flat) for flat in flats],
                [(m._modules, n, c) for m in modules for n, c in m._modules.items()]
                + [(m._parameters, n, q) for m in modules for n, q in m._parameters.items()]
                + [(self.__dict__, n, q) for n, q in outside.items()],
            )
            return
        trained = {id(p) for flat in flats for p in flat.params}
        owners = [m for m in groups.values() if any(id(p) in trained for p in m.parameters())]
        new = [
            f"{group}.{name}"
            for group, m in groups.items()
            if m in owners
            for name, p in m.named_parameters()
            if id(p) not in trained
        ] + [name for name, p in outside.items() if id(p) not in trained]
        built_on = lost[0].device
        moved = {str(p.device) for m in groups.values() for p in m.parameters() if id(p) not in trained}
        moved -= {str(built_on)}
        if moved:
            raise ValueError(
                f"This model's parameters were moved to {', '.join(sorted(moved))} (by policy.to(...), say) after it "
                f"was built on {built_on}, where its optimizer holds them. Build the model on the device it trains on "
                f"({type(self).__name__}(..., device=...)), or load it there ({type(self).__name__}.load(path, "
                "device=...))."
            )
        raise ValueError(
            f"{len(lost)} of this model's parameters were replaced by other parameter objects"
            + (f" ({', '.join(new[:4])}{', ...' if len(new) > 4 else ''})" if new else "")
            + ", e.g. by policy.action_net.bias = nn.Parameter(...). covey's optimizer trains the parameters the "
            "model was built with, from one flat buffer, so a new one would go untrained. Change their values in "
            "place instead: with torch.no_grad(): param.copy_(new_values), or module.load_state_dict(...); for "
            "other layers, build the model with them (policy_kwargs, or a policy class of your own)."
        )

    def _optimizer_step(self, loss: torch.Tensor, max_grad_norm: float) -> None:
        """One step of the single optimizer over its flat buffer of the parameters (``optimizer.flat_parameters``):
        clip the global gradient norm, step, and move the critic's EMA copy (if any) after it."""
        flat = self.optimizer.flat_parameters
        flat.zero_grad()
        loss.backward()
        flat.clip_grad_norm_(max_grad_norm)
        flat.step(self.optimizer)
        if getattr(self, "critic_ema", None) is not None:
            self.critic_ema.update()

    def _make_optimizer(
        self, params: list[torch.Tensor], adam_eps: float | None = None, plain_adam: bool = False
    ) -> torch.optim.Optimizer:
        """``policy_kwargs``' optimizer over ``params`` (``plain_adam``: Adam with its defaults, whatever
        ``policy_kwargs`` say), laid out in one flat buffer (:class:`FlatParameters`, reachable as
        ``optimizer.flat_parameters``): the optimizer steps one tensor, and Adam is fused."""
        pc = self.policy_config
        optimizer_class = torch.optim.Adam if plain_adam else pc.optimizer_class
        kwargs = {} if plain_adam else pc.optimizer_arguments(adam_eps)
        if optimizer_class in (torch.optim.Adam, torch.optim.AdamW):
            if "foreach" not in kwargs and "fused" not in kwargs and params:
                kwargs["fused"] = True
        flat = FlatParameters(params)
        lr = scheduled(self.lr_schedule, 1.0, type(self).__name__, "learning_rate")
        return flat.attach(optimizer_class([flat.data], lr=lr, **kwargs))

    # ------------------------------------------------------------------ observation statistics
    def _normalizes_observations(self) -> bool:
        config = getattr(self, "policy_config", None)
        return bool(getattr(config, "normalize_observations", False)) and self._sb3_policy_class is None

    def _update_observation_statistics(self, observations: Any) -> None:
        """``normalize_observations``: take a batch of collected observations (as the networks take them) into
        the running statistics. Each network holds its own (the critic's copies too: SAC's target, the EMA), and
        each takes every batch, so they stay equal."""
        encoders = {
            id(module): module
            for network in self._networks().values()
            for module in network.modules()
            if isinstance(module, NormalizedEncoder)
        }
        for encoder in encoders.values():
            encoder.update(observations)

    def _rollout_observations(self) -> Any:
        """The observations of the rollout just trained on, as one batch (on-policy agents)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ parameters and files
    def _networks(self) -> dict[str, torch.nn.Module]:
        """Named modules whose state dicts make up the model (subclasses add theirs)."""
        raise NotImplementedError

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        raise NotImplementedError

    def _setup_model(self) -> None:
        raise NotImplementedError

    def _hyperparameters(self) -> dict[str, Any]:
        """Constructor keyword arguments (JSON-friendly) that rebuild this agent: its config's fields."""
        return config_dict(self.config)

    def _parameter_groups(self) -> dict[str, Any]:
        """What ``get_parameters`` returns and ``set_parameters`` and model files restore, by name (PPO and SAC
        use SB3's names: ``policy``, ``policy.optimizer``, ...): modules, optimizers and anything else with
        ``state_dict``/``load_state_dict``."""
        return {**self._networks(), **self._optimizers()}

    def _translate_parameter_names(self, params: dict) -> dict:
        """Parameter groups named as earlier covey files (or SB3, for PPO and SAC) name them, renamed to
        :meth:`_parameter_groups`'."""
        return params

    def _flat_image(self) -> tuple[int, ...] | None:
        """The shape of channel-last image observations that the actor reads flattened (an ``MlpPolicy``), which
        SB3's networks read moved to channels first (None: other observations)."""
        space = self.observation_space
        if is_image_space(space) and channels_last(space.shape):
            if isinstance(getattr(getattr(self, "actor", None), "encoder", None), FlattenEncoder):
                return tuple(space.shape)
        return None

    def get_parameters(self) -> dict[str, dict]:
        """State dicts of every parameter group, by name (SB3's ``get_parameters``), a subclass's own too
        (:meth:`_get_torch_save_params`)."""
        return {name: group.state_dict() for name, group in self._saved_groups().items()}

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        """SB3's: the attributes whose state dicts (first list) and tensors (second) the model file holds, by
        attribute path. A subclass adds its own (an auxiliary network, its optimizer, a tensor), as with SB3:
        ``names, tensors = super()._get_torch_save_params(); return [*names, "aux", "aux_optimizer"], tensors``;
        ``save`` writes them and ``load`` reads them back into the model the subclass's ``_setup_model`` built."""
        return list(self._parameter_groups()), []

    def _saved_groups(self) -> dict[str, Any]:
        """:meth:`_parameter_groups` and those a subclass's :meth:`_get_torch_save_params` adds."""
        groups = dict(self._parameter_groups())
        names, tensors = self._get_torch_save_params()
        for name in [*names, *tensors]:
            if name in groups:
                continue
            owner = self
            *path, last = name.split(".")
            try:
                for part in path:
                    owner = getattr(owner, part)
                value = getattr(owner, last)
            except AttributeError as err:
                raise AttributeError(
                    f"_get_torch_save_params names {name!r}, which this model does not have ({err}). Name attributes "
                    "the model holds (set in _setup_model, so that load builds them too)."
                ) from None
            if torch.is_tensor(value):
                groups[name] = _TensorAttribute(owner, last)
            elif callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
                groups[name] = value
            else:
                raise TypeError(
                    f"_get_torch_save_params names {name!r}, a {type(value).__name__}: covey's model file holds "
                    "state dicts (modules, optimizers) and tensors, never pickled objects."
                )
        return groups

    _sb3_optimizers: ClassVar[tuple[str, ...]] = ()
    """The optimizers SB3's model of this agent saves, by SB3's names (``policy.optimizer``, ...)."""

    def get_sb3_parameters(self) -> dict[str, dict]:
        """The policy's weights and its optimizers' states under SB3's names and in SB3's parameter order, for an
        SB3 model built with this model's settings: ``sb3_model.set_parameters(model.get_sb3_parameters())``. The
        way back of ``model.set_parameters(sb3_model.get_parameters())``, for PPO and SAC with ``MlpPolicy``,
        ``CnnPolicy`` (NatureCNN) and ``MultiInputPolicy`` (CombinedExtractor), and PPO with LSTM memory for
        sb3-contrib's RecurrentPPO (``MlpLstmPolicy``, ...); a network SB3 does not have (a GRU, a two-hot critic) is
        refused. SAC's learned temperature is ``model.log_ent_coef``, which
        SB3 keeps outside its parameters (``sb3_model.log_ent_coef.data.copy_(model.log_ent_coef.data)``); its
        optimizer's state is ``ent_coef_optimizer``, as in SB3. A Discrete or MultiDiscrete action space with a
        ``start`` is warned of: SB3's model acts from 0 (each action covey's minus the start)."""
        self._sb3_class()
        # SB3's networks of these settings, or the reason it has none, before a warning on how to use them
        template = None if self._sb3_policy_class is not None else self._sb3_template()
        start = action_start(self.action_space)
        if start is not None:
            warn_user(
                f"The action space {self.action_space} has a start, which SB3 ignores: SB3's model of these weights "
                f"acts from 0, outside the space (each action is covey's minus {start.tolist()}). Give SB3's model "
                "an env whose actions start at 0, or shift its actions by the start."
            )
        groups = self.get_parameters()
        if self._sb3_policy_class is not None:  # an SB3 policy class: SB3's names and order already
            return {name: groups[name] for name in ("policy", *self._sb3_optimizers) if name in groups}
        template_state = template.state_dict()
        out = {"policy": to_sb3(self.agent_name, groups["policy"], template_state, self._flat_image())}
        for name in self._sb3_optimizers:
            if name not in groups:
                continue  # SAC's ent_coef_optimizer with a fixed temperature
            names, theirs = self._sb3_optimizer_names(template, name)
            # SB3's optimizer's settings, at the learning rate covey's stands at
            (settings,) = theirs.state_dict()["param_groups"]
            settings = [{**settings, "lr": groups[name]["param_groups"][0]["lr"]}]
            if name == "ent_coef_optimizer":  # one parameter, outside the policy, on either side
                out[name] = {**groups[name], "param_groups": settings}
                continue
            out[name] = move_optimizer_state(
                self.agent_name, groups[name], template_state, self._flat_image(), names, settings, to_sb3=True
            )
        return out

    def to_sb3_model(self, env: Any = None) -> Any:
        """This model as SB3's model of its class (``stable_baselines3.PPO`` or ``SAC``, sb3-contrib's
        ``RecurrentPPO`` for a PPO with LSTM memory): the same policy,
        ``policy_kwargs`` and hyperparameters, the weights and optimizer states (:meth:`get_sb3_parameters`), SAC's
        learned temperature, and where training stands (``num_timesteps``, the update count, the schedules'
        progress, the episode statistics). On ``env`` when given; without one the model is built as SB3's ``load``
        builds it without an env (``set_env`` before ``learn``). ``sb3_model.save(path)`` then writes SB3's own
        file. What SB3's model does not have is refused as :meth:`get_sb3_parameters` refuses it."""
        params = self.get_sb3_parameters()
        if self._sb3_policy_class is not None:
            raise ValueError(
                f"This model's policy is a class of your own ({type(self.policy).__name__}): build SB3's model with it "
                "and copy the parameters: sb3_model.set_parameters(model.get_sb3_parameters())."
            )
        sb3_class = self._sb3_class()
        kwargs = self._sb3_arguments()
        if env is None and kwargs.get("replay_buffer_class") is stable_baselines3.HerReplayBuffer:
            raise ValueError("SB3 builds a HerReplayBuffer from the env: pass env to to_sb3_model.")
        common = dict(
            policy_kwargs=self._sb3_policy_kwargs(),
            seed=self.seed,
            verbose=self.verbose,
            tensorboard_log=self.tensorboard_log,
            device=self.device,
        )
        if env is not None:
            model = sb3_class(self._sb3_policy_name(), env, **common, **kwargs)
        else:  # as SB3's load: the spaces set before the networks are built
            model = sb3_class(self._sb3_policy_name(), None, **common, **kwargs, _init_setup_model=False)
            model.observation_space, model.action_space = self._sb3_observation_space(), self.action_space
            model.n_envs = self.n_envs
            model._setup_model()
        model.set_parameters(params)
        if getattr(self, "log_ent_coef", None) is not None:
            with torch.no_grad():
                model.log_ent_coef.copy_(self.log_ent_coef.detach().reshape(model.log_ent_coef.shape))
        model.num_timesteps, model._n_updates = self.num_timesteps, self._n_updates
        model._current_progress_remaining, model._episode_num = self._current_progress_remaining, self._episode_num
        model.ep_info_buffer = deque(copy.deepcopy(list(self.ep_info_buffer)), maxlen=self.ep_info_buffer.maxlen)
        model.ep_success_buffer = deque(list(self.ep_success_buffer), maxlen=self.ep_success_buffer.maxlen)
        return model

    def _sb3_arguments(self) -> dict[str, Any]:
        """SB3's constructor arguments for this model's hyperparameters (covey's own, such as ``bf16_matmuls``,
        left out)."""
        accepted = inspect.signature(self._sb3_class().__init__).parameters
        return {key: value for key, value in self._hyperparameters().items() if key in accepted}

    def _sb3_observation_space(self) -> spaces.Space:
        """The observation space SB3's networks of this model see: channel-last images moved channels first, as
        SB3's ``VecTransposeImage`` moves them, a Dict's image keys too (by covey's rule of what is an image, that of
        its encoders)."""

        def sb3s(space: spaces.Space) -> spaces.Space:
            if is_image_space(space) and channels_last(space.shape):
                return VecTransposeImage.transpose_space(space)
            return space

        space = self.observation_space
        if isinstance(space, spaces.Dict):
            return spaces.Dict({key: sb3s(sub) for key, sub in space.spaces.items()})
        return sb3s(space)

    def _sb3_template(self) -> Any:
        """SB3's policy (with its optimizers) of this model's settings, whose parameter names and order SB3's
        model of them has; a ValueError names a setting SB3's policy does not have."""
        if self.agent_name == "SAC" and not isinstance(self.action_space, spaces.Box):
            raise ValueError(
                f"SB3's SAC has Box actions only; this model's are {self.action_space} (covey's SAC for Discrete "
                "actions has no SB3 counterpart)."
            )
        sb3_class, name = self._sb3_class(), self._sb3_policy_name()
        sb3_policy = sb3_class.policy_aliases.get(name)
        if sb3_policy is None:
            raise ValueError(
                f"{sb3_class.__name__} has no {name}: weights go to its {', '.join(sb3_class.policy_aliases)}."
            )
        space = self._sb3_observation_space()
        problem = sb3_observation_problem(self.observation_space, name)
        if problem is not None:
            raise ValueError(f"{problem}, for a model SB3 has a counterpart of.")
        unmoved = [m for m in self.policy.modules() if isinstance(m, NatureCNN) and m.channels_last and not m.pixels]
        if unmoved:
            raise ValueError(
                f"This model's CNN reads channel-last images that are not uint8 pixels ({self.observation_space}), "
                "which covey moves channels first itself; SB3 moves only uint8 images in [0, 255] (VecTransposeImage), "
                "so its CnnPolicy would read the last axis as a width. Train on channel-first images (C, H, W) for a "
                "model SB3 has a counterpart of."
            )
        kwargs = self._sb3_policy_kwargs()
        kwargs.pop("use_sde", None)  # the model's decides
        own = sorted(set(kwargs) - set(inspect.signature(sb3_policy).parameters))
        if own:
            raise ValueError(
                f"policy_kwargs {own} are covey's own settings, which {sb3_class.__name__}'s {name} does not have: "
                "this model's networks have no SB3 counterpart."
            )
        return build_policy(sb3_policy, space, self.action_space, lambda _: 0.0, self.use_sde, kwargs, "cpu")

    def _memory(self) -> Any:
        """The actor's recurrent memory (None without one)."""
        return getattr(getattr(self, "actor", None), "memory", None)

    def _sb3_class(self) -> type:
        """SB3's model class of this model: ``stable_baselines3.PPO`` or ``SAC``, sb3-contrib's ``RecurrentPPO``
        for a PPO with memory. A ValueError says where there is none."""
        if getattr(stable_baselines3, self.agent_name, None) is None:
            raise ValueError(f"SB3 has no {self.agent_name}: weights go to SB3's PPO and SAC.")
        if self._memory() is None:
            return getattr(stable_baselines3, self.agent_name)
        if self.agent_name != "PPO":
            raise ValueError(
                f"SB3's {self.agent_name} has no recurrent memory: this model's networks have no SB3 counterpart."
            )
        try:
            from sb3_contrib import RecurrentPPO
        except ImportError as err:
            raise ValueError(
                "A PPO with memory is sb3-contrib's RecurrentPPO in SB3's world, and sb3-contrib is not installed: "
                "pip install sb3-contrib."
            ) from err
        return RecurrentPPO

    def _sb3_policy_name(self) -> str:
        """The name of this model's policy in its SB3 class: a PPO with memory built as ``MlpPolicy`` with
        ``policy_kwargs`` memory is RecurrentPPO's ``MlpLstmPolicy``."""
        if self._memory() is None or self.policy_name in LSTM_POLICIES:
            return self.policy_name
        return next((lstm for lstm, plain in LSTM_POLICIES.items() if plain == self.policy_name), self.policy_name)

    def _sb3_policy_kwargs(self) -> dict[str, Any]:
        """``policy_kwargs`` for SB3's policy of this model: a memory's size is RecurrentPPO's ``lstm_hidden_size``
        (covey's ``memory`` sequence length is a training setting RecurrentPPO does not have)."""
        kwargs = copy.deepcopy(self.policy_kwargs)
        memory = self._memory()
        if memory is not None:
            if memory.kind != "lstm":
                raise ValueError(
                    f"This model's memory is a {memory.kind.upper()}; sb3-contrib's RecurrentPPO has LSTMs only."
                )
            kwargs.pop("memory", None)
            kwargs["lstm_hidden_size"] = memory.hidden_size
        return kwargs

    def _sb3_optimizer_names(
        self, template: Any, name: str
    ) -> tuple[tuple[list[list[str]], list[list[str]]], torch.optim.Optimizer]:
        """For the optimizer SB3 names ``name``: the names of the parameters it steps in SB3's policy
        ``template`` and of those covey's steps in ``model.policy`` (each in its optimizer's order), and SB3's
        optimizer (``ent_coef_optimizer``: a fresh Adam, as SB3's SAC makes it)."""
        if name == "ent_coef_optimizer":
            return ([], []), torch.optim.Adam([torch.zeros(1, requires_grad=True)])
        ours = self._parameter_groups()[name]
        theirs = template
        for part in name.removeprefix("policy.").split("."):
            theirs = getattr(theirs, part)
        return (_optimizer_parameter_names(template, theirs), _optimizer_parameter_names(self.policy, ours)), theirs

    def _sb3_optimizer_state(self, name: str, state: dict) -> dict:
        """The state of SB3's optimizer ``name`` (as SB3's ``get_parameters`` gives it) for covey's optimizer of
        that name: per-parameter tensors moved to covey's order and layout, covey's optimizer settings kept (the
        schedule sets the learning rate). Raises ValueError where they do not fit."""
        ours = self._parameter_groups().get(name)
        if ours is None:
            raise ValueError(f"this model has no {name} (SAC's, with a fixed ent_coef)")
        (settings,) = ours.param_groups  # covey's optimizers have one group (over one flat buffer)
        groups = [{**{key: value for key, value in settings.items() if key != "params"}, "params": [0]}]
        if name == "ent_coef_optimizer":  # one parameter, outside the policy, on either side
            if len(state.get("param_groups", [])) != 1 or len(state["param_groups"][0]["params"]) != 1:
                raise ValueError("the temperature's optimizer state is not of one parameter")
            return {"state": state["state"], "param_groups": groups}
        template = self._sb3_template()
        names, _ = self._sb3_optimizer_names(template, name)
        return move_optimizer_state(
            self.agent_name, state, template.state_dict(), self._flat_image(), names, groups, to_sb3=False
        )

    def set_parameters(
        self,
        load_path_or_dict: str | os.PathLike | dict,
        exact_match: bool = True,
        device: torch.device | str | int = "auto",
    ) -> None:
        """Load state dicts from a dict (as ``get_parameters`` returns), a covey model file or an SB3 one. With
        ``exact_match`` every network of the model must be given, with every tensor; optimizer states may be
        left out (the optimizers keep theirs), so that ``{"policy": sb3_model.policy.state_dict()}`` copies.
        ``device`` is checked as the constructor's is; the values are copied into the model's parameters, which
        stay on ``model.device`` (as SB3's do)."""
        if device != "auto":
            as_device(device)
        if isinstance(load_path_or_dict, dict):
            params = load_path_or_dict
        else:
            _, params = self._read_model_file(load_path_or_dict, self.device)
            params.pop(ENV_PLACE, None)  # not a parameter group: what load(..., force_reset=False) goes on from
        params = self._translate_parameter_names(params)
        targets = self._saved_groups()
        unknown = sorted(set(params) - set(targets))
        if unknown:
            raise ValueError(f"Unknown parameter groups {unknown}; this model has {sorted(targets)}.")
        modules = [name for name, group in targets.items() if isinstance(group, torch.nn.Module)]
        missing = sorted(set(modules) - set(params))
        if exact_match and missing:
            raise ValueError(f"Parameter groups {missing} are missing (pass exact_match=False to load a subset).")
        for name, state in params.items():
            target = targets[name]
            if isinstance(target, torch.nn.Module):
                try:
                    target.load_state_dict(state, strict=exact_match)
                except RuntimeError as err:
                    raise ParameterMismatchError(f"Parameters for {name!r} do not fit this model: {err}") from err
            elif isinstance(target, torch.optim.Optimizer) and len(state.get("param_groups", ())) != len(
                target.param_groups
            ):
                more = "it was saved by" if len(state["param_groups"]) > len(target.param_groups) else "this is"
                raise ParameterMismatchError(
                    f"The state of {name!r} has {len(state['param_groups'])} parameter groups, this model's optimizer "
                    f"{len(target.param_groups)}: {more} a model whose optimizer had groups added (add_param_group, "
                    "in a subclass's _setup_model say). Load it with a model of the same groups, or leave the "
                    "optimizer's state out (set_parameters with only the networks)."
                )
            else:
                target.load_state_dict(state)

    def save(
        self,
        path: str | os.PathLike | io.BufferedIOBase,
        exclude: list[str] | None = None,
        include: list[str] | None = None,
    ) -> None:
        """Write the model to one ``.zip`` file (suffix added when missing), atomically.

        ``exclude`` names optimizer states (e.g. ``"policy.optimizer"``) and hyperparameters (``"gamma"``: ``load``
        then takes the constructor's default, as SB3's does) to leave out. The networks' weights are always saved,
        as SB3 saves them whatever ``exclude`` names, and other names (SB3's pickled attributes, such as
        ``"env"``) are ignored, as there is nothing of them in the file. ``include`` asks SB3 to pickle
        an attribute it leaves out; covey pickles nothing, so it may only name what is saved anyway (SAC's
        replay buffer has its own file: ``save_replay_buffer``). A subclass's own networks, optimizers and
        tensors are saved where its :meth:`_get_torch_save_params` names them, and its own constructor arguments
        where they are attributes of the same name that JSON holds (numbers, strings, lists, dicts).
        """
        groups = self._saved_groups()
        networks = {name for name, group in groups.items() if isinstance(group, torch.nn.Module)}
        exclude = set(exclude or []) - networks
        place = None if "_last_obs" in exclude else self._env_place()
        # What the file holds anyway, by SB3's attribute names: include may name it, as SB3's save takes it
        # exclude may leave out a constructor argument kept there (SAC's action_noise), not the file's own records
        arguments = set(inspect.signature(type(self).__init__).parameters)
        excluded = frozenset(exclude & arguments)
        extra_settings = {k: v for k, v in self._extra_settings(excluded).items() if k not in excluded}
        saved = set(groups) | set(self._hyperparameters_json()) | set(extra_settings) | _SAVED_ATTRIBUTES
        if place is not None:
            saved |= {"_last_obs", "_last_episode_starts", "_last_original_obs"}
        extra = sorted(set(include or []) - saved)
        if extra:
            ways = {  # what to do instead, for the names SB3's scripts include
                "env": "pass the env to load(path, env=...)",
                "replay_buffer": "save the replay buffer beside the model with model.save_replay_buffer(path) "
                "(model.load_replay_buffer(path) reads it back)",
            }
            advice = "; ".join(ways[name] for name in extra if name in ways)
            raise ValueError(
                f"save(include={extra}): covey's model file holds the settings (hyperparameters, counters, spaces) "
                f"and the parameter groups {sorted(groups)}, never pickled objects"
                + (f": {advice}." if advice else ".")
            )
        tensors = {name: group.state_dict() for name, group in groups.items() if name not in exclude}
        if place is not None:
            tensors[ENV_PLACE] = place
        settings = {
            "agent": self.agent_name,
            "covey_version": __version__,
            "system_info": system_info(),
            "policy": self.policy_name,
            "policy_kwargs": _policy_kwargs_to_json(self.policy_kwargs),
            "hyperparameters": {k: v for k, v in self._hyperparameters_json().items() if k not in exclude},
            "observation_space": serialization.space_to_json(self.observation_space),
            "action_space": serialization.space_to_json(self.action_space),
            "n_envs": self.n_envs,
            "num_timesteps": self.num_timesteps,
            "total_timesteps": self._total_timesteps,
            "n_updates": self._n_updates,
            "current_progress_remaining": float(self._current_progress_remaining),
            "seed": self.seed,
            "verbose": self.verbose,
            "tensorboard_log": None if self.tensorboard_log is None else os.fspath(self.tensorboard_log),
            # The episode statistics, as SB3 keeps them: learn(reset_num_timesteps=False) after load goes on
            # with them (rollout/ep_rew_mean, time/episodes). An episode's numbers only (Monitor's r, l, t).
            "episode_num": int(self._episode_num),
            "ep_info_buffer": [
                {k: float(v) for k, v in ep.items() if isinstance(v, (int, float, np.number))}
                for ep in self.ep_info_buffer
            ],
            "ep_success_buffer": [bool(x) for x in self.ep_success_buffer],
            **extra_settings,
        }
        arguments = self._subclass_arguments()
        if arguments:
            settings["subclass_arguments"] = {k: v for k, v in arguments.items() if k not in exclude}
        serialization.save_model_file(path, settings, tensors)

    def _subclass_parameters(self) -> list[str]:
        """The names of a subclass's own constructor parameters: those covey's agent does not take."""
        own = next(c for c in type(self).__mro__ if c.__module__.startswith("covey."))
        if own is type(self):
            return []
        taken = set(inspect.signature(own.__init__).parameters)
        return [
            name
            for name, parameter in inspect.signature(type(self).__init__).parameters.items()
            if name not in taken and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        ]

    def _subclass_arguments(self) -> dict[str, Any]:
        """A subclass's own constructor arguments (those covey's agent does not take), read from the attributes of
        the same names, as SB3's file keeps a subclass's attributes; those JSON cannot hold are named in a warning
        (pass them to load again)."""
        out, left = {}, []
        for name in self._subclass_parameters():
            if not hasattr(self, name):
                left.append(name)
                continue
            value = getattr(self, name)
            try:
                if json.loads(json.dumps(value)) != value:
                    raise TypeError
            except (TypeError, ValueError):
                left.append(name)
                continue
            out[name] = value
        if left:
            warn_user(
                f"{type(self).__name__}'s constructor arguments {left} are not in the file: covey keeps a subclass's "
                "arguments where the model holds them as attributes of the same names, in values JSON holds. Pass "
                f"them to load again: {type(self).__name__}.load(path, {left[0]}=...)."
            )
        return out

    def _extra_settings(self, excluded: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Agent-specific settings to keep in the model file (JSON), but for the constructor arguments ``excluded``
        (``save``'s ``exclude``): here, whether ``policy`` names a user's SB3 policy class (which load takes from
        ``custom_objects``)."""
        return {"sb3_policy_class": True} if self._sb3_policy_class is not None else {}

    def _env_place(self) -> dict[str, Any] | None:
        """Where training left its env, as tensors: the last observations (SAC's originals too, behind a
        VecNormalize) and episode starts, which SB3 keeps in its file and ``load(..., force_reset=False)`` goes on
        from. None where there is none, or where going on needs more than them (recurrent memories, POCA's group
        env): those models start with a reset."""
        if self._last_obs is None or getattr(self, "recurrent", None) is not None:
            return None
        place = {"obs": _obs_tensors(self._last_obs)}
        if self._last_episode_starts is not None:
            place["episode_starts"] = torch.as_tensor(np.asarray(self._last_episode_starts, dtype=bool))
        original = getattr(self, "_last_original_obs", None)
        if original is not None:
            place["original_obs"] = _obs_tensors(original)
        return place

    def _go_on_from(self, place: dict[str, Any] | None) -> None:
        """Take up :meth:`_env_place`'s ``place`` with the env attached at load (``force_reset=False``)."""
        if place is None or self.env is None or self.env.num_envs != self.n_envs:
            warn_user(
                "load(..., force_reset=False): "
                + (
                    "the file holds no last observations to go on from (a recurrent or POCA model, or one saved "
                    "before any step)"
                    if place is None
                    else f"the env has {getattr(self.env, 'num_envs', 0)} copies, the file's observations are of "
                    f"{self.n_envs}"
                )
                + ", so training starts with a reset of the env."
            )
            return
        self._last_obs = _obs_arrays(place["obs"])
        if "episode_starts" in place:
            self._last_episode_starts = place["episode_starts"].numpy()
        if "original_obs" in place:
            self._last_original_obs = _obs_arrays(place["original_obs"])

    def _build_sb3_policy(self) -> Any:
        """The user's SB3 policy class (``_sb3_policy_class``) built as SB3's algorithms build it
        (:func:`covey.agents.sb3_policy.build_policy`)."""
        return build_policy(
            self._sb3_policy_class,
            self.observation_space,
            self.action_space,
            self.lr_schedule,
            self.config.use_sde,
            self.policy_kwargs,
            self.device,
        )

    @classmethod
    def _load_defaults(cls, env: Any, given: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments ``load`` takes for ``env`` unless ``given`` (POCA: an env instance is one copy); an
        error where ``given`` cannot hold with ``env``."""
        return {}

    @classmethod
    def _saved_arguments(cls, name: str, settings: dict[str, Any], given: set[str]) -> dict[str, Any]:
        """Constructor arguments that :meth:`_extra_settings` saved (of the file ``name``), for ``load`` to pass,
        but for those ``given`` (in ``custom_objects`` or as load's keywords), which are not read."""
        return {}

    def _restore_settings(self, settings: dict[str, Any]) -> None:
        """Read back what :meth:`_extra_settings` saved, before the networks are built."""

    def _loaded(self) -> None:
        """The last step of :meth:`load`, once the model is restored: a user's SB3 policy class draws its gSDE
        exploration matrices, as SB3's load ends (the same random draws as SB3's after it)."""
        if self._sb3_policy_class is not None and self.config.use_sde:
            self.policy.reset_noise()

    def _hyperparameters_json(self) -> dict[str, Any]:
        params = self._hyperparameters()
        progress = min(max(self._current_progress_remaining, 0.0), 1.0)
        for key in self.schedule_keys:
            value = params.get(key)
            if callable(value):
                params[key] = schedule_to_json(value, progress)
        return params

    @classmethod
    def _read_model_file(cls, path: str | os.PathLike | io.BufferedIOBase, device: torch.device | str) -> tuple:
        """``(settings, tensors)`` of a covey model file, or of an SB3 file of this agent read as one."""
        if sb3_files.is_sb3_file(serialization.zip_entry_names(path)):
            return sb3_files.read_sb3_model(path, cls.agent_name, cls.config_class)
        return serialization.load_model_file(path, device)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike | io.BufferedIOBase,
        env: Any = None,
        device: torch.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ):
        """Rebuild a saved agent; it predicts exactly as the saved one did.

        ``env`` (optional) must have the saved observation and action spaces. ``custom_objects``
        replaces saved settings (e.g. a learning-rate schedule, or a custom activation class);
        ``kwargs`` override hyperparameters. Loading never runs code from the file.
        """
        # Tensors are read onto the CPU and copied into the model, built on the device that it resolves
        # (some models run on the CPU only, whatever "auto" would pick).
        kwargs = {**cls._load_defaults(env, kwargs), **kwargs}
        settings, tensors = cls._read_model_file(path, "cpu")
        place = tensors.pop(ENV_PLACE, None)
        if print_system_info:
            current = system_info()
            print("== CURRENT SYSTEM INFO ==")
            print_versions(current, order=list(current))
            print("== SAVED MODEL SYSTEM INFO ==")
            saved = settings.get("system_info") or {"covey": settings.get("covey_version", "unknown")}
            print_versions(saved, order=list(current))
        agent = settings.get("agent")
        if agent != cls.agent_name:
            raise serialization.ModelFileError(
                f"The file holds a {agent} model; load it with covey.{agent}.load instead of {cls.__name__}.load."
            )
        custom_objects = dict(custom_objects or {})
        unread = [key for key in settings.get("unread", []) if key not in custom_objects and key not in kwargs]
        if unread:
            what = (
                f"The Stable-Baselines3 file pickled {', '.join(unread)} (a function, a class or an object), which "
                "covey never unpickles"
                if settings.get("sb3_file")
                else f"The file does not hold {', '.join(unread)}, which was of a kind covey's file cannot keep"
            )
            warn_user(
                f"{what}: the model takes covey's defaults for them. Pass them in custom_objects (or as load's "
                "keyword arguments) to set them."
            )
        hyper = dict(settings["hyperparameters"])
        stand_ins = {}  # schedules the file kept as a number only, and not given again
        for key, value in hyper.items():
            if isinstance(value, dict) and "schedule_value" in value:
                hyper[key] = schedule_from_json(value)
                if not callable(hyper[key]) and key not in custom_objects and key not in kwargs:
                    stand_ins[key] = hyper[key]
        # custom_objects' policy_kwargs go over the file's, key by key: an activation class the file could not
        # keep as code comes back beside the net_arch it kept.
        given = dict(custom_objects.pop("policy_kwargs", None) or {})
        policy_kwargs = {**_policy_kwargs_from_json(settings["policy_kwargs"], skip=given), **given}
        # Settings kept beside the hyperparameters: the seed as saved, the rest as SB3 leaves them unless
        # custom_objects or keyword arguments set them.
        outside = {
            "seed": settings.get("seed"),
            "tensorboard_log": settings.get("tensorboard_log"),
            "verbose": settings.get("verbose", 0),
            # given again in custom_objects or as keywords: the file's are not read
            **cls._saved_arguments(serialization.resolve_model_path(path)[0], settings, {*custom_objects, *kwargs}),
        }
        # a subclass's own arguments, where this class's constructor takes them (a file of a subclass loaded by
        # covey's agent finds the subclass's networks unknown, below)
        takes = set(inspect.signature(cls.__init__).parameters)
        hyper.update({k: v for k, v in (settings.get("subclass_arguments") or {}).items() if k in takes})
        settable = {*hyper, *outside, *settings.get("unread", [])}
        hyper.update({k: v for k, v in custom_objects.items() if k in settable})
        if "policy_kwargs" in kwargs:  # as SB3: taken where they are the file's, refused where they differ
            asked, stored = _as_lists(policy_kwargs_dict(kwargs.pop("policy_kwargs"))), _as_lists(policy_kwargs)
            # use_sde is the agent's argument (SB3's SAC also writes it into its policy_kwargs)
            differ = [key for key in asked if key != "use_sde" and (key not in stored or asked[key] != stored[key])]
            if differ:
                file_values = ", ".join(f"{key}={stored[key]!r}" if key in stored else f"no {key}" for key in differ)
                raise ValueError(
                    f"{cls.__name__}.load: policy_kwargs {', '.join(f'{k}={asked[k]!r}' for k in differ)} differ from "
                    f"the file's ({file_values}): the model's networks are the file's. Load without policy_kwargs; to "
                    "set one the file could not keep (an activation class of your own, say), pass "
                    "custom_objects={'policy_kwargs': {...}}."
                )
        # SB3 sets the attribute: the copies the model is to run (POCA's constructor takes n_envs itself)
        n_envs = kwargs.pop("n_envs", None) if "n_envs" not in takes else None
        if n_envs is not None:
            if whole_number(n_envs):
                n_envs = int(n_envs)
            if not positive_int(n_envs):
                raise ValueError(f"{cls.__name__}.load: n_envs={n_envs!r} is invalid: it must be an int >= 1.")
        # SB3 sets any keyword as an attribute; covey takes the constructor's (e.g. SAC's action_noise)
        constructor = set(inspect.signature(cls.__init__).parameters) - {"self", "policy", "env", "_init_setup_model"}
        unknown = sorted(set(kwargs) - set(hyper) - set(outside) - (constructor - {"device", "policy_kwargs"}))
        if unknown:
            raise ValueError(f"Unknown keyword arguments {unknown} for {cls.__name__}.load.")
        saved = {key: hyper.get(key) for key in ("batch_size", "n_steps")}
        hyper.update(kwargs)
        hyper = {**outside, **hyper}
        layout_changed = any(key in kwargs and kwargs[key] != value for key, value in saved.items())
        # As SB3: custom_objects' spaces stand for the file's (other bounds, say, of the same shapes: the
        # weights must fit them).
        spaces_given = {}
        for key in ("observation_space", "action_space"):
            given_space = custom_objects.get(key)
            if given_space is not None and not isinstance(given_space, spaces.Space):
                raise ValueError(f"custom_objects {key}={given_space!r} is invalid: pass a gymnasium space.")
            if given_space is None and settings[key].get("type") == serialization.UNREADABLE:
                raise serialization.ModelFileError(
                    f"{settings[key]['reason']} Pass the space if you know it: {cls.__name__}.load(path, "
                    f"custom_objects={{{key!r}: env.{key}}}), with the env the model was trained on."
                )
            spaces_given[key] = given_space or serialization.space_from_json(settings[key])
        observation_space, action_space = spaces_given["observation_space"], spaces_given["action_space"]
        check_observation_space(observation_space)
        check_action_space(action_space, cls.supported_action_spaces)
        policy, given_class = settings["policy"], custom_objects.get("policy_class")
        if sb3_policy_class(given_class, cls.agent_name) is not None and not settings.get("sb3_policy_class"):
            if not settings.get("sb3_file"):
                raise serialization.ModelFileError(
                    f"custom_objects policy_class={given_class.__name__}: the file holds covey's {settings['policy']} "
                    "networks, which a policy class cannot take. Load it without policy_class."
                )
            policy = given_class  # as SB3 builds it, with the SB3 file's weights (SB3's parameter names)
        if settings.get("sb3_policy_class"):  # a user's SB3 policy class, named in the file, never imported from it
            policy = given_class
            if not isinstance(policy, type):
                saved = settings["policy"]  # the class's path, or which module an SB3 file's class is of
                unnamed = saved.startswith("of the module")  # SB3 pickles the class without its name
                what, name = (
                    (f"a policy class {saved}", "<the class>")
                    if unnamed
                    else (f"the policy class {saved}", saved.rsplit(".", 1)[-1])
                )
                raise serialization.ModelFileError(
                    f"The model was trained with {what}, which covey does not import from a file. Pass the class: "
                    f"{cls.__name__}.load(path, custom_objects={{'policy_class': {name}}})."
                )
        # built quietly, as SB3's load builds its model: a file saved with verbose=1 does not print the device
        verbose = check_verbose(hyper.pop("verbose"))
        model = cls(
            policy=policy,
            env=None,
            policy_kwargs=policy_kwargs,
            device=device,
            _init_setup_model=False,
            verbose=0,
            **hyper,
        )
        model.verbose = verbose
        model.observation_space, model.action_space = observation_space, action_space
        model.n_envs = n_envs or getattr(model, "_requested_n_envs", None) or settings.get("n_envs", 1)
        model._restore_settings(settings)
        if env is not None:
            venv = model._fit_image_layout(model._wrap_env(env))
            if n_envs is not None and venv.num_envs != n_envs:
                raise ValueError(
                    f"{cls.__name__}.load: n_envs={n_envs}, but the env has {venv.num_envs} copies: the model runs "
                    "the env's copies. Drop n_envs, or pass an env with that many copies."
                )
            model._check_spaces(venv.observation_space, venv.action_space)
            model._attach_env(venv)
            model._last_obs = None
            if layout_changed or model.n_envs != settings.get("n_envs", 1):
                model._warn_batch_layout()  # the constructor's warning, where load's arguments changed the layout
        model._setup_model()
        # a copy's: the classes and settings of a user's policy's optimizers (one a script assigned, too)
        owners = optimizer_owners(model.policy)
        for path, (optimizer_class, settings_) in (custom_objects.get(_COPIED_OPTIMIZERS) or {}).items():
            owner = owners.get(path)
            if owner is not None and type(owner.optimizer) is not optimizer_class:
                owner.optimizer = optimizer_class(owner.parameters(), **settings_)
        model.set_parameters(tensors, exact_match=True, device=model.device)
        model.num_timesteps = int(settings.get("num_timesteps", 0))
        model._total_timesteps = int(settings.get("total_timesteps", 0))  # the last learn's, as SB3 keeps it
        model._n_updates = int(settings.get("n_updates", 0))
        model._episode_num = int(settings.get("episode_num", 0))
        model._current_progress_remaining = float(settings.get("current_progress_remaining", 1.0))
        model._schedule_stand_ins = stand_ins
        model.ep_info_buffer.extend(settings.get("ep_info_buffer", []))
        model.ep_success_buffer.extend(settings.get("ep_success_buffer", []))
        if env is not None and not force_reset:
            model._go_on_from(place)
        model._loaded()
        return model


class _TensorAttribute:
    """A tensor attribute a subclass's ``_get_torch_save_params`` names, as a parameter group: ``{"tensor": ...}``,
    loaded back in place (a parameter stays the object its optimizer holds)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"tensor": getattr(self.owner, self.name).detach().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        current, saved = getattr(self.owner, self.name), state["tensor"]
        if current.shape == saved.shape:
            with torch.no_grad():
                current.copy_(saved)
        else:
            setattr(self.owner, self.name, saved.clone().to(current.device))


def _as_lists(value: Any) -> Any:
    """``value`` with its tuples as lists, inside dicts and lists too (a model file keeps a tuple as a list)."""
    if isinstance(value, dict):
        return {key: _as_lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_lists(item) for item in value]
    return value


_COPIED_OPTIMIZERS = "_policy_optimizers"
"""The ``custom_objects`` key by which a copy (:func:`_rebuild_agent`) gives load the classes and settings of a user's
SB3 policy's optimizers, which a script may have replaced: the file's optimizer states are theirs."""


def check_verbose(verbose: Any) -> int:
    """``verbose`` as an int, or a ValueError naming the values it takes."""
    if not isinstance(verbose, (int, np.integer)) or verbose < 0:
        raise ValueError(f"verbose={verbose!r} is invalid: use 0 (quiet), 1 (training logs) or 2 (debug).")
    return int(verbose)


ENV_PLACE = "env_place"
"""The model file's entry (beside the parameter groups) of :meth:`BaseAgent._env_place`."""


def _obs_tensors(obs: Any) -> Any:
    """Observations (an array, or a dict of them) as tensors, for a model file."""
    if isinstance(obs, dict):
        return {key: torch.as_tensor(np.asarray(value)) for key, value in obs.items()}
    return torch.as_tensor(np.asarray(obs))


def _obs_arrays(obs: Any) -> Any:
    """:func:`_obs_tensors`' observations back as NumPy arrays."""
    if isinstance(obs, dict):
        return {key: value.numpy() for key, value in obs.items()}
    return obs.numpy()


def system_info() -> dict[str, str]:
    """The versions a model file records and ``load(..., print_system_info=True)`` prints."""
    import gymnasium
    import stable_baselines3

    return {
        "OS": f"{platform.platform()} {platform.version()}",
        "Python": platform.python_version(),
        "covey": __version__,
        "PyTorch": torch.__version__,
        "GPU Enabled": str(torch.cuda.is_available()),
        "Numpy": np.__version__,
        "Gymnasium": gymnasium.__version__,
        "Stable-Baselines3": stable_baselines3.__version__,
    }


def print_versions(info: dict[str, str], order: list[str]) -> None:
    """``info`` a line per entry, keys in ``order`` first (a file's JSON keeps them sorted)."""
    for key in sorted(info, key=lambda k: order.index(k) if k in order else len(order)):
        print(f"- {key}: {info[key]}")


def merge_parameter_groups(params: dict, into: str, modules: tuple[str, ...], renames: dict[str, str]) -> dict:
    """``params`` with the module groups ``modules`` (e.g. earlier files' ``actor`` and ``critic``) merged into
    one state dict ``into`` under their names as prefixes (``actor.trunk.0.weight``), and other groups renamed
    by ``renames``. A dict that already has ``into``, or none of ``modules``, only gets the renames."""
    merged: dict = {}
    out: dict = {}
    for name, state in params.items():
        if name in modules and into not in params:
            merged.update({f"{name}.{key}": value for key, value in state.items()})
        else:
            out[renames.get(name, name)] = state
    if merged:
        out[into] = merged
    return out


def _class_name(cls: type) -> str:
    for name, allowed in _ALLOWED_CLASSES.items():
        if allowed is cls:
            return name
    return class_path(cls)


def _policy_kwargs_to_json(policy_kwargs: dict) -> dict:
    """``policy_kwargs`` as the file's JSON: classes by name; a value JSON cannot hold (an array, a function, an
    object) by its type only, with a warning: load takes it back from ``custom_objects``."""
    out = {}
    for key, value in policy_kwargs.items():
        if isinstance(value, type):
            out[key] = {"class": _class_name(value)}
            continue
        value = serialization.plain_numbers(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            out[key] = {"unsaved": type(value).__name__}
            warn_user(
                f"policy_kwargs[{key!r}] (a {type(value).__name__}) is not in the model file, which holds JSON and "
                "never pickles: pass it again at load, custom_objects={'policy_kwargs': {"
                f"{key!r}: ...}}}} (the file's other policy_kwargs are kept)."
            )
        else:
            out[key] = value
    return out


def _policy_kwargs_from_json(data: dict, skip: dict) -> dict:
    """The file's policy_kwargs, its classes by name imported from the allowed ones (keys in ``skip`` left out)."""
    out = {}
    for key, value in data.items():
        if key in skip:
            continue
        if isinstance(value, dict) and set(value) == {"unsaved"}:
            raise serialization.ModelFileError(
                f"The model was saved with policy_kwargs[{key!r}], a {value['unsaved']}, which its file could not "
                f"hold. Pass it at load: custom_objects={{'policy_kwargs': {{{key!r}: ...}}}} (the file's other "
                "policy_kwargs are kept)."
            )
        if isinstance(value, dict) and set(value) == {"class"}:
            name = value["class"]
            if name not in _ALLOWED_CLASSES:
                raise serialization.ModelFileError(
                    f"The model was saved with policy_kwargs[{key!r}] = {name}, which covey does not import from "
                    f"a file. Pass it at load: custom_objects={{'policy_kwargs': {{{key!r}: <the class>}}}} "
                    "(the file's other policy_kwargs are kept)."
                )
            out[key] = _ALLOWED_CLASSES[name]
        else:
            out[key] = value
    return out


class PolicyAliases:
    """SB3's ``policy_aliases`` class attribute: ``{"MlpPolicy": ..., "CnnPolicy": ..., "MultiInputPolicy": ...}``,
    the policy classes of the module ``module`` (e.g. ``covey.ppo.policies``), imported when first read."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __get__(self, obj: Any, owner: type) -> dict[str, type]:
        policies = importlib.import_module(self.module)
        return {name: getattr(policies, name) for name in ("MlpPolicy", "CnnPolicy", "MultiInputPolicy")}


def _setting(name: str) -> property:
    """The model attribute of the config field ``name`` (see :attr:`BaseAgent.config_class`)."""

    def get(self: BaseAgent) -> Any:
        return getattr(self.config, name)

    def set(self: BaseAgent, value: Any) -> None:
        self._set_setting(name, value)

    return property(get, set, doc=f"The ``{name}`` hyperparameter (``model.config.{name}``).")


def _close_outputs(output_formats: list) -> None:
    """What ``Logger.close`` does, for a logger that is gone: its files and TensorBoard writer's thread."""
    for output in output_formats:
        output.close()


def _rebuild_agent(cls: type, snapshot: dict[str, Any]) -> BaseAgent:
    """The model :meth:`BaseAgent._snapshot` describes: loaded from its file, with its env attached as it was
    (not reset), its schedules and runtime state. The global random state is left as it was (a load reseeds)."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        given = {"policy_kwargs": snapshot.get("policy_kwargs") or {}}
        if snapshot.get("policy_class") is not None:
            given["policy_class"] = snapshot["policy_class"]
            given[_COPIED_OPTIMIZERS] = snapshot["policy_optimizers"]
        model = cls.load(
            io.BytesIO(snapshot["file"]),
            env=snapshot["env"],
            device=snapshot["device"],
            custom_objects=given,
            **snapshot.get("subclass_arguments", {}),
        )
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
    for key, schedule in snapshot["schedules"].items():
        setattr(model.config, key, schedule)
    model.__dict__.update(snapshot["runtime"])
    if snapshot["memories"] is not None:
        model.recurrent.actor_state, model.recurrent.critic_state = snapshot["memories"]
    if model.env is not None and _rebuilt_from_arguments(model.env):
        # Such an env is copied as a new one, made from its constructor's arguments and not reset: the episodes
        # the model was in are gone, so its next learn starts from a reset (as a loaded model's does).
        model._last_obs = None
    if getattr(model, "replay_buffer", None) is not None and hasattr(model.replay_buffer, "env"):
        model.replay_buffer.env = model.env  # hindsight replay asks the env for relabeled rewards
    return model


def _rebuilt_from_arguments(venv: Any) -> bool:
    """Whether an env of ``venv`` (SB3's VecEnvs and their wrappers, covey's group envs) pickles as Gymnasium's
    ``EzPickle`` does: by its constructor's arguments, so that a copy is a new env, not the one in mid-episode
    (mpe2's, PettingZoo's butterfly and sisl envs, Box2D's)."""
    while hasattr(venv, "venv"):  # VecNormalize, VecFrameStack, ...
        venv = venv.venv
    for env in getattr(venv, "envs", None) or []:
        for _ in range(64):  # down the wrapper chain: Gymnasium's .env, PettingZoo's .env and .aec_env
            if isinstance(env, EzPickle):
                return True
            inner = getattr(env, "env", None) or getattr(env, "aec_env", None)
            if inner is None or inner is env:
                break
            env = inner
    return False


def _policy_of_snapshot(cls: type, snapshot: dict[str, Any]) -> Any:
    """The policy of the model :func:`_rebuild_agent` rebuilds (a copied or unpickled policy)."""
    return _rebuild_agent(cls, snapshot).policy


def _schedule_setting(name: str) -> property:
    """The model attribute of the config field ``name`` in SB3's form: the schedule of the setting (None stays
    None). Setting it sets the config field, with the config's checks."""

    def get(self: BaseAgent) -> Any:
        value = getattr(self.config, name)
        return None if value is None else as_schedule(value)

    def set(self: BaseAgent, value: Any) -> None:
        self._set_setting(name, value)

    return property(get, set, doc=f"The ``{name}`` hyperparameter as a schedule (``model.config.{name}``).")


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as a plain dict (shallow: schedules stay callables)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def warn_batch_size(batch_size: int, buffer_size: int) -> None:
    """SB3's warning when minibatches do not tile the rollout."""
    if batch_size > buffer_size:
        warn_user(
            f"batch_size={batch_size} is larger than the rollout (n_steps * n_envs = {buffer_size}); "
            f"each epoch uses one minibatch of {buffer_size}. Lower batch_size or raise n_steps."
        )
    elif buffer_size % batch_size > 0:
        warn_user(
            f"batch_size={batch_size} does not divide the rollout (n_steps * n_envs = {buffer_size}): every "
            f"epoch ends with a truncated minibatch of {buffer_size % batch_size}. "
            f"Pick n_steps so that n_steps * n_envs is a multiple of batch_size."
        )
