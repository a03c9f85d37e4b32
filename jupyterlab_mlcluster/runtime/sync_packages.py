"""A job pod's first step: install what the notebook added to its image, then run the rank.

`python -m jupyterlab_mlcluster.runtime.sync_packages COMMAND...` (built by
backends/kubernetes/packages.py): installs the requirements in `$MLCLUSTER_SYNC_PACKAGES`
(a JSON list, `name==version`: what the notebook's environment gained since its pod started,
environment.py) with pip, `--no-deps` (the list already holds every dependency pip added in
the notebook, so the pod ends up with exactly the notebook's set), then replaces itself with
COMMAND (the rank's worker, or torchrun). Where from:
- `$MLCLUSTER_WHEEL_CACHE`, a directory on a volume the pods share, holding wheels the
  notebook put there and checked at submit (`$MLCLUSTER_WHEEL_HASHES`: their sha256;
  `$MLCLUSTER_WHEEL_FILES`: their file names and sizes): used alone (`--no-index
  --require-hashes`) when it still holds such a wheel for every requirement. Others may
  write that volume: only the recorded files are read (no listing: nothing planted beside
  them is ever looked at), and pip reads only copies in a private directory whose sha256 is
  the checked one; a wheel whose size or hash differs is never copied nor installed (and said);
- else the package index the notebook uses (pip's own configuration: the image's pip.conf,
  and `PIP_INDEX_URL`/`PIP_EXTRA_INDEX_URL`/`PIP_TRUSTED_HOST` the job carries over), without
  the cache; pinned (`--require-hashes`) to the checked wheels' sha256 when the cache had
  them at submit, so that the index can serve those very files or fail the job, saying the
  cache lost them, never another build of the same name and version.

It says what it installed and how long it took (a line in the rank's log and a signed
`packages` record for the job's supervisor). When pip fails, the rank fails before it ran
anything: its error (pip's own message) is the job's error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import reporting

REQUIREMENTS_ENV = "MLCLUSTER_SYNC_PACKAGES"
CACHE_ENV = "MLCLUSTER_WHEEL_CACHE"
HASHES_ENV = "MLCLUSTER_WHEEL_HASHES"  # requirement -> sha256 of the cache wheels checked at submit
FILES_ENV = "MLCLUSTER_WHEEL_FILES"  # requirement -> [file name, size] of those wheels
PIP_ERROR_LINES = 40  # of pip's output in the job's error
PIP_TIMEOUT = 1800.0  # seconds; a hung index fails the job instead of holding its GPUs
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;@]+)$")
_WHEEL_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*\.whl$")  # a name in the cache, no path


class PackageSyncError(RuntimeError):
    """pip could not install what the notebook added."""


def _wheel_key(name: str, version: str) -> str:
    # A wheel's file name starts with the name (runs of -_. as '_') and version (PEP 427).
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version.replace('-', '_').lower()}-"


def cache_wheels(cache: Path, requirement: str) -> list[Path]:
    """The wheels in the cache for a pinned requirement (any platform tag)."""
    match = _PINNED.match(requirement)
    if match is None:
        return []  # `name @ url`: only its URL has it
    key = _wheel_key(match["name"], match["version"])
    try:
        named = [p for p in cache.iterdir() if p.name.lower().startswith(key)]
    except OSError:
        return []
    # Regular files only: the cache is shared, a link there points wherever its maker chose.
    return sorted(p for p in named if p.suffix == ".whl" and _regular(p))


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256, size) of the bytes read from a regular file (no link followed)."""
    digest, size = hashlib.sha256(), 0
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(0, "not a regular file", str(path))
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def verified_copies(
    cache: Path | None,
    requirements: list[str],
    hashes: dict[str, list[str]],
    files: dict[str, list[tuple[str, int]]],
    private: Path,
) -> tuple[list[str], list[str]]:
    """Copy into `private` (a directory of ours, 0700) the wheels the notebook checked at
    submit: the cache files it recorded (`files`: exact name and size), whose copies hash to
    what it checked; the requirements left without one, and what to say of the files not
    used. Nothing else in the shared cache is listed or read: no number of files planted
    there, named like the wanted wheel, can hide it. pip reads the copies alone: a wheel
    someone planted or swapped in the cache is never offered to it (it would pick one with
    a better tag, then fail its hash check), and what is hashed is what pip installs."""
    if cache is None or not hashes:
        return list(requirements), []
    missing, notes = [], []
    for req in requirements:
        allowed = set(hashes.get(req) or ())
        if not files.get(req):
            notes.append(f"no wheel file of {req} was recorded at submit: the cache is not read")
        for name, size in files.get(req) or ():
            if _WHEEL_FILE.match(name) is None:
                continue
            copy = private / name
            if _copy_hashed(cache / name, copy, allowed, size) in allowed:
                break  # one checked copy is all pip needs: the rest is not read
            copy.unlink(missing_ok=True)
            notes.append(
                f"the wheel cache's {name} is not the one the notebook checked at submit "
                f"({_why_not(cache / name, size)}): not used"
            )
        else:
            missing.append(req)
    return missing, notes


