"""Reading a live process's stacks from outside it: py-spy first (`py-spy dump --json`, which
reads the interpreter's memory through ptrace and so works while the rank's main thread is
blocked in C or spins holding the GIL), and where ptrace is refused (a pod without
SYS_PTRACE, py-spy missing) the rank's own helper (runtime/stackdump.py: faulthandler on
SIGUSR2 writing every thread's stack to a file). Each rank's answer says which one read it.

Ranks are read in parallel, each with a deadline, so one wedged reader costs the answer
that rank (listed as missing, with why), not the whole answer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import functools
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ...runtime.stackdump import HELPER_SIGNAL, main_ident_path
from .stacks import Frame, RankStacks, StackReport, ThreadStack

READ_TIMEOUT = 10.0  # one rank's reader
HELPER_TIMEOUT = 3.0  # the rank's helper to have written its stacks
HELPER_SETTLE = 0.05  # its file unchanged this long: the dump is whole
HELPER_READER = "faulthandler (the rank's own helper)"
NATIVE_UNAVAILABLE = "--native needs pystack/py-spy native support; not available"


class StacksUnavailable(RuntimeError):
    """Stacks cannot be taken here as asked (no reader, a backend without the means); the
    message says why. Nothing was changed."""


class ReadFailed(RuntimeError):
    """One rank's stacks could not be read by one reader (its words)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A rank's process, as the store knows it (pid + start time name a process), and the
    file its helper writes to (None: no helper armed)."""

    rank: int
    pid: int
    started: float | None
    helper_file: Path | None = None


def helper_file(job_dir: Path, rank: int) -> Path:
    """Where a local rank's helper writes its stacks (in the job's 0700 directory)."""
    return job_dir / f"rank-{rank}.stacks"


def _is_alive(pid: int, started: float | None) -> bool:
    """Still the very process the store knows (pid + start time), and not a zombie. (As
    jobs/running/processes.py's process_is, which this room may not import: running/ calls
    the backend interface, whose stacks come from here.)"""
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def py_spy(setting: str = "") -> str | None:
    """The py-spy to run: the setting's path, else the one beside this interpreter (the
    package's dependency, in its environment), else $PATH's."""
    if setting:
        return setting if os.access(setting, os.X_OK) else None
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


@functools.lru_cache(maxsize=8)
def _has_native(exe: str) -> bool:
    try:
        out = subprocess.run(
            [exe, "dump", "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return "--native" in out.stdout


def check_native(setting: str = "") -> str:
    """The py-spy that reads native frames; StacksUnavailable otherwise."""
    exe = py_spy(setting)
    if exe is None or not _has_native(exe):
        raise StacksUnavailable(NATIVE_UNAVAILABLE)
    return exe


def _is_native(frame: dict[str, Any]) -> bool:
    name = str(frame.get("filename") or "")
    return not frame.get("line") and not name.endswith(".py") and not name.startswith("<")


def _code(file: str, line: int) -> str:
    """The source line (a file this process can read: the rank's own, on this machine)."""
    if file.startswith("<") or line <= 0:
        return ""
    return " ".join(linecache.getline(file, line).split())[:160]


def with_code(threads: list[ThreadStack]) -> list[ThreadStack]:
    """The user's frames with their source lines (what a summary shows)."""
    for thread in threads:
        thread.frames = [
            dataclasses.replace(f, code=_code(f.file, f.line)) if f.is_user else f
            for f in thread.frames
        ]
    return threads


def parse_py_spy(text: str, pid: int) -> list[ThreadStack]:
    threads = []
    for t in json.loads(text):
        frames = [
            Frame(
                name=str(f.get("name") or "?"),
                file=str(f.get("filename") or "?"),
                line=int(f.get("line") or 0),
                native=_is_native(f),
            )
            for f in t.get("frames") or []
        ]
        threads.append(
            ThreadStack(
                name=str(t.get("thread_name") or f"thread {t.get('os_thread_id')}"),
                ident=t.get("thread_id"),
                frames=frames,
                active=t.get("active"),
                gil=t.get("owns_gil"),
                main=t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread",
            )
        )
    return with_code(sorted(threads, key=lambda t: not t.main))


def read_py_spy(exe: str, pid: int, native: bool, timeout: float = READ_TIMEOUT) -> RankStacks:
    command = [exe, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "RUST_BACKTRACE": "0"},
        )
    except subprocess.TimeoutExpired:
        raise ReadFailed(f"py-spy did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise ReadFailed(f"py-spy could not run: {exc}") from None
    if out.returncode != 0:
        words = (out.stderr or out.stdout).split("Stack backtrace:")[0].strip()
        raise ReadFailed(" ".join(words.split())[:300] or f"py-spy exited {out.returncode}")
    try:
        threads = parse_py_spy(out.stdout, pid)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ReadFailed(f"py-spy's answer was not its JSON: {exc}") from None
    reader = "py-spy --native" if native else "py-spy"
    return RankStacks(rank=-1, pid=pid, reader=reader, threads=threads)


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str, main_ident: int | None) -> list[ThreadStack]:
    """faulthandler's dump_traceback(all_threads=True) text -> threads."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = int(head.group(2), 16)
            threads.append(
                ThreadStack(
                    name="MainThread" if ident == main_ident else f"thread {head.group(2)}",
                    ident=ident,
                    frames=[],
                    main=ident == main_ident,
                )
            )
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    return with_code(sorted(threads, key=lambda t: not t.main))


def read_helper(target: Target, timeout: float = HELPER_TIMEOUT) -> RankStacks:
    """Ask the rank's helper (SIGUSR2) to write its threads' stacks, and read them."""
    path = target.helper_file
    if path is None or not path.exists():
        raise ReadFailed("the rank's own stack helper is not armed (MLClusterConfig.stacks_helper)")
    try:
        main_ident: int | None = int(main_ident_path(path).read_text().strip())
    except (OSError, ValueError):
        main_ident = None
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ReadFailed(f"the rank's stack file cannot be opened: {exc}") from None
    with open(fd, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # one reader of a rank's helper at a time
        f.truncate(0)
        try:
            os.kill(target.pid, HELPER_SIGNAL)
        except OSError as exc:
            raise ReadFailed(f"the rank cannot be signalled: {exc}") from None
        deadline = time.monotonic() + timeout
        size, since = 0, time.monotonic()
        while time.monotonic() < deadline:
            now_size = os.fstat(f.fileno()).st_size
            if now_size != size:
                size, since = now_size, time.monotonic()
            elif size and time.monotonic() - since >= HELPER_SETTLE:
                break
            time.sleep(0.01)
        else:
            raise ReadFailed(
                f"the rank's helper wrote nothing within {timeout:g} s (was its SIGUSR2 "
                "handler replaced by the program's own?)"
            )
        f.seek(0)
        text = f.read().decode("utf-8", "replace")
    return RankStacks(
        rank=target.rank,
        pid=target.pid,
        reader=HELPER_READER,
        threads=parse_faulthandler(text, main_ident),
    )


def read_rank(
    target: Target,
    native: bool,
    reader: str,
    py_spy_setting: str,
    timeout: float = READ_TIMEOUT,
) -> RankStacks:
    """One rank's stacks: py-spy, then (reader "auto") the rank's helper, saying why."""
    if not _is_alive(target.pid, target.started):
        raise ReadFailed(f"its process (pid {target.pid}) has exited")
    exe = check_native(py_spy_setting) if native else py_spy(py_spy_setting)
    refused = "py-spy is not installed"
    if reader != "helper" and exe is not None:
        try:
            stacks = read_py_spy(exe, target.pid, native, timeout)
            stacks.rank = target.rank
            return stacks
        except ReadFailed as exc:
            if native or reader == "py-spy":
                raise
            refused = f"py-spy: {exc}"
    if native:
        raise StacksUnavailable(NATIVE_UNAVAILABLE)
    try:
        stacks = read_helper(target)
    except ReadFailed as exc:
        if reader == "helper":
            raise
        raise ReadFailed(f"{refused}; {exc}") from None
    if reader != "helper":
        stacks.reader = f"{HELPER_READER}; {refused}"
    return stacks


def read_targets(
    job_id: str,
    targets: list[Target],
    *,
    native: bool = False,
    reader: str = "auto",
    py_spy_setting: str = "",
    missing: dict[int, str] | None = None,
    why: str = "asked",
    timeout: float = READ_TIMEOUT,
) -> StackReport:
    """Every target read in parallel; those that could not be read are `missing`, with why."""
    if native:
        check_native(py_spy_setting)  # before anything is signalled or attached
    began = time.monotonic()
    report = StackReport(job=job_id, ranks=[], missing=dict(missing or {}), why=why, native=native)
    if targets:
        workers = min(len(targets), 16)

        def attempt(target: Target) -> RankStacks | ReadFailed:
            try:
                return read_rank(target, native, reader, py_spy_setting, timeout)
            except ReadFailed as exc:
                return exc

        # map, not futures: the outcomes come back as values (a future's .result() reads, to
        # tests/server/test_no_unpickling.py's call graph, like JobService.result).
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for target, outcome in zip(targets, pool.map(attempt, targets), strict=True):
                if isinstance(outcome, ReadFailed):
                    report.missing[target.rank] = str(outcome)
                else:
                    report.ranks.append(outcome)
    report.ranks.sort(key=lambda r: r.rank)
    linecache.clearcache()  # the next read sees the files as they are then
    report.seconds = time.monotonic() - began
    return report
