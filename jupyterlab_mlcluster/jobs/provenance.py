"""What a job keeps for `mlcluster export` (export/): what ran, the names it was pushed, and
the environment it was submitted from, pinned. Written at every submit (jobs/service.py,
provenance.json), so cheap: the requirements come from the names of the `.dist-info`
directories on sys.path alone (no distribution's metadata is read, nor importlib.metadata
or packaging imported: ~200 ms of a CLI submit), remembered while no directory changed."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Any

_pinned: tuple[tuple[Any, ...], list[str]] | None = None
SCRIPT_FILE = "script.py"  # a script job's text as submitted
MAX_SCRIPT_BYTES = 4 << 20  # a longer script is not kept (its export says so)


def provenance(kind: str, filename: str, pushed: Iterable[str]) -> dict[str, Any]:
    return {
        "kind": kind,
        "filename": filename,
        "pushed": sorted(pushed),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "requirements": pinned_requirements(),
    }


def script_text(filename: str, cwd: str | None) -> bytes | None:
    """A script job's text as it is at submit: its ranks read the file when they start, and
    an export of the job must not read it as it is by then (edited since). None when it
    cannot be read or is over MAX_SCRIPT_BYTES."""
    try:
        with open(os.path.join(cwd or os.getcwd(), filename), "rb") as f:
            data = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_SCRIPT_BYTES else None


def _state(paths: list[str]) -> tuple[Any, ...]:
    """What changes when pip installs or removes anything on `paths`: their mtimes."""
    state: list[tuple[str, int | None]] = []
    for path in paths:
        try:
            state.append((path, os.stat(path or ".").st_mtime_ns))
        except OSError:
            state.append((path, None))
    return tuple(state)


def pinned_requirements(paths: Iterable[str] | None = None) -> list[str]:
    """`name==version` of every distribution importable from `paths` (sys.path), the first
    of a name winning as for imports (names normalised as PEP 503 says)."""
    global _pinned
    search = list(paths if paths is not None else sys.path)
    state = _state(search)
    if _pinned is not None and _pinned[0] == state:
        return list(_pinned[1])
    found: dict[str, str] = {}
    for entry in search:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in sorted(names):
            if not name.endswith(".dist-info"):
                continue
            dist, _, version = name[: -len(".dist-info")].partition("-")
            key = re.sub(r"[-_.]+", "-", dist).lower()
            if key and version and key not in found:
                found[key] = version
    pinned = [f"{name}=={version}" for name, version in sorted(found.items())]
    _pinned = (state, pinned)
    return list(pinned)
