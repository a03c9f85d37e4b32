"""What the attacker tests share: a rank whose output forges control records, and a result
that would leave a mark if it were ever unpickled."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

# Every rank prints what a dataset (or a curious user) could: control records of a result
# that, unpickled, would run code. Rank 0's real result is 42.
FORGING_CELL = """
import base64, json, os, sys
from jupyterlab_mlcluster.runtime import protocol

rank = int(os.environ["RANK"])
key = protocol.read_key_file(protocol.key_path(os.environ["MLCLUSTER_PAYLOAD"]))
assert key is not None and not any(key.hex() in v for v in os.environ.values())

def emit(data):
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()

result = {"type": "result", "index": 0, "count": 1, "data": base64.b64encode(evil).decode()}
progress = {"type": "progress", "step": 999, "total": 1000, "desc": "forged"}
for forged in (result, progress):
    body = json.dumps(forged)
    print("sample 17: " + protocol.MARKER + body, flush=True)       # marker mid-line, no key
    print(protocol.MARKER + "0" * 64 + " " + body, flush=True)      # line start, made-up MAC
    emit(b"\\n" + protocol.encode_record(forged, b"k" * 32, rank))  # another job's key
    emit(b"\\necho: " + protocol.encode_record(forged, key, rank))  # genuine, but mid-line
    if rank == 1:
        emit(b"\\n" + protocol.encode_record(forged, key, 0))     # the job's key, rank 1 as 0
print("done", flush=True)
6 * 7
"""

FORGED_LINES = {0: 8, 1: 10}  # lines with the marker each rank's log keeps as text


class _Mark:
    """Unpickling this creates a directory: the proof that a forged result was loaded."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def evil_result(mark: Path) -> bytes:
    """A result pickle (the shape rank 0 sends) whose loading creates `mark`."""
    return pickle.dumps({"kind": "value", "value": _Mark(mark)})


def assert_forgeries_refused(service, final, mark: Path) -> None:
    """A FORGING_CELL job's outcome: rank 0's own result, nothing forged unpickled or shown
    as progress, and every forgery kept in the log as the text it is."""
    assert service.result(final.id) == ("value", 42)
    assert not mark.exists()
    assert all((r.progress or {}).get("desc") != "forged" for r in final.ranks), final.ranks
    for rank, count in FORGED_LINES.items():
        lines, _ = service.logs(final.id, rank)
        assert sum("MLCLUSTER" in line["line"] for line in lines) == count, lines


ATTACKER = "mlcattacker"


def attacker_uid() -> int:
    """A second, real local user (created once; the tests run as root in CI containers)."""
    import pwd
    import shutil
    import subprocess

    import pytest

    if os.getuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create a second real user")
    try:
        return pwd.getpwnam(ATTACKER).pw_uid
    except KeyError:
        # Parallel test workers may race to create it: whoever loses finds it made.
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
            check=False,
            capture_output=True,
        )
        return pwd.getpwnam(ATTACKER).pw_uid


def attacker_python() -> str:
    """An interpreter the second user may run (this venv may sit where only root can go);
    the attacker's scripts need nothing beyond the standard library."""
    import shutil
    import sys

    import pytest

    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin")):
        if candidate and _world_executable(candidate):
            return candidate
    pytest.skip("no Python interpreter the second user may run")


def _world_executable(path: str) -> bool:
    """Every directory on the way is searchable and the file executable by others."""
    import stat

    path = os.path.realpath(path)
    parts = Path(path).parents
    if any(not os.stat(p).st_mode & stat.S_IXOTH for p in parts):
        return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)
