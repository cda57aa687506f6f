"""Which Gymnasium spaces covey supports, and checks that say so clearly at the boundary."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from torch import nn

from covey.warning import warn_user

OBS_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Dict)
ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_observation_space(space: spaces.Space) -> None:
    """Raise a ValueError naming ``space`` when covey cannot encode it."""
    if isinstance(space, spaces.Dict):
        if not space.spaces:
            raise ValueError("The observation space is an empty Dict: the policy would observe nothing. Give it keys.")
        for key, sub in space.spaces.items():
            problem = _key_problem(key)
            if problem is not None:
                raise ValueError(
                    f"The Dict observation space's key {key!r} cannot name a network module ({problem}): each key "
                    "gets its own encoder under its name, as in SB3. Rename the key with an observation wrapper "
                    "(keys are non-empty strings without '.', other than torch.nn.ModuleDict's attribute names "
                    "such as 'type', 'to' or 'train')."
                )
            if isinstance(sub, spaces.Dict):
                raise ValueError(
                    f"Nested Dict observation spaces are not supported (key {key!r}). "
                    "Flatten the nesting with a wrapper so that every value is a Box, Discrete, "
                    "MultiDiscrete or MultiBinary space."
                )
            check_observation_space(sub)
        return
    if not isinstance(space, OBS_SPACES):
        raise ValueError(
            f"Unsupported observation space {space}. covey supports Box, Discrete, MultiDiscrete, "
            "MultiBinary and Dict of these. Convert it with a wrapper "
            "(e.g. gymnasium.wrappers.FlattenObservation for Tuple spaces; for a PettingZoo env "
            "supersuit.observation_lambda_v0(env, lambda obs, space: gymnasium.spaces.flatten(space, obs), "
            "gymnasium.spaces.flatten_space)) or pad variable-size observations (Graph, Sequence, Text) to a "
            "fixed-size Box."
        )


def warn_unmasked_actions(space: spaces.Space) -> None:
    """Warn where a Dict observation holds an ``action_mask`` (PettingZoo's and Gymnasium's name for the legal
    actions): covey's policies do not mask, so the key is one more input and masked actions can be drawn."""
    if isinstance(space, spaces.Dict) and "action_mask" in space.spaces:
        warn_user(
            "The observations hold an 'action_mask', but covey's policies do not mask actions: the mask is read as "
            "one more input and actions it forbids can be chosen. Make forbidden actions harmless in the env (e.g. "
            "a no-op), or use a library with masked policies (sb3_contrib's MaskablePPO)."
        )


