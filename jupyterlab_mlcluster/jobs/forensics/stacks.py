"""Where a job's ranks are: every thread's Python stack of every rank (`StackReport`), the
identical ones folded with the ranks that share them (`fold`), and their text.

Pure data: readers (readers.py) fill it, backends hand it over, front ends show it. A report
says what it lacks: a rank that could not be read is listed with why (`missing`), never left
out as if the answer were whole.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

# Frames of these files are the machinery around user code (the rank runtime, the
# interpreter's threading), not where the user's program is.
_RUNTIME_MARKERS = (
    f"{os.sep}jupyterlab_mlcluster{os.sep}runtime{os.sep}",
    f"{os.sep}jupyterlab_mlcluster{os.sep}jobs{os.sep}warm{os.sep}",
    f"{os.sep}runpy.py",
)
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}lib{os.sep}python3")
FRAMES_SHOWN = 8  # of a fold's stack in the text form (--json has them all)


class NoStacks(LookupError):
    """The job has no stacks to show: not started, or it ended keeping none."""

    def __str__(self) -> str:
        return str(self.args[0])


class NoSuchRank(LookupError):
    """A rank the job does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int
    native: bool = False  # a C frame (--native), not Python
    code: str = ""  # the source line, where the reader could read the file

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "native": self.native,
            "code": self.code,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Frame:
        return cls(
            str(data["name"]),
            str(data["file"]),
            int(data["line"]),
            bool(data["native"]),
            str(data.get("code") or ""),
        )

    @property
    def where(self) -> str:
        """'train.py:42', '<cell> line 9'."""
        if self.native:
            return os.path.basename(self.file)
        short = self.file if self.file.startswith("<") else os.path.basename(self.file)
        return f"{short} line {self.line}" if short.startswith("<") else f"{short}:{self.line}"

    @property
    def is_user(self) -> bool:
        """A frame of the user's own code (a cell, a script), not a library's or ours."""
        if self.native:
            return False
        if self.file.startswith("<"):
            return self.file in ("<cell>", "<string>", "<stdin>") or self.file.startswith("<ipy")
        return not any(m in self.file for m in _RUNTIME_MARKERS + _LIBRARY_MARKERS)


@dataclasses.dataclass
class ThreadStack:
    name: str
    ident: int | None
    frames: list[Frame]  # innermost first
    active: bool | None = None  # running (not idle/waiting), where the reader can tell
    gil: bool | None = None  # holds the GIL, where the reader can tell
    main: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.ident,
            "main": self.main,
            "active": self.active,
            "gil": self.gil,
            "frames": [f.to_json() for f in self.frames],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ThreadStack:
        return cls(
            name=str(data["name"]),
            ident=data.get("id"),
            frames=[Frame.from_json(f) for f in data["frames"]],
            active=data.get("active"),
            gil=data.get("gil"),
            main=bool(data.get("main")),
        )


@dataclasses.dataclass
class RankStacks:
    rank: int
    pid: int | None
    reader: str  # "py-spy", "py-spy --native", "pystack", "faulthandler (the rank's helper)"
    threads: list[ThreadStack]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "reader": self.reader,
            "threads": [t.to_json() for t in self.threads],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankStacks:
        return cls(
            rank=int(data["rank"]),
            pid=data.get("pid"),
            reader=str(data["reader"]),
            threads=[ThreadStack.from_json(t) for t in data["threads"]],
        )


