"""The wire between a rank and whoever watches it (a local supervisor, a pod log stream).

A rank reports structured records (started, progress, result, error) either on a dedicated
pipe (local ranks) or inline on stdout behind a marker (Kubernetes pods, where stdout is the
only channel). The watcher splits a rank's raw output into log lines, control records and
progress, including tqdm bars, which redraw themselves with carriage returns.

Records are authenticated: `MARKER <mac> <json>` at the very start of a line, where `mac` is
an HMAC-SHA256 over the sending rank's number and the JSON, keyed with the job's own secret
(`KEY_FILE`, delivered with the payload: beside the payload file locally, in the payload
Secret on Kubernetes; never in the environment). So a rank whose code or data prints the
marker (mid-line, from another rank, or a forged record without the key) only prints a line:
in a pod, stdout is shared by the user's output and the records, and the result record is
unpickled by the kernel.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "\x1eMLCLUSTER "
_MARKER_B = MARKER.encode()
KEY_FILE = "report-key"  # in the payload directory (Kubernetes) or beside the payload file
KEY_BYTES = 32
_MAC_HEX = 64

# tqdm's default bar: "desc:  45%|####5     | 45/100 [00:01<00:01, 30.00it/s]" (also without
# a bar, and with unit scaling such as "1.20k/10.0k").
_TQDM = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?(?:\s*\d+%\|.*?\|\s*)?(?P<n>[\d.]+[kMG]?)(?:/(?P<total>[\d.]+[kMG]?))?\s*\["
)
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9}


def record_mac(key: bytes, rank: int, body: bytes) -> str:
    return hmac.new(key, b"%d\x00" % rank + body, hashlib.sha256).hexdigest()


def encode_record(record: dict[str, Any], key: bytes, rank: int) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return _MARKER_B + record_mac(key, rank, body).encode() + b" " + body + b"\n"


def decode_record(raw: bytes, key: bytes | None, rank: int) -> dict[str, Any] | None:
    """The record a line carries, if it is one: the marker at its start and a MAC made with
    `key` for `rank`; None for anything else (it is then an ordinary line)."""
    if key is None or not raw.startswith(_MARKER_B):
        return None
    rest = raw[len(_MARKER_B) :]
    mac, body = rest[:_MAC_HEX], rest[_MAC_HEX + 1 :]
    if rest[_MAC_HEX : _MAC_HEX + 1] != b" ":
        return None
    if not hmac.compare_digest(mac, record_mac(key, rank, body).encode()):
        return None
    try:
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def key_path(payload: str | os.PathLike[str]) -> Path:
    """Where a job's record key lies, given where its payload does."""
    path = Path(payload)
    return path / KEY_FILE if path.is_dir() else path.parent / KEY_FILE


def new_key_file(path: Path) -> bytes:
    """Create a job's key file (0600; never through a link, never over an existing file)."""
    key = secrets.token_bytes(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def read_key_file(path: Path) -> bytes | None:
    """A job's key, or None when there is none (or it is no regular file of the right size)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        key = f.read(KEY_BYTES + 1)
    return key if len(key) == KEY_BYTES else None


def job_key(path: Path) -> bytes:
    """The job's key at `path`, created on first use (jobs stored before keys existed)."""
    key = read_key_file(path)
    if key is None:
        try:
            key = new_key_file(path)
        except FileExistsError:  # another process made it meanwhile
            key = read_key_file(path)
            if key is None:
                raise
    return key


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
    the text standing when the newline comes is. Control records are only those signed
    with `key` by `rank` (see the module docstring); without a key, there are none."""

    def __init__(self, key: bytes | None = None, rank: int = 0, max_line: int = 64 * 1024):
        self._buf = b""
        self._max_line = max_line
        self._key = key
        self._rank = rank

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
        record = decode_record(raw, self._key, self._rank)
        if record is not None:
            yield "control", record
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
