"""Which Gymnasium spaces covey supports, and checks that say so clearly at the boundary."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

OBS_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Dict)
ACTION_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_observation_space(space: spaces.Space) -> None:
    """Raise a ValueError naming ``space`` when covey cannot encode it."""
    if isinstance(space, spaces.Dict):
        if not space.spaces:
            raise ValueError("The observation space is an empty Dict: the policy would observe nothing. Give it keys.")
        for key, sub in space.spaces.items():
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
            "(e.g. gymnasium.wrappers.FlattenObservation for Tuple spaces) or pad variable-size "
            "observations (Graph, Sequence, Text) to a fixed-size Box."
        )


def check_action_space(space: spaces.Space, supported: tuple[type, ...] = ACTION_SPACES) -> None:
    """Raise a ValueError naming ``space`` when it is not one of ``supported``."""
    if not isinstance(space, supported):
        names = ", ".join(cls.__name__ for cls in supported)
        raise ValueError(f"Unsupported action space {space}. This agent supports: {names}.")
    if isinstance(space, spaces.Box) and not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        # Gaussian policies are clipped to the bounds: infinite bounds mean the env gets any float.
        if not np.all(np.isfinite(space.low)) and not np.all(np.isfinite(space.high)):
            return
        raise ValueError(
            f"Box action space {space} has some infinite and some finite bounds; "
            "give every dimension finite bounds (or make all of them infinite)."
        )


def is_image_space(space: spaces.Space) -> bool:
    """A uint8 Box with 3 dimensions and bounds [0, 255], with the smallest dimension first or last."""
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
