"""A job pod's first step: install what the notebook added to its image, then run the rank.

`python -m jupyterlab_mlcluster.runtime.sync_packages COMMAND...` (built by
backends/kubernetes/packages.py): installs the requirements in `$MLCLUSTER_SYNC_PACKAGES`
(a JSON list, `name==version`: what the notebook's environment gained since its pod started,
environment.py) with pip, `--no-deps` (the list already holds every dependency pip added in
the notebook, so the pod ends up with exactly the notebook's set), then replaces itself with
COMMAND (the rank's worker, or torchrun). Where from:
- `$MLCLUSTER_WHEEL_CACHE`, a directory on a volume the pods share, holding wheels the
  notebook put there: alone (`--no-index`) when it has a wheel for every requirement;
- else the package index the notebook uses (pip's own configuration: the image's pip.conf,
  and `PIP_INDEX_URL`/`PIP_EXTRA_INDEX_URL`/`PIP_TRUSTED_HOST` the job carries over), with
  the cache as extra links.

It says what it installed and how long it took (a line in the rank's log and a signed
`packages` record for the job's supervisor). When pip fails, the rank fails before it ran
anything: its error (pip's own message) is the job's error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import reporting

REQUIREMENTS_ENV = "MLCLUSTER_SYNC_PACKAGES"
CACHE_ENV = "MLCLUSTER_WHEEL_CACHE"
PIP_ERROR_LINES = 40  # of pip's output in the job's error
PIP_TIMEOUT = 1800.0  # seconds; a hung index fails the job instead of holding its GPUs
_PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;@]+)$")


class PackageSyncError(RuntimeError):
    """pip could not install what the notebook added."""


def _wheel_key(name: str, version: str) -> str:
    # A wheel's file name starts with the name (runs of -_. as '_') and version (PEP 427).
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version.replace('-', '_').lower()}-"


def cache_has_all(cache: Path, requirements: list[str]) -> bool:
    """Whether the cache holds a wheel for every (pinned) requirement."""
    try:
        wheels = [p.name.lower() for p in cache.iterdir() if p.name.endswith(".whl")]
    except OSError:
        return False
    for req in requirements:
        match = _PINNED.match(req)
        if match is None:
            return False  # `name @ url`: only its URL has it
        key = _wheel_key(match["name"], match["version"])
        if not any(w.startswith(key) for w in wheels):
            return False
    return True


def pip_command(requirements: list[str], cache: Path | None) -> tuple[list[str], str]:
    """The pip invocation and where it installs from ('the wheel cache', 'the package index')."""
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
    source = "the package index"
    if cache is not None and cache.is_dir():
        command += ["--find-links", str(cache)]
        if cache_has_all(cache, requirements):
            command.append("--no-index")
            source = "the wheel cache"
    return command + requirements, source


def describe(requirements: list[str]) -> str:
    shown = ", ".join(requirements[:5]) + (", ..." if len(requirements) > 5 else "")
    count = len(requirements)
    return f"{count} package{'s' if count != 1 else ''} ({shown})"


def install(requirements: list[str], cache: Path | None) -> tuple[float, str]:
    """Run pip; (seconds, source). PackageSyncError with pip's output when it fails."""
    command, source = pip_command(requirements, cache)
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


def main(argv: list[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    if not command:
        print("usage: python -m jupyterlab_mlcluster.runtime.sync_packages COMMAND...")
        return 2
    reporting.configure(rank=pod_rank(os.environ))
    try:
        requirements = json.loads(os.environ.get(REQUIREMENTS_ENV) or "[]")
        if not isinstance(requirements, list) or not all(
            isinstance(r, str) and r and not r.startswith("-") for r in requirements
        ):
            raise ValueError("not a list of requirements")
    except ValueError as exc:
        _report_failure(PackageSyncError(f"${REQUIREMENTS_ENV} is malformed: {exc}"))
        return 1
    if requirements:
        cache = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else None
        reporting.send({"type": "packages", "state": "installing", "packages": requirements})
        try:
            seconds, source = install(requirements, cache)
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
