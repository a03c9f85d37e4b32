"""Writing a file whole or not at all: the package's one temporary-file-and-rename."""

from __future__ import annotations

import contextlib
import os


def temporary_name(path: str) -> str:
    """The name `write_whole` writes `path` under first, in this process."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{os.getpid()}.tmp")


def write_whole(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o600) -> None:
    """`path` holds all of `data` or is untouched: written to a temporary file beside it (this
    process's, never followed through a link, `mode` from the start, 0600 unless said) that
    replaces it in one rename. A failed write (a full disk) leaves no temporary file behind
    to keep the disk full."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    if isinstance(data, str):
        data = data.encode()
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, mode), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
