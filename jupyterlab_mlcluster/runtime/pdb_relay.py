"""pdb's stdin and stdout on a session's rank, over two private files: a post-mortem's
(debugger.relay_post_mortem) and a paused rank's (live_pause.py); jobs/session_debug.py is
the other end."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from typing import Any

POLL = 0.05  # how often the rank looks for the next line typed
IDLE_LIMIT = 1800.0  # nobody typed for this long: pdb ends, and the rank goes on


class FileRelay:
    """pdb's stdin and stdout for a session's rank: what it prints goes to `out` as JSON
    lines ({"out": text}, {"ask": true} when it waits for a line, {"error": text},
    {"end": true}); what is typed comes as lines appended to `lines`. Both files were made
    by their owner, this rank's user, in a directory only that user can enter."""

    def __init__(self, directory: str, idle_limit: float = IDLE_LIMIT):
        self.out = open_private(os.path.join(directory, "out"), os.O_WRONLY | os.O_APPEND)
        self.lines = os.fdopen(open_private(os.path.join(directory, "in"), os.O_RDONLY), "rb")
        self.idle_limit, self.buffered = idle_limit, b""

    def send(self, **record: Any) -> None:
        os.write(self.out, json.dumps(record).encode() + b"\n")

    def write(self, text: str) -> int:
        if text:
            self.send(out=text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        """The next line typed; "" (pdb's end of input) once nobody typed for the limit."""
        self.send(ask=True)
        deadline = time.monotonic() + self.idle_limit
        while b"\n" not in self.buffered:
            chunk = self.lines.read()
            if chunk:
                self.buffered += chunk
                continue
            if time.monotonic() > deadline:
                self.send(out=f"\nnothing typed for {self.idle_limit:g} s: leaving pdb\n")
                return ""
            time.sleep(POLL)
        line, _, self.buffered = self.buffered.partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(end=True)
        with contextlib.suppress(OSError):
            os.close(self.out)
        self.lines.close()


def open_private(path: str, flags: int) -> int:
    """`path`, only if it is a plain file of this user that nobody else may write (whoever
    writes the typed lines drives pdb: runs code as this user)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(f"{path}: not a private file of this user; no debugger")
    return fd
