"""Pod logs: followed while they are written, split into each rank's lines and reports.

In a pod, stdout is a rank's only channel: its control records (started, progress, result,
error, metrics; see runtime/protocol.py) travel inline behind a marker. Each pod's log is
followed (`follow=true`) into the supervisor's event queue by the process's one event loop
for log streams (log_loop.py); a `PodOutput` turns those bytes into (rank, item) pairs: text
lines go to the job store as they come (so they outlive the pod), control records drive the
rank's state, result and error files.

Resuming (a reconnect, or a new supervisor adopting a job): the log is read again from its
start and the first N text lines of each rank, already stored, are skipped (counted, not
matched by time: the kubelet's `sinceTime` has one-second precision and a batch of lines
can share one timestamp). Control records are never skipped, so rank 0's result chunks and
a failing rank's error report are always complete; metrics records among skipped lines are
dropped (they were recorded before).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# RESTART_MARKER is in the system line written to every rank's log before a restart: lines
# after the last one came from the current attempt's pods (what a resumed stream skips).
from ...jobs.lifecycle import RESTART_MARKER
from ...jobs.storage.store import JobStore
from ...runtime.protocol import MARKER, OutputParser
from .objects import split_packed_line


class _RankLines:
    """One rank's share of a pod log: parsed, with already-stored lines skipped.

    The runtime writes a newline before each control record (so a record never sticks to a
    half-written line); such a blank line right before a record is not the user's and is
    dropped.
    """

    def __init__(self, skip: int, key: bytes | None, rank: int):
        self.parser = OutputParser(key, rank)
        self.skip = skip
        self.seen = 0  # text lines of this rank in this stream (for the next resume)
        self._blank = False

    def feed(self, text: str) -> Iterator[tuple[str, Any]]:
        for kind, value in self.parser.feed(text.encode("utf-8", "replace") + b"\n"):
            yield from self._item(kind, value)

    def _item(self, kind: str, value: Any) -> Iterator[tuple[str, Any]]:
        if kind == "line" and value == "":
            if self._blank:  # the one held back was the user's own
                yield from self._line("")
            self._blank = True
            return
        if kind == "control":
            self._blank = False
            if self.skip > 0 and value.get("type") == "metrics":
                return
            yield kind, value
            return
        if self._blank:
            self._blank = False
            yield from self._line("")
        if kind == "line":
            yield from self._line(value)
        else:
            yield kind, value

    def _line(self, text: str) -> Iterator[tuple[str, Any]]:
        self.seen += 1
        if self.skip > 0:
            self.skip -= 1
            return
        yield "line", text

    def unread(self) -> Iterator[tuple[str, Any]]:
        """A report too long to read (cut, its MAC fails): no line of the user's (so not
        counted), and its blank line before it was ours. Among skipped lines it was said
        before."""
        self._blank = False
        if self.skip == 0:
            yield "unread", None

    def finish(self) -> Iterator[tuple[str, Any]]:
        for kind, value in self.parser.flush():
            yield from self._item(kind, value)
        if self._blank:
            self._blank = False
            yield from self._line("")


MAX_POD_LINE = 1 << 20  # bytes; a result chunk's record is ~64 KiB


class PodOutput:
    """The bytes of one pod's log -> (rank, kind, value) with kind 'line', 'control',
    'progress' or 'unread'. A packed pod (several ranks, torchrun inside) prefixes each line
    with its rank; torchrun's own lines belong to the pod's first rank. Control records count
    only when signed with the job's `key` by the rank whose line it is (runtime/protocol.py).
    A line over MAX_POD_LINE that starts with the record marker is a report cut short: it is
    dropped whole (never shown as text) and said by one ('unread', None) item."""

    def __init__(
        self, ranks: list[int], skip: dict[int, int] | None = None, key: bytes | None = None
    ):
        self.ranks = list(ranks)
        self.packed = len(self.ranks) > 1
        self._buffer = b""
        self._lines = {r: _RankLines((skip or {}).get(r, 0), key, r) for r in self.ranks}
        self._cut = False  # the line being read was cut already (its first chunk is out)
        self._dropping = False  # ... and it is a report cut short: the rest goes too

    def feed(self, data: bytes) -> Iterator[tuple[int, str, Any]]:
        self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n")
        # A pod printing without newlines must not fill this process's memory: a runaway
        # line is cut every MAX_POD_LINE bytes from its start, however it arrives (a resumed
        # stream must count the same lines), as the local backend's parser does.
        for raw in complete:
            for start in range(0, max(len(raw), 1), MAX_POD_LINE):
                yield from self._chunk(raw[start : start + MAX_POD_LINE], len(raw) > MAX_POD_LINE)
            self._cut = self._dropping = False
        while len(self._buffer) > MAX_POD_LINE:
            raw, self._buffer = self._buffer[:MAX_POD_LINE], self._buffer[MAX_POD_LINE:]
            yield from self._chunk(raw, True)

    def finish(self) -> Iterator[tuple[int, str, Any]]:
        """The stream ended: what is left (a last line without a newline)."""
        if self._buffer:
            raw, self._buffer = self._buffer, b""
            yield from self._chunk(raw, len(raw) > MAX_POD_LINE)
        self._cut = self._dropping = False
        for rank, lines in self._lines.items():
            for kind, value in lines.finish():
                yield rank, kind, value

    def _chunk(self, raw: bytes, long: bool) -> Iterator[tuple[int, str, Any]]:
        """One piece of a line: the whole line, or (`long`) one cut every MAX_POD_LINE bytes."""
        first, self._cut = not self._cut, long
        if self._dropping:
            return
        rank, text = self._rank_of(raw.decode("utf-8", "replace"))
        if first and long and text.startswith(MARKER):
            self._dropping = True
            for kind, value in self._lines[rank].unread():
                yield rank, kind, value
            return
        for kind, value in self._lines[rank].feed(text):
            yield rank, kind, value

    def _rank_of(self, text: str) -> tuple[int, str]:
        if self.packed:
            packed_rank, rest = split_packed_line(text)
            # torchrun's own lines (no rank) and unknown ranks go to the first rank's log
            if packed_rank is not None and packed_rank in self._lines:
                return packed_rank, rest
            return self.ranks[0], rest
        return self.ranks[0], text

    def seen(self) -> dict[int, int]:
        """Text lines per rank already stored: delivered or skipped so far, plus what was
        still to be skipped (a stream that broke before reaching them): what a resumed
        stream skips."""
        return {r: lines.seen + lines.skip for r, lines in self._lines.items()}


def stored_line_counts(store: JobStore, job_id: str, workers: int) -> dict[int, int]:
    """Per rank: the text lines stored since the current attempt began."""
    counts: dict[int, int] = {}
    for rank in range(workers):
        count, cursor = 0, None
        while True:
            lines, cursor = store.read_logs(job_id, rank, cursor)
            if not lines:
                break
            for item in lines:
                if item["stream"] == "system":
                    if RESTART_MARKER in item["line"]:
                        count = 0
                else:
                    count += 1
        counts[rank] = count
    return counts
