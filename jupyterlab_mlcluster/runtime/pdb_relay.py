"""pdb's stdin and stdout on a session's rank, over two private files: a post-mortem's
(debugger.relay_post_mortem) and a paused rank's (live_pause.py); jobs/session_debug.py is
the other end. A pod's rank shares no files with the notebook: its `ChannelRelay` says the
same records on its report channel (its pod log) and takes the lines typed from the
session's channel; its supervisor mirrors both into such a pair of files
(backends/kubernetes/session_pdb.py)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import stat
import threading
import time
from typing import Any

from . import reporting

POLL = 0.05  # how often the rank looks for the next line typed
IDLE_LIMIT = 1800.0  # nobody typed for this long: pdb ends, and the rank goes on
MAX_TEXT = 32 * 1024  # one record's text (a longer print goes in several); one typed line


class Relay:
    """pdb's stdin and stdout: what it prints goes out as records ({"out": text}, {"ask":
    true} when it waits for a line, {"error": text}, {"end": true}); a subclass says how
    records go out (`send`) and how a typed line comes in (`typed`)."""

    idle_limit: float = IDLE_LIMIT

    def send(self, **record: Any) -> None:
        raise NotImplementedError

    def typed(self, deadline: float) -> str | None:
        """The next line typed, without its newline; None once `deadline` has passed."""
        raise NotImplementedError

    def write(self, text: str) -> int:
        if text:
            self.send(out=text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        """The next line typed; "" (pdb's end of input) once nobody typed for the limit."""
        self.send(ask=True)
        line = self.typed(time.monotonic() + self.idle_limit)
        if line is None:
            self.send(out=f"\nnothing typed for {self.idle_limit:g} s: leaving pdb\n")
            return ""
        return line + "\n"


class FileRelay(Relay):
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

    def typed(self, deadline: float) -> str | None:
        while b"\n" not in self.buffered:
            chunk = self.lines.read()
            if chunk:
                self.buffered += chunk
                continue
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL)
        line, _, self.buffered = self.buffered.partition(b"\n")
        return line.decode(errors="replace")

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


# The channel relays open on this rank (link -> the lines typed for it): the session
# channel's reading thread delivers to them (session_channel.py).
_LINKS: dict[str, queue.SimpleQueue[str]] = {}
_LINKS_LOCK = threading.Lock()


class ChannelRelay(Relay):
    """pdb's stdin and stdout for a pod's rank: each record FileRelay would write goes out
    as a signed report, {"type": "pdb", "link": link, "post_mortem": bool, "record": ...};
    a line typed comes as a signed `pdb_in` command naming the link (`deliver`)."""

    def __init__(self, link: str | None = None, *, post_mortem: bool = False):
        self.link, self.post_mortem = link or secrets.token_hex(8), post_mortem
        self.idle_limit = IDLE_LIMIT
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        with _LINKS_LOCK:
            _LINKS[self.link] = self.lines

    def send(self, **record: Any) -> None:
        text = record.get("out")
        if isinstance(text, str) and len(text) > MAX_TEXT:
            for start in range(0, len(text), MAX_TEXT):
                self.send(out=text[start : start + MAX_TEXT])
            return
        report = {"type": "pdb", "link": self.link, "post_mortem": self.post_mortem}
        if not reporting.send({**report, "record": record}):
            raise OSError("this rank has no report channel: pdb's prompt cannot reach it")

    def typed(self, deadline: float) -> str | None:
        while True:
            try:  # (in slices: the cell's interrupt raises here between two)
                return self.lines.get(timeout=min(1.0, self.idle_limit))
            except queue.Empty:
                if time.monotonic() > deadline:
                    return None

    def close(self) -> None:
        with _LINKS_LOCK:
            _LINKS.pop(self.link, None)
        with contextlib.suppress(OSError):
            self.send(end=True)


def deliver(link: Any, line: Any) -> None:
    """A line typed for the relay `link` (an authentic command's); one for no open relay
    (pdb left meanwhile) is dropped."""
    if not isinstance(line, str) or not isinstance(link, str):
        return
    with _LINKS_LOCK:
        typed = _LINKS.get(link)
    if typed is not None:
        typed.put(line[:MAX_TEXT].replace("\n", " "))
