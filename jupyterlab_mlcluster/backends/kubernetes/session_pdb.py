"""pdb on a Kubernetes session's rank: its prompt mirrored between the pod and the files
jobs/session_debug.py attends (issue 33 item 4).

A pod shares no files with the notebook. Its rank's pdb (runtime/pdb_relay.ChannelRelay)
says each record a local rank would append to its relay's `out` file as a signed report in
its pod log, naming a link (16 hex digits); here each goes into that file, and each line the
notebook (or `mlcluster session debug`) appends to the `in` file goes to the rank as a
signed `pdb_in` command over the session's channel. So the notebook's side is the same on
every backend:

- a live pause (`breakpoint()`, runtime/live_pause.py): its first record says where the rank
  paused; the pair of files is made here as a local rank makes it, under a hidden name in
  the running cell's job directory, then renamed `pause-<rank>-<link>`; its end (`c`, the
  cell's end) removes it;
- a post-mortem (`%distributed_debug`): its link is the name of the relay directory
  session_debug.py made in the session's own `debug/` directory, and only while the running
  cell is such a debugger's cell; the files there must be this user's private ones.

Nothing from the rank is trusted: a report is signed with the job's key (as all its reports
are), but its rank runs the user's code. The rank is the pod log's, never the record's; the
link only names a fresh directory or an existing debugger's; only the relay's record kinds
pass, re-written, their text cut to MAX_TEXT; a link's file stops growing at MAX_WRITTEN; a
rank has at most MAX_LINKS open. What is refused is said once in the session's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from ...runtime.live_pause import PREFIX
from ...runtime.pdb_relay import MAX_TEXT, open_private

LINK = re.compile(r"[0-9a-f]{16}")
MAX_WRITTEN = 16 << 20  # bytes of pdb output one link writes at most
MAX_LINKS = 2  # open at once per rank (a pause, and a post-mortem's)


class _Link:
    def __init__(self, rank: int, name: str, directory: str, live: bool):
        self.rank, self.name, self.directory, self.live = rank, name, directory, live
        self.out = open_private(os.path.join(directory, "out"), os.O_WRONLY | os.O_APPEND)
        try:
            self.typed = os.fdopen(open_private(os.path.join(directory, "in"), os.O_RDONLY), "rb")
        except BaseException:
            os.close(self.out)
            raise
        self.written = 0
        self.buffered = b""

    def write(self, record: dict[str, Any]) -> bool:
        """False once this link wrote its share."""
        data = json.dumps(record).encode() + b"\n"
        if self.written + len(data) > MAX_WRITTEN and not record.get("end"):
            return False
        self.written += len(data)
        os.write(self.out, data)
        return True

    def lines(self) -> list[str]:
        """The lines typed since last asked (each cut to MAX_TEXT)."""
        self.buffered += self.typed.read() or b""
        *done, self.buffered = self.buffered.split(b"\n")
        if len(self.buffered) > MAX_TEXT:  # (a line that never ends: cut, as it goes)
            done, self.buffered = [*done, self.buffered], b""
        return [line[:MAX_TEXT].decode(errors="replace") for line in done]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.out)
        self.typed.close()
        if self.live:  # (as the rank's own pause removes its directory)
            shutil.rmtree(self.directory, ignore_errors=True)


class PdbMirror:
    """The open links of one attempt's ranks. `send(rank, command)`: a signed command to
    the rank (the attempt's); `say(text)`: a line in the session's log."""

    def __init__(
        self,
        store: Any,
        holder_id: str,
        send: Callable[[int, dict[str, Any]], None],
        say: Callable[[str], None],
    ):
        self.store, self.holder_id, self.send, self.say = store, holder_id, send, say
        self.links: dict[tuple[int, str], _Link] = {}
        self.refused: set[tuple[int, str]] = set()  # (rank, why): said once

    def take(self, rank: int, value: dict[str, Any], cell_id: str | None) -> None:
        """A `pdb` report of rank `rank` (its pod log's) while cell `cell_id` runs."""
        name, record = value.get("link"), _clean(value.get("record"), rank)
        if cell_id is None:
            return self._refuse(rank, "pdb output outside a cell")
        if not isinstance(name, str) or not LINK.fullmatch(name) or record is None:
            return self._refuse(rank, "a pdb report that is not the relay's")
        link = self.links.get((rank, name))
        if link is None:
            if sum(1 for r, _ in self.links if r == rank) >= MAX_LINKS:
                return self._refuse(rank, f"more than {MAX_LINKS} pdb links at once")
            try:
                if value.get("post_mortem") is True:
                    link = self._post_mortem(rank, name, cell_id)
                elif "paused" in record:
                    link = self._pause(rank, name, cell_id, record)
                else:
                    return self._refuse(rank, "a pdb link that did not begin with a pause")
            except (OSError, ValueError) as exc:
                return self._refuse(rank, f"a pdb link ({exc})")
            self.links[(rank, name)] = link
            if link.live:
                return  # (its first record is in its file already)
        if not link.write(record):
            self._refuse(rank, f"pdb output over {MAX_WRITTEN >> 20} MiB")
        if record.get("end"):
            self._close(link)

    def poll(self) -> None:
        """Forward what was typed since."""
        for link in list(self.links.values()):
            try:
                lines = link.lines()
            except (OSError, ValueError):
                lines = []
            for line in lines:
                self.send(link.rank, {"type": "pdb_in", "link": link.name, "line": line})

    def close_all(self) -> None:
        for link in list(self.links.values()):
            self._close(link)

    def _close(self, link: _Link) -> None:
        self.links.pop((link.rank, link.name), None)
        link.close()

    def _pause(self, rank: int, name: str, cell_id: str, record: dict[str, Any]) -> _Link:
        job_dir = str(self.store.job_dir(cell_id))
        staging = os.path.join(job_dir, f".{PREFIX}{rank}-{name}")
        directory = os.path.join(job_dir, f"{PREFIX}{rank}-{name}")
        os.mkdir(staging, 0o700)  # (FileExistsError: a link's name used twice)
        try:
            for part in ("in", "out"):
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW
                os.close(os.open(os.path.join(staging, part), flags, 0o600))
            with open(os.path.join(staging, "out"), "ab") as out:
                out.write(json.dumps(record).encode() + b"\n")
            os.rename(staging, directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return _Link(rank, name, directory, live=True)

    def _post_mortem(self, rank: int, name: str, cell_id: str) -> _Link:
        if not self.store.get_job(cell_id).origin.get("debug_of"):
            raise ValueError("a post-mortem's output in a cell that is no debugger's")
        directory = str(self.store.job_dir(self.holder_id) / "debug" / name)
        return _Link(rank, name, directory, live=False)

    def _refuse(self, rank: int, why: str) -> None:
        if (rank, why) not in self.refused:
            self.refused.add((rank, why))
            self.say(f"[mlcluster] refused rank {rank}'s {why}")


def _clean(record: Any, rank: int) -> dict[str, Any] | None:
    """The relay's record, re-written: one known kind, its text cut; None if none."""
    if not isinstance(record, dict) or len(record) != 1:
        return None
    kind, value = next(iter(record.items()))
    if kind in ("out", "error", "resumed") and isinstance(value, str):
        return {kind: value[:MAX_TEXT]}
    if kind in ("ask", "end") and value is True:
        return {kind: True}
    if kind == "paused" and isinstance(value, dict) and isinstance(value.get("where"), str):
        return {"paused": {"rank": rank, "where": value["where"][:200]}}
    return None
