"""TensorBoard scalars (`SummaryWriter.add_scalar`) as the job's series: the supervisor reads
the event files its ranks write in the job's TensorBoard directory as they grow.

The directory is the one the ranks were given ($MLCLUSTER_TENSORBOARD_DIR: `--tensorboard`,
the job's env, else `tensorboard/` in the job's directory); a URI (s3://...) is not read. An
event file is a sequence of TFRecords (length, its CRC, an `Event` protocol buffer, its CRC),
read up to its last complete record and resumed from there. A tag is a series' name (under
its subdirectory's path when the file is below the top); the rank is the one a path part
names (`rank3/`), else 0. Parsing needs the `tensorboard` package: without it nothing is read.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

from .model import TENSORBOARD_ENV

POLL_INTERVAL = 2.0  # seconds between looks at the directory
MAX_FILES = 64  # event files followed
MAX_READ = 8 << 20  # bytes of one file read per look
_RANK_DIR = re.compile(r"^rank[_-]?(\d{1,6})$")
_FLOAT, _DOUBLE = 1, 2  # TensorFlow DataType numbers


def job_tensorboard_dir(spec: Any, default: Path) -> Path | None:
    """Where this job's ranks write TensorBoard data, when it is a local directory."""
    chosen = spec.tensorboard or spec.env.get(TENSORBOARD_ENV)
    if not chosen:
        return default
    return Path(chosen) if chosen.startswith("/") else None


class TensorBoardTail:
    def __init__(self, directory: Path | None):
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self._event_cls: Any = None

    def poll(self) -> dict[int, list[list[Any]]]:
        """New scalar points by rank: {rank: [[step, wall_time, {tag: value}], ...]}."""
        points: dict[int, list[list[Any]]] = {}
        if self.directory is None or not self.directory.is_dir():
            return points
        for path in self._files():
            for rank, point in self._read(path):
                points.setdefault(rank, []).append(point)
        return points

    def _files(self) -> list[Path]:
        found: list[Path] = []
        for root, dirs, files in os.walk(str(self.directory)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))[:MAX_FILES]
            found += [Path(root) / f for f in sorted(files) if ".tfevents." in f]
            if len(found) >= MAX_FILES:
                break
        return found[:MAX_FILES]

    def _read(self, path: Path) -> list[tuple[int, list[Any]]]:
        start = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(MAX_READ)
        except OSError:
            return []
        if not data:
            return []
        event_cls = self._event()
        if event_cls is None:
            return []
        relative = path.parent.relative_to(self.directory)  # type: ignore[arg-type]
        rank = next((int(m.group(1)) for p in relative.parts if (m := _RANK_DIR.match(p))), 0)
        prefix = "/".join(p for p in relative.parts if not _RANK_DIR.match(p))
        out, pos = [], 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            end = pos + 12 + length + 4
            if end > len(data):
                break  # a record still being written: read next time
            event = event_cls()
            try:
                event.ParseFromString(data[pos + 12 : pos + 12 + length])
            except Exception:  # noqa: BLE001 - a damaged record is skipped, not fatal
                event = None
            pos = end
            values = _scalars(event, prefix) if event is not None else {}
            if values:
                out.append((rank, [event.step, int(event.wall_time * 1000), values]))
        self.offsets[path] = start + pos
        return out

    def _event(self) -> Any:
        if self._event_cls is None:
            try:
                from tensorboard.compat.proto.event_pb2 import Event
            except ImportError:
                self._event_cls = False
            else:
                self._event_cls = Event
        return self._event_cls or None


def _scalars(event: Any, prefix: str) -> dict[str, float]:
    values: dict[str, float] = {}
    if not event.HasField("summary"):
        return values
    for v in event.summary.value:
        number: float | None = None
        if v.HasField("simple_value"):
            number = v.simple_value
        elif v.HasField("tensor") and not v.tensor.tensor_shape.dim:
            t = v.tensor
            if t.float_val:
                number = t.float_val[0]
            elif t.double_val:
                number = t.double_val[0]
            elif t.dtype == _FLOAT and len(t.tensor_content) == 4:
                number = struct.unpack("<f", t.tensor_content)[0]
            elif t.dtype == _DOUBLE and len(t.tensor_content) == 8:
                number = struct.unpack("<d", t.tensor_content)[0]
        if number is not None:
            values[f"{prefix}/{v.tag}" if prefix else v.tag] = number
    return values