def _why_not(path: Path, size: int) -> str:
    try:
        found = path.lstat()
    except OSError:
        return "gone"
    if not stat.S_ISREG(found.st_mode):
        return "not a regular file"
    if found.st_size != size:
        return f"{found.st_size} bytes, {size} at submit"
    return "another sha256"


# The most of one cache file read to hash it (the largest CUDA wheels are a few GB).
MAX_WHEEL_BYTES = 16 << 30


def _copy_hashed(source: Path, target: Path, allowed: set[str], size: int) -> str | None:
    """Copy a regular file (no link followed, no FIFO waited on) of `size` bytes to `target`,
    new, when it hashes to one of `allowed`; the sha256 of what was copied, or None where it
    could not be read, has another size or is not allowed. The file is hashed where it lies
    first, no further than its size when opened (a file someone keeps growing ends there),
    and copied only then, at most the bytes that were hashed: a huge or growing file planted
    in the cache costs a read, never the pod's disk. The copy is what is checked again and
    installed."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            if not stat.S_ISREG(opened.st_mode) or not opened.st_size == size <= MAX_WHEEL_BYTES:
                return None
            digest, hashed = hashlib.sha256(), 0
            while hashed < size:
                block = f.read(min(1 << 20, size - hashed))
                if not block:
                    break
                hashed += len(block)
                digest.update(block)
            if digest.hexdigest() not in allowed:
                return None
            f.seek(0)
            digest, left = hashlib.sha256(), hashed
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(out, "wb") as w:
                while left > 0:
                    block = f.read(min(1 << 20, left))
                    if not block:
                        break
                    left -= len(block)
                    digest.update(block)
                    w.write(block)
    except OSError:
        return None
    return digest.hexdigest()


def pip_command(
    requirements: list[str],
    cache: Path | None,
    hashes: dict[str, list[str]],
    workdir: Path,
    files: dict[str, list[tuple[str, int]]] | None = None,
) -> tuple[list[str], str, list[str]]:
    """The pip invocation, where it installs from ('the wheel cache', 'the package index...')
    and notes. The cache's verified copies in `workdir` (private) only, where there is one
    for every requirement; else the index alone. Whenever the notebook checked wheels at
    submit (`hashes`), every one is pinned by that hash (`--require-hashes`, so pip checks
    again as it reads them), from the index too: what the index serves under that name and
    version is installed only when it is the very file the notebook checked."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--progress-bar",
        "off",
    ]
    copies = workdir / "wheels"
    copies.mkdir(mode=0o700)
    missing, notes = verified_copies(cache, requirements, hashes, files or {}, copies)
    if not hashes:
        return command + requirements, "the package index", notes
    lines = [
        " ".join([req, *(f"--hash=sha256:{h}" for h in hashes.get(req, ()) if _HEX64.match(h))])
        for req in requirements
    ]
    pinned = workdir / "requirements.txt"
    pinned.write_text("\n".join(lines) + "\n")
    command += ["--require-hashes", "-r", str(pinned)]
    if not missing:
        return command + ["--no-index", "--find-links", str(copies)], "the wheel cache", notes
    shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    source = (
        f"the package index, pinned to the sha256 the notebook checked at submit (the wheel "
        f"cache holds no checked wheel of {shown})"
    )
    return command, source, notes


def describe(requirements: list[str]) -> str:
    shown = ", ".join(requirements[:5]) + (", ..." if len(requirements) > 5 else "")
    count = len(requirements)
    return f"{count} package{'s' if count != 1 else ''} ({shown})"


def install(
    requirements: list[str],
    cache: Path | None,
    hashes: dict[str, list[str]] | None = None,
    files: dict[str, list[tuple[str, int]]] | None = None,
) -> tuple[float, str]:
    """Run pip; (seconds, source). PackageSyncError with pip's output when it fails."""
    with tempfile.TemporaryDirectory(prefix="mlcluster-sync-") as workdir:
        command, source, notes = pip_command(
            requirements, cache, hashes or {}, Path(workdir), files
        )
        for note in notes:
            print(f"[mlcluster] {note}", flush=True)
        return _run_pip(command, requirements, source)


