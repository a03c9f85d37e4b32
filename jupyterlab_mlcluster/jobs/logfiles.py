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
from typing import Any


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


def tail_offset(f, lines: int) -> int:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if lines <= 0:
        return size
    block, pos, found, data = 65536, size, 0, b""
    while pos > 0 and found <= lines:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
        found = data.count(b"\n")
    if found <= lines:
        return 0
    # offset just after the (found - lines)th newline counted from the start of `data`
    idx = -1
    for _ in range(found - lines):
        idx = data.index(b"\n", idx + 1)
    return pos + idx + 1


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def iso_us(ts: float) -> str:
    """RFC 3339 with microseconds; the per-second part is cached (logs are read in bulk)."""
    second = int(ts)
    return f"{_iso_second(second)}.{int(round((ts - second) * 1e6)) % 1000000:06d}Z"
