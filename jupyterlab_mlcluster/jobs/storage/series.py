"""A job's logged series (`mlc.log`, the Trainer callback, the Lightning logger, TensorBoard
scalars): kept whole in the job's directory, appended to by its supervisor only.

`series.jsonl` holds one line per batch a rank sent: `{"r": rank, "b": [origin, n], "p":
[[step, time, {name: value}], ...]}` (`b`: the batch's number, runtime/scalars.py; absent
for TensorBoard's); `series-names.json` the sorted names so far (written when one is
new, so a reader learns them without reading every point). A cursor is a byte offset into
`series.jsonl`, always just after a newline. What a rank sends is user code's: the writer
keeps only finite numbers under valid names, at most MAX_SERIES names a job, and says once
in the job's log what it dropped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from operator import itemgetter
from pathlib import Path
from typing import Any

from ...runtime.scalars import MAX_SERIES, finite, valid_name

SERIES_FILE = "series.jsonl"
NAMES_FILE = "series-names.json"
MAX_POINTS = 10_000  # points of one batch kept (a rank sends at most 2000)
# Bytes of series.jsonl one read_series call parses: a reader pages with the cursor
# (`more` says there is more) instead of loading a long job's whole file at each ask.
READ_BYTES = 4 << 20


class SeriesWriter:
    """The supervisor's: checks each rank batch and appends what is good."""

    def __init__(
        self,
        job_dir: Path,
        say: Callable[[str], None],
        max_mib: int = 0,
        max_series: int = MAX_SERIES,
    ):
        self._path = job_dir / SERIES_FILE
        self._max_bytes = max(0, max_mib) << 20  # 0: no cap (MLClusterConfig.max_series_mib)
        try:  # what an earlier supervisor of this job (adopted, restarted) wrote counts too
            self._written = self._path.stat().st_size
        except OSError:
            self._written = 0
        self._names_path = job_dir / NAMES_FILE
        self._say = say
        self._said: set[str] = set()
        self._max = max_series
        self.names: set[str] = set(read_names(job_dir))  # an adopted job's earlier names
        self._file: Any = None
        self._last_batches: dict[int, tuple[str, int]] | None = None  # read when first asked

    def last_batch(self, rank: int) -> tuple[str, int] | None:
        """The number of `rank`'s last batch stored here (by this writer or an earlier
        supervisor's: read from the file once), so that one read again is known."""
        if self._last_batches is None:
            self._last_batches = _stored_batches(self._path)
        return self._last_batches.get(rank)

    def add(
        self,
        rank: int,
        points: Any,
        *,
        source: str = "mlc.log",
        batch: tuple[str, int] | None = None,
    ) -> int:
        """Append `rank`'s batch (numbered `batch`, if it is); returns how many points were
        kept."""
        if batch is not None:
            self._note(rank, batch)
        kept: list[list[Any]] = []
        new_names = False
        for point in points[:MAX_POINTS] if isinstance(points, list) else []:
            if not (isinstance(point, list) and len(point) == 3 and isinstance(point[2], dict)):
                self._once("shape", f"dropped a {source} point of rank {rank} that is no point")
                continue
            step, at = finite(point[0]), finite(point[1])
            if step is None:
                self._once("step", f"dropped {source} points of rank {rank} without a finite step")
                continue
            values: dict[str, float] = {}
            for name, value in point[2].items():
                number = finite(value)
                if number is None:
                    self._once(
                        f"value:{name}",
                        f"dropped {source} {name}={value!r} of rank {rank} at step {point[0]}: "
                        "not a finite number",
                    )
                    continue
                if name not in self.names:
                    if not valid_name(name):
                        self._once(f"name:{name}", f"dropped {source} series {name!r}: bad name")
                        continue
                    if len(self.names) >= self._max:
                        self._once(
                            "cap",
                            f"a job keeps at most {self._max} series: {name!r} and later new "
                            "names are dropped",
                        )
                        continue
                    self.names.add(name)
                    new_names = True
                values[name] = number
            if values:  # (a rank sends the time in ms; the store keeps seconds)
                kept.append([_compact(step), at / 1000 if at is not None else time.time(), values])
        if kept:
            if new_names:
                _write_names(self._names_path, self.names)
            if self._file is None:
                self._file = open(self._path, "ab", buffering=0)  # held open until close()
            data = _line(rank, batch, kept)
            if self._max_bytes and self._written + len(data) > self._max_bytes:
                self._once(
                    "bytes",
                    f"series truncated after {self._max_bytes / (1 << 20):g} MiB: further "
                    "points of this job are not kept (MLClusterConfig.max_series_mib); the "
                    "job goes on",
                )
                return 0
            self._file.write(data)
            self._written += len(data)
        return len(kept)

    def _note(self, rank: int, batch: tuple[str, int]) -> None:
        self.last_batch(rank)  # the file read first: what it held before this batch
        assert self._last_batches is not None
        self._last_batches[rank] = batch

    def _once(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._say(f"[mlcluster] {text}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _line(rank: int, batch: tuple[str, int] | None, kept: list[list[Any]]) -> bytes:
    entry: dict[str, Any] = {"r": rank, "p": kept}
    if batch is not None:
        entry = {"r": rank, "b": list(batch), "p": kept}  # "p" last: _stored_batches
    return json.dumps(entry, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _compact(number: float) -> float | int:
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _write_names(path: Path, names: Iterable[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(sorted(names)))
    os.replace(tmp, path)


def _stored_batches(path: Path) -> dict[int, tuple[str, int]]:
    """Each rank's last numbered batch in the series file, read from each line's head
    (its points are not parsed)."""
    last: dict[int, tuple[str, int]] = {}
    try:
        with open(path, "rb") as file:
            for raw in file:
                head = raw[: raw.find(b',"p":')] + b"}"
                try:
                    entry = json.loads(head)
                    origin, number = entry["b"]
                    last[int(entry["r"])] = (str(origin), int(number))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return last


def read_names(job_dir: Path) -> list[str]:
    try:
        names = json.loads((job_dir / NAMES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def read_series(
    job_dir: Path, names: list[str] | None, after: int = 0, limit: int = READ_BYTES
) -> dict[str, Any]:
    """The job's series named in `names` (None: every one), points stored after the byte
    offset `after`, at most about `limit` bytes of them (a line longer than it whole):
    {"names", "series": [{name, rank, steps, values, times}], "cursor", "more"}; `more`:
    ask again from `cursor` for the rest."""
    wanted = None if names is None else set(names)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    cursor, more = after, False
    if wanted is None or wanted:
        data, more = _read_lines(job_dir / SERIES_FILE, after, limit)
        cursor = after + len(data)
        for raw in data.splitlines():
            try:
                batch = json.loads(raw)
                rank, points = int(batch["r"]), batch["p"]
            except (ValueError, KeyError, TypeError):
                continue
            if not _add_columns(found, rank, points, wanted):
                _add_points(found, rank, points, wanted)
    series = [found[k] for k in sorted(found)]
    return {"names": read_names(job_dir), "series": series, "cursor": cursor, "more": more}


def _entry(found: dict[tuple[str, int], dict[str, Any]], name: str, rank: int) -> Any:
    entry = found.get((name, rank))
    if entry is None:
        entry = found[(name, rank)] = {
            "name": name,
            "rank": rank,
            "steps": [],
            "values": [],
            "times": [],
        }
    return entry


def _add_columns(
    found: dict[tuple[str, int], dict[str, Any]],
    rank: int,
    points: list[Any],
    wanted: set[str] | None,
) -> bool:
    """The usual batch, whose points all carry the same names (one `mlc.log` call site),
    taken a column at a time (list comprehensions, not a loop a point: a long job's first
    read is most of a first draw). False, and nothing added, for any other batch."""
    if not points:
        return True
    try:
        dicts = list(map(itemgetter(2), points))
        names = list(dicts[0])
        columns = [(n, list(map(itemgetter(n), dicts))) for n in names]
        # Each point has every name of the first (or KeyError), so at least as many; as many
        # in all: exactly those. (Every name is checked, not only the wanted ones.)
        if sum(map(len, dicts)) != len(names) * len(dicts):
            return False
        steps, times = list(map(itemgetter(0), points)), list(map(itemgetter(1), points))
    except (KeyError, TypeError, IndexError):
        return False
    for name, values in columns:
        if wanted is not None and name not in wanted:
            continue
        entry = _entry(found, name, rank)
        entry["steps"] += steps
        entry["values"] += values
        entry["times"] += times
    return True


def _add_points(
    found: dict[tuple[str, int], dict[str, Any]],
    rank: int,
    points: list[Any],
    wanted: set[str] | None,
) -> None:
    for step, at, values in points:
        for name, value in values.items():
            if wanted is not None and name not in wanted:
                continue
            entry = _entry(found, name, rank)
            entry["steps"].append(step)
            entry["values"].append(value)
            entry["times"].append(at)


def _read_lines(path: Path, after: int, limit: int) -> tuple[bytes, bool]:
    """Whole lines from `after`, about `limit` bytes (more only to end a line); and whether
    there may be more. A line being written is read next time."""
    try:
        with open(path, "rb") as f:
            f.seek(after)
            data = f.read(limit)
            while len(data) >= limit and b"\n" not in data[-limit:]:
                chunk = f.read(limit)  # one line longer than `limit`: read to its end
                if not chunk:
                    break
                data += chunk
    except OSError:
        return b"", False
    end = data.rfind(b"\n") + 1
    return data[:end], len(data) >= limit and end > 0  # (a last ask may then find nothing)


def read_all(job_dir: Path, names: list[str] | None) -> dict[str, Any]:
    """read_series of every point stored now, page after page."""
    data = read_series(job_dir, names)
    while data["more"]:
        page = read_series(job_dir, names, data["cursor"])
        merge_pages(data, page)
    return data


def merge_pages(data: dict[str, Any], page: dict[str, Any]) -> None:
    """`page` (asked from `data`'s cursor) appended to `data`."""
    got = {(s["name"], s["rank"]): s for s in data["series"]}
    for s in page["series"]:
        entry = got.get((s["name"], s["rank"]))
        if entry is None:
            got[(s["name"], s["rank"])] = s
            continue
        for key in ("steps", "values", "times"):
            entry[key] += s[key]
    data["series"] = [got[k] for k in sorted(got)]
    data.update(names=page["names"], cursor=page["cursor"], more=page["more"])


def point_rows(data: dict[str, Any]) -> list[tuple[str, int, float, float, float]]:
    """read_series' answer as (name, rank, step, value, time) rows, in its order."""
    return [
        (s["name"], s["rank"], step, value, at)
        for s in data["series"]
        for step, value, at in zip(s["steps"], s["values"], s["times"], strict=True)
    ]


def series_text(job_dir: Path, *, csv: bool = False) -> str:
    """`mlcluster metrics JOB`: one line per series and rank (points, last step and value,
    min, max), or with `csv` every point."""
    data = read_all(job_dir, None)
    if csv:
        lines = ["name,rank,step,value,time"]
        lines += [f"{_csv_field(n)},{r},{s!r},{v!r},{t!r}" for n, r, s, v, t in point_rows(data)]
        return "\n".join(lines) + "\n"
    if not data["series"]:
        return "no series logged (mlc.log, a Trainer callback, TensorBoard scalars)\n"
    rows = [("SERIES", "RANK", "POINTS", "LAST STEP", "LAST", "MIN", "MAX")]
    for s in data["series"]:
        values = s["values"]
        rows.append(
            (
                s["name"],
                str(s["rank"]),
                str(len(values)),
                f"{s['steps'][-1]:g}",
                f"{values[-1]:.6g}",
                f"{min(values):.6g}",
                f"{max(values):.6g}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "".join(line.rstrip() + "\n" for line in text)


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in '",\n') else text
