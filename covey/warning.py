"""Warnings that name the user's line.

A warning about what a user passed or did belongs at the user's line that reached covey (``PPO(...)``,
``model.save(...)``), as an error's traceback ends there. A fixed ``stacklevel`` names the right frame from one
call path only: the same check runs from a constructor, from ``load`` and from ``set_env``, at different depths.
:func:`warn_user` counts the frames instead.
"""

from __future__ import annotations

import os
import sys
import warnings

PACKAGE = os.path.dirname(os.path.abspath(__file__))
"""covey's package folder: frames whose code lies under it are covey's own."""


def stacklevel_outside_covey() -> int:
    """The ``stacklevel`` at which ``warnings.warn``, called by the caller of this function, names the first frame
    outside covey's package: the user's line that reached covey (SB3's, where SB3 called covey)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the first line outside covey."""
    warnings.warn(message, category, stacklevel=stacklevel_outside_covey())
