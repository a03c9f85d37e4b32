"""The wire between a rank and whoever watches it (a local supervisor, a pod log stream).

A rank reports structured records (started, progress, result, error) either on a dedicated
pipe (local ranks) or inline on stdout behind a marker (Kubernetes pods, where stdout is the
only channel). The watcher splits a rank's raw output into log lines, control records and
progress, including tqdm bars, which redraw themselves with carriage returns.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

MARKER = "\x1eMLCLUSTER "
_MARKER_B = MARKER.encode()

# tqdm's default bar: "desc:  45%|####5     | 45/100 [00:01<00:01, 30.00it/s]" (also without
# a bar, and with unit scaling such as "1.20k/10.0k").
_TQDM = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?(?:\s*\d+%\|.*?\|\s*)?(?P<n>[\d.]+[kMG]?)(?:/(?P<total>[\d.]+[kMG]?))?\s*\["
)
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9}


def encode_record(record: dict[str, Any]) -> bytes:
    return (MARKER + json.dumps(record, separators=(",", ":")) + "\n").encode()


def parse_tqdm(segment: str) -> dict[str, Any] | None:
    m = _TQDM.match(segment.strip())
    if not m:
        return None
    step = _number(m.group("n"))
    total = _number(m.group("total")) if m.group("total") else None
    if step is None:
        return None
    desc = (m.group("desc") or "").strip() or None
    return {"step": step, "total": total, "desc": desc, "source": "tqdm"}


def _number(text: str | None) -> float | None:
    if not text:
        return None
    scale = _SCALE.get(text[-1], 1)
    try:
        value = float(text.rstrip("kMG")) * scale
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


class OutputParser:
    """Incremental splitter of one rank stream into ('line', text), ('control', record)
    and ('progress', dict) items. Carriage-return redraws are not logged as lines; only
    the text standing when the newline comes is."""

    def __init__(self, max_line: int = 64 * 1024):
        self._buf = b""
        self._max_line = max_line

    def feed(self, data: bytes) -> Iterator[tuple[str, Any]]:
        self._buf += data
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            raw, self._buf = self._buf[:nl], self._buf[nl + 1 :]
            yield from self._line(raw)
        # Redraws still waiting for their newline: report progress from the newest
        # complete one (the text after the last CR may be cut mid-bar).
        if b"\r" in self._buf:
            segments = self._buf.split(b"\r")
            for segment in reversed(segments):
                progress = (
                    parse_tqdm(segment.decode("utf-8", "replace")) if segment.strip() else None
                )
                if progress:
                    yield "progress", progress
                    break
            self._buf = b"\r" + segments[-1]
        if len(self._buf) > self._max_line:  # a runaway line without newlines
            raw, self._buf = self._buf[: self._max_line], self._buf[self._max_line :]
            yield "line", raw.decode("utf-8", "replace")

    def flush(self) -> Iterator[tuple[str, Any]]:
        if self._buf:
            raw, self._buf = self._buf, b""
            yield from self._line(raw)

    def _line(self, raw: bytes) -> Iterator[tuple[str, Any]]:
        idx = raw.find(_MARKER_B)
        if idx >= 0:
            before, record = raw[:idx], raw[idx + len(_MARKER_B) :]
            if before.strip():
                yield from self._line(before)
            try:
                yield "control", json.loads(record)
            except ValueError:
                yield "line", raw.decode("utf-8", "replace")
            return
        if b"\r" in raw:
            segments = [s for s in raw.split(b"\r") if s.strip()]
            if not segments:
                return
            progress = parse_tqdm(segments[-1].decode("utf-8", "replace"))
            if progress:
                yield "progress", progress
            raw = segments[-1]
        yield "line", raw.decode("utf-8", "replace")