def _run_pip(command: list[str], requirements: list[str], source: str) -> tuple[float, str]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=PIP_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise PackageSyncError(
            f"pip did not finish installing {describe(requirements)} within {PIP_TIMEOUT:.0f} s"
        ) from None
    except OSError as exc:
        raise PackageSyncError(f"cannot run pip: {exc}") from None
    seconds = time.monotonic() - started
    if done.returncode != 0:
        output = done.stdout.decode("utf-8", "replace").splitlines()
        errors = [line for line in output if line.startswith("ERROR")]
        summary = errors[0][len("ERROR:") :].strip() if errors else f"exit {done.returncode}"
        tail = "\n".join(output[-PIP_ERROR_LINES:])
        raise PackageSyncError(
            f"pip could not install {describe(requirements)} from {source}: {summary}\n{tail}"
        )
    return seconds, source


def pod_rank(env: dict[str, str] | os._Environ) -> int:
    """The rank whose log lines this step's are: the pod's rank, or in a pod of several
    ranks (torchrun starts after this step) its first, to which unprefixed lines belong."""
    per_node, node = env.get("PET_NPROC_PER_NODE", ""), env.get("PET_NODE_RANK", "")
    if per_node.isdigit() and int(per_node) > 1 and node.isdigit():
        return int(node) * int(per_node)
    rank = env.get("RANK", "0")
    return int(rank) if rank.isdigit() else 0


def _report_failure(exc: PackageSyncError) -> None:
    message = str(exc)
    first = message.splitlines()[0]
    print(f"[mlcluster] {message}", flush=True)
    reporting.send(
        {
            "type": "error",
            "rank": pod_rank(os.environ),
            "exc_type": "PackageSyncError",
            "message": first,
            "traceback": f"PackageSyncError: {message}\n",
            "timestamp": time.time(),
            "pid": os.getpid(),
        }
    )


def _files(data: object) -> dict[str, list[tuple[str, int]]]:
    """$MLCLUSTER_WHEEL_FILES read: requirement -> [(file name in the cache, size)]."""
    if not isinstance(data, dict):
        raise ValueError("not a mapping of requirements to wheel files")
    files: dict[str, list[tuple[str, int]]] = {}
    for req, entries in data.items():
        if not isinstance(entries, list):
            raise ValueError(f"{req}: not a list of [file name, size]")
        for entry in entries:
            name, size = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
            if not (isinstance(name, str) and _WHEEL_FILE.match(name)):
                raise ValueError(f"{req}: {entry!r} is not [a wheel's file name, its size]")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValueError(f"{req}: {entry!r} is not [a wheel's file name, its size]")
            files.setdefault(req, []).append((name, size))
    return files


def main(argv: list[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m jupyterlab_mlcluster.runtime.sync_packages COMMAND...")
        return 2
    reporting.configure(rank=pod_rank(os.environ))
    try:
        requirements = json.loads(os.environ.get(REQUIREMENTS_ENV) or "[]")
        if not isinstance(requirements, list) or not all(
            isinstance(r, str) and r and not r.startswith("-") and "\n" not in r and "\r" not in r
            for r in requirements
        ):
            raise ValueError("not a list of requirements")
    except ValueError as exc:
        _report_failure(PackageSyncError(f"${REQUIREMENTS_ENV} is malformed: {exc}"))
        return 1
    try:
        hashes = json.loads(os.environ.get(HASHES_ENV) or "{}")
        if not isinstance(hashes, dict) or not all(
            isinstance(v, list) and all(isinstance(h, str) and _HEX64.match(h) for h in v)
            for v in hashes.values()
        ):
            raise ValueError("not a mapping of requirements to sha256 digests")
        if hashes and not all(_PINNED.match(r) and hashes.get(r) for r in requirements):
            raise ValueError("hashes pin every requirement, name==version, or none")
    except ValueError as exc:
        _report_failure(PackageSyncError(f"${HASHES_ENV} is malformed: {exc}"))
        return 1
    try:
        files = _files(json.loads(os.environ.get(FILES_ENV) or "{}"))
    except ValueError as exc:
        _report_failure(PackageSyncError(f"${FILES_ENV} is malformed: {exc}"))
        return 1
    if requirements:
        cache = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else None
        reporting.send({"type": "packages", "state": "installing", "packages": requirements})
        try:
            seconds, source = install(requirements, cache, hashes, files)
        except PackageSyncError as exc:
            _report_failure(exc)
            return 1
        text = f"installed {describe(requirements)} from {source} in {seconds:.1f} s"
        print(f"[mlcluster] {text}", flush=True)
        reporting.send(
            {
                "type": "packages",
                "state": "installed",
                "packages": requirements,
                "seconds": round(seconds, 3),
                "source": source,
            }
        )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"[mlcluster] cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
