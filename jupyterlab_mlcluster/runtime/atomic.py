"""Writing a file whole or not at all: the package's one temporary-file-and-rename."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# What `temporary_name` gives, for any file and process.
_TEMPORARY_GLOB = ".*.[0-9]*.tmp"


def temporary_name(path: str) -> str:
    """The name `write_whole` writes `path` under first, in this process."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}.tmp")


def write_whole(
    path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o600, replace: bool = True
) -> None:
    """`path` holds all of `data` or is untouched: written to a temporary file beside it (this
    process's, never followed through a link, `mode` from the start, 0600 unless said) that
    replaces it in one rename. A failed write (a full disk) leaves no temporary file behind
    to keep the disk full. `replace=False`: a file already at `path` is kept and
    FileExistsError raised (the first writer of several wins)."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    if isinstance(data, str):
        data = data.encode()
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, mode), "wb") as f:
            f.write(data)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails, never overwrites, when `path` exists
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def drop_leftovers(directory: str | os.PathLike[str]) -> None:
    """Remove from `directory` what writers killed between their write and their rename left
    (any process's temporary files): garbage that would keep a full disk full. Only once no
    writer of the directory is left."""
    with contextlib.suppress(OSError):
        for path in Path(directory).glob(_TEMPORARY_GLOB):
            with contextlib.suppress(OSError):
                path.unlink()