def warn_masking_env(env: Any) -> None:
    """Warn where a VecEnv's envs have an ``action_masks()`` method (sb3_contrib's ``ActionMasker`` adds one, and
    its MaskablePPO reads it): covey's policies never call it, so the actions it forbids can be chosen. Only SB3's
    own VecEnvs are asked, whose ``has_attr`` answers without harm (a Gymnasium AsyncVectorEnv raises the missing
    attribute in its workers and is broken afterwards)."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    # SB3's unwrapped: the vector env below its VecEnvWrappers (covey's FastVecEnv is a DummyVecEnv)
    if not isinstance(getattr(env, "unwrapped", env), (DummyVecEnv, SubprocVecEnv)):
        return
    try:
        masking = bool(env.has_attr("action_masks"))
    except Exception:  # envs that fail to answer: nothing to say
        return
    if masking:
        warn_user(
            "The env has an action_masks() method (sb3_contrib's ActionMasker), but covey's policies do not mask "
            "actions: the masks are never read and actions they forbid can be chosen. Make forbidden actions "
            "harmless in the env (e.g. a no-op), or train with sb3_contrib's MaskablePPO."
        )


def _key_problem(key: object) -> str | None:
    """Why a Dict observation key cannot name an encoder in a ``torch.nn.ModuleDict``, or None."""
    if not isinstance(key, str):
        return f"of type {type(key).__name__}, not a string"
    try:
        nn.ModuleDict({key: nn.Identity()})
    except (KeyError, TypeError) as exc:
        return str(exc.args[0]) if exc.args else type(exc).__name__
    return None


def check_action_space(space: spaces.Space, supported: tuple[type, ...] = ACTION_SPACES) -> None:
    """Raise a ValueError naming ``space`` when it is not one of ``supported``. A Box may have infinite bounds:
    Gaussian actions are clipped to the bounds dimension by dimension, and an infinite bound leaves its side free
    (agents that squash their actions check :func:`check_finite_bounds` too)."""
    if not isinstance(space, supported):
        names = ", ".join(cls.__name__ for cls in supported)
        hint = ""
        if isinstance(space, (spaces.Dict, spaces.Tuple)):
            parts = (
                "Discrete parts as one MultiDiscrete, Box parts as one Box"
                if spaces.MultiDiscrete in supported
                else "Box parts as one Box (this agent takes one Box or one Discrete; PPO takes Discrete parts as "
                "one MultiDiscrete)"
            )
            hint = (
                f" Wrap the env so that its {type(space).__name__} of actions is one space, and split each action "
                f"back into its parts there: {parts}."
            )
        raise ValueError(f"Unsupported action space {space}. This agent supports: {names}.{hint}")
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)) and int(np.prod(space.shape)) == 0:
        raise ValueError(
            f"The action space {space} holds no numbers (a dimension of size 0): there is no action to learn. Give "
            "the env an action space of one number or more."
        )


def check_finite_bounds(space: spaces.Space, needs: str) -> None:
    """Raise a ValueError when ``space`` is a Box action space with an infinite bound, which ``needs`` (what
    scales actions to the bounds, in words) cannot take."""
    if isinstance(space, spaces.Box) and not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        shape = tuple(space.shape)
        raise ValueError(
            f"{needs} needs finite Box action bounds (its actions are squashed into [-1, 1] and scaled to them), "
            f"got {space}. Declare the bounds the env's actions should keep to, e.g. "
            f"gymnasium.wrappers.TransformAction(env, lambda a: a, gymnasium.spaces.Box(-1.0, 1.0, {shape})) "
            "(ClipAction and RescaleAction do not: ClipAction's own space is unbounded)."
        )


def is_image_space(space: spaces.Space) -> bool:
    """A uint8 Box with 3 dimensions and bounds [0, 255] (which dimension holds the channels is not checked, as
    in SB3's default check)."""
    return (
        isinstance(space, spaces.Box)
        and len(space.shape) == 3
        and space.dtype == np.uint8
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` (3 dims) stores its channels last: the channel axis is the smallest."""
    return int(np.argmin(shape)) == 2 and shape[2] < shape[0]


def match_image_axes(obs: np.ndarray, space: spaces.Space) -> np.ndarray:
    """An image given in the other channel order than the space's (HWC vs CHW) is transposed to match, as SB3's
    ``predict`` transposes one. Only for image spaces (uint8, 0-255): another 3-D Box's axes mean what the env
    says, and an array of its axes in another order is refused as SB3 refuses it, not reordered."""
    if not is_image_space(space) or obs.shape[-3:] == space.shape:
        return obs
    a, b, c = space.shape
    if obs.shape[-3:] == (c, a, b):  # CHW given, HWC expected
        return np.moveaxis(obs, -3, -1)
    if obs.shape[-3:] == (b, c, a):  # HWC given, CHW expected
        return np.moveaxis(obs, -1, -3)
    return obs


def same_space(ours: spaces.Space, theirs: spaces.Space) -> bool:
    """Whether two spaces are the same, as ``==`` tells, but where a Box bound is the dtype's largest number on
    one side and infinite on the other (the same sign), as one: both leave the value unbounded. Gymnasium before
    1.0 bounded CartPole's velocities at float32's largest, which it now writes as inf."""
    if ours == theirs:
        return True
    if isinstance(ours, spaces.Dict) and isinstance(theirs, spaces.Dict):
        return list(ours.spaces) == list(theirs.spaces) and all(
            same_space(ours[key], theirs[key]) for key in ours.spaces
        )
    if not (isinstance(ours, spaces.Box) and isinstance(theirs, spaces.Box)):
        return False
    if ours.shape != theirs.shape or ours.dtype != theirs.dtype or ours.dtype.kind != "f":
        return False
    largest = np.finfo(ours.dtype).max

    def unbounded(bound: np.ndarray) -> np.ndarray:
        return np.sign(bound) * (np.abs(bound) >= largest)

    return all(
        np.all((a == b) | ((unbounded(a) == unbounded(b)) & (unbounded(a) != 0)))
        for a, b in ((ours.low, theirs.low), (ours.high, theirs.high))
    )


def space_mismatch_advice(ours: spaces.Space, theirs: spaces.Space) -> str:
    """What to do about an env whose space is not the model's: where only a Box's bounds differ, the weights fit
    the env's space, which ``load``'s ``custom_objects`` can give the model."""
    box = isinstance(ours, spaces.Box) and isinstance(theirs, spaces.Box)
    if (
        box
        and is_image_space(ours)
        and is_image_space(theirs)
        and channels_last(ours.shape) != channels_last(theirs.shape)
    ):
        h, w, c = ours.shape if channels_last(ours.shape) else (*ours.shape[1:], ours.shape[0])
        if theirs.shape in ((c, h, w), (h, w, c)):
            move = "0, -1" if channels_last(ours.shape) else "-1, 0"
            return (
                f"The env's images keep their channels on the other side ({theirs.shape}) of the model's "
                f"({ours.shape}): move them in the env, e.g. with SuperSuit's observation_lambda_v0(env, lambda obs, "
                f"space: np.moveaxis(obs, {move}), lambda space: gymnasium.spaces.Box(0, 255, {ours.shape}, np.uint8))."
            )
    if box and (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype):
        return (
            "Only the bounds differ: if the model should act in this env anyway, load it with the env's space, "
            "load(path, env=env, custom_objects={'observation_space': env.observation_space, 'action_space': "
            "env.action_space})."
        )
    return "Use an env with the space the model was trained on."
