"""The on-disk format of a job's log files, and reading it.

One file per rank (`logs/<rank>.log`), appended to by the supervisor only. Each line is
`<unix time with µs> <stream> <text>\n`, stream being o(ut), e(rr) or s(ystem: restarts,
kills). A cursor is `rank:byte offset,...`: where each rank's reader stopped, always just
after a newline, so a reader never sees half a line.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any, BinaryIO


def parse_cursor(cursor: str | None) -> dict[int, int]:
    offsets: dict[int, int] = {}
    if not cursor:
        return offsets
    for part in str(cursor).split(","):
        rank, sep, offset = part.partition(":")
        if not sep:
            raise ValueError(f"since must be a cursor returned by a previous call, got {cursor!r}")
        try:
            offsets[int(rank)] = max(0, int(offset))
        except ValueError:
            raise ValueError(
                f"since must be a cursor returned by a previous call, got {cursor!r}"
            ) from None
    return offsets


def format_cursor(offsets: dict[int, int]) -> str:
    return ",".join(f"{r}:{o}" for r, o in sorted(offsets.items()))


_STREAMS = {b"o": "stdout", b"e": "stderr", b"s": "system"}


def parse_log_line(raw: bytes, rank: int) -> dict[str, Any] | None:
    ts, _, rest = raw.partition(b" ")
    stream, _, text = rest.partition(b" ")
    try:
        when = float(ts)
    except ValueError:
        return None
    return {
        "rank": rank,
        "_ts": when,
        "stream": _STREAMS.get(stream, "stdout"),
        "line": text.decode("utf-8", "replace"),
    }


def format_log_line(ts: float, stream: str, text: str) -> bytes:
    """One stored log line. `stream` is 'o', 'e' or 's' (system: restarts, kills)."""
    return f"{ts:.6f} {stream} ".encode() + text.encode("utf-8", "replace") + b"\n"


# Why a byte cap: a tail is for a monitor attaching late, which reads at most a few MiB
# anyway (Store.read_logs' budget); scanning further back in a huge log only costs time.
TAIL_MAX_BYTES = 16 * 1024 * 1024
_TAIL_BLOCK = 65536


def tail_offset(f: BinaryIO, lines: int, max_bytes: int | None = TAIL_MAX_BYTES) -> int:
    """The offset where the last `lines` lines of `f` begin (0 if it has no more).

    A line is counted by its newline: the offset is just after the (lines+1)th newline from
    the end, so a partial last line (a writer mid-line) rides along uncounted. The file is
    read backwards block by block and each block's newlines are counted once. At most
    `max_bytes` (None: no cap) are scanned: past that, the tail starts just after the first
    newline inside the scanned window (the end of the file if there is none), a line start.
    """
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if lines <= 0:
        return size
    limit = 0 if max_bytes is None else max(0, size - max_bytes)
    needed = lines + 1  # newlines from the end; the last one ends the last counted line
    pos = size
    earliest = -1  # the first newline in the window seen so far (absolute offset)
    while pos > limit:
        step = min(_TAIL_BLOCK, pos - limit)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        count = block.count(b"\n")
        if count >= needed:
            idx = len(block)
            for _ in range(needed):
                idx = block.rindex(b"\n", 0, idx)
            return pos + idx + 1
        needed -= count
        if count:
            earliest = pos + block.index(b"\n")
    if limit == 0:
        return 0
    return earliest + 1 if earliest >= 0 else size


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def iso_us(ts: float) -> str:
    """RFC 3339 with microseconds; the per-second part is cached (logs are read in bulk)."""
    second = int(ts)
    return f"{_iso_second(second)}.{round((ts - second) * 1e6) % 1000000:06d}Z"