@dataclasses.dataclass
class StackReport:
    """The stacks of some ranks of a job at one moment, and the ranks that could not be read."""

    job: str
    ranks: list[RankStacks]
    missing: dict[int, str] = dataclasses.field(default_factory=dict)  # rank -> why
    taken: float = dataclasses.field(default_factory=time.time)
    why: str = "asked"  # asked, stalled, cancelled, timeout, failed
    live: bool = True  # False: kept with the job, taken earlier
    native: bool = False
    seconds: float = 0.0  # how long reading took

    @property
    def readers(self) -> list[str]:
        return sorted({r.reader for r in self.ranks})

    @property
    def complete(self) -> bool:
        return not self.missing

    def folds(self) -> list[Fold]:
        return fold(self.ranks)

    def only(self, rank: int) -> StackReport:
        """This report narrowed to one rank."""
        return dataclasses.replace(
            self,
            ranks=[r for r in self.ranks if r.rank == rank],
            missing={r: w for r, w in self.missing.items() if r == rank},
        )

    def to_json(self) -> dict[str, Any]:
        from ..record import iso

        return {
            "job": self.job,
            "taken": iso(self.taken),
            "taken_epoch": self.taken,
            "why": self.why,
            "live": self.live,
            "native": self.native,
            "seconds": round(self.seconds, 3),
            "readers": self.readers,
            "complete": self.complete,
            "missing": [{"rank": r, "why": w} for r, w in sorted(self.missing.items())],
            "folds": [f.to_json() for f in self.folds()],
            "ranks": [r.to_json() for r in sorted(self.ranks, key=lambda r: r.rank)],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackReport:
        return cls(
            job=str(data["job"]),
            ranks=[RankStacks.from_json(r) for r in data["ranks"]],
            missing={int(m["rank"]): str(m["why"]) for m in data.get("missing", [])},
            taken=float(data["taken_epoch"]),
            why=str(data.get("why", "asked")),
            live=bool(data.get("live", False)),
            native=bool(data.get("native", False)),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclasses.dataclass
class Fold:
    """One stack, and the ranks (with the thread's name) that are all in it."""

    ranks: list[int]
    thread: str
    main: bool
    frames: list[Frame]

    @property
    def summary(self) -> str:
        return summarize(self.frames)

    @property
    def label(self) -> str:
        """'ranks 0, 2, 3' or 'rank 1', with the thread where it is not the main one."""
        who = f"rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        return who if self.main else f"{who} (thread {self.thread})"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "thread": self.thread,
            "main": self.main,
            "summary": self.summary,
            "text": f"{self.label}: {self.summary}",
            "frames": [f.to_json() for f in self.frames],
        }


def _key(thread: ThreadStack) -> tuple:
    return (thread.main, tuple((f.name, f.file, f.line, f.native) for f in thread.frames))


def fold(ranks: list[RankStacks]) -> list[Fold]:
    """Identical stacks together: main threads first (where each rank is), most ranks first."""
    groups: dict[tuple, Fold] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        for thread in rank.threads:
            key = _key(thread)
            group = groups.get(key)
            if group is None:
                groups[key] = Fold([rank.rank], thread.name, thread.main, list(thread.frames))
            elif rank.rank not in group.ranks:
                group.ranks.append(rank.rank)
    return sorted(groups.values(), key=lambda f: (not f.main, -len(f.ranks), f.ranks))


def summarize(frames: list[Frame]) -> str:
    """'all_reduce ← train_step (train.py:42): dist.all_reduce(t)': the innermost frame,
    and the user's own frame it was called from with its line; '<module> (cell.py:9):
    time.sleep(600)' when that is the same frame."""
    python = [f for f in frames if not f.native]
    if not python:
        return frames[0].name if frames else "(no frames)"
    top = python[0]
    user = next((f for f in python if f.is_user), None)
    code = f": {user.code}" if user is not None and user.code else ""
    if user is None or user is top:
        return f"{top.name} ({top.where}){code}"
    return f"{top.name} ← {user.name} ({user.where}){code}"


def fold_lines(report: StackReport, *, main_only: bool = False) -> list[str]:
    """One line per fold: 'ranks 0, 2, 3: all_reduce ← train_step (train.py:42)'."""
    lines = [f"{f.label}: {f.summary}" for f in report.folds() if f.main or not main_only]
    lines.extend(f"rank {rank}: not read ({why})" for rank, why in sorted(report.missing.items()))
    return lines


def where_text(report: StackReport, *, still: bool = False, folds: int = 3) -> str:
    """'ranks 0, 2 were in all_reduce ← step (train.py:42)': where the main threads were,
    for a job's reason or error (one clause per fold, at most `folds` of them, and the ranks
    that were not read); `still`: they were still there when another rank failed."""
    parts = []
    main = [f for f in report.folds() if f.main]
    for f in main[:folds]:
        verb = ("were" if len(f.ranks) > 1 else "was") + (" still" if still else "")
        parts.append(f"{f.label} {verb} in {f.summary}")
    if len(main) > folds:
        parts.append(f"{len(main) - folds} more stacks (mlcluster stacks {report.job})")
    parts.extend(f"rank {r} could not be read ({why})" for r, why in sorted(report.missing.items()))
    return "; ".join(parts)


def format_report(report: StackReport, *, frames: int = FRAMES_SHOWN) -> str:
    """The text form (CLI, kernel): a header, then each fold with its innermost frames."""
    from ..record import iso

    state = "live" if report.live else f"kept ({report.why})"
    head = (
        f"stacks of job {report.job}, {state}, taken {iso(report.taken)}"
        f" by {', '.join(report.readers) or 'no reader'}"
    )
    if report.live:
        head += f" in {report.seconds:.2f} s"
    out = [head]
    if report.missing:
        out.append(
            "INCOMPLETE: "
            + "; ".join(f"rank {r}: {why}" for r, why in sorted(report.missing.items()))
        )
    for f in report.folds():
        out.append(f"{f.label}: {f.summary}")
        shown = f.frames[:frames]
        for frame in shown:
            out.append(f"    {frame.name} ({frame.where})")
        if len(f.frames) > len(shown):
            out.append(f"    ... {len(f.frames) - len(shown)} more (--json)")
    return "\n".join(out)
