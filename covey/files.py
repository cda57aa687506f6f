"""Files written whole or not at all: a temporary file beside the target, then a rename."""

from __future__ import annotations

import io
import os
import pathlib
import stat
import tempfile
from collections.abc import Callable
from typing import Any


def final_path(target: str | os.PathLike) -> pathlib.Path:
    """The file a write to ``target`` replaces: where a symbolic link points (the link stays a link), or
    ``target`` itself."""
    target = pathlib.Path(target)
    return pathlib.Path(os.path.realpath(target)) if target.is_symlink() else target


def temporary_file(target: pathlib.Path) -> tuple[int, str]:
    """``(fd, path)`` of a new temporary file next to ``target``, to be renamed over it, with the permissions of
    the file it replaces, or else those a file made by ``open`` gets (``tempfile.mkstemp`` makes it readable by
    its owner alone)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:  # no file there yet
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    return fd, tmp


def write_atomically(
    target: pathlib.Path, write: Callable[[Any], None], before_replace: Callable[[str], None] | None = None
) -> None:
    """``write(file)`` into a temporary file next to ``target`` (folders made as needed), synced to disk, then
    renamed over ``target``: a crash or a full disk never leaves a half-written file under that name, and the
    previous file (if any) stays untouched. A symbolic link at ``target`` stays, and its file is replaced.
    ``before_replace(path)`` gets the temporary file, complete and closed, before the rename (an ONNX export
    is verified there); an exception from it leaves the previous file as it was."""
    target = final_path(target)
    if target.is_dir():
        raise IsADirectoryError(f"Cannot write {target}: it is a folder. Name a file to write.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = temporary_file(target)
    except (FileExistsError, NotADirectoryError) as err:  # a file where a folder of the path should be
        blocking = next((p for p in reversed(target.parents) if p.exists() and not p.is_dir()), err.filename)
        raise NotADirectoryError(f"Cannot write {target}: {blocking} is a file, not a folder.") from err
    except OSError as err:  # named by the file asked for, not the temporary one beside it (a read-only folder)
        raise type(err)(
            err.errno,
            f"Cannot write {target}: {err.strerror} (creating a file in {target.parent}). Saves write a new file "
            "beside the target and rename it over the target, so that a crash never leaves half a file: give "
            "this folder write access, or save to another folder.",
        ) from err
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomically(target: pathlib.Path, text: str) -> None:
    """A text file written as :func:`write_atomically` writes: never half-written."""
    write_atomically(target, lambda f: f.write(text.encode()))


def require_binary(file: Any, doing: str) -> None:
    """A TypeError naming the fix where ``file``, a file object given in place of a path, was opened in text mode
    (``open(path, "w")``): model and buffer files are bytes."""
    if isinstance(file, io.TextIOBase):
        raise TypeError(
            f"Cannot {doing} a file opened in text mode ({file!r}): open it in binary mode (open(path, 'wb') to "
            "save, 'rb' to load), or pass the path."
        )
