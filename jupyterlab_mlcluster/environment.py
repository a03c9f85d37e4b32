"""The notebook's own Python environment: what the user installed since the pod started.

A Kubernetes job runs the notebook pod's image by default, as built: a package the user
`pip install`ed into the kernel's environment afterwards is not in it. So when the pod starts
(the server extension, and each kernel loading the magics, call `record_baseline`) the
distributions installed then are recorded, once per pod and environment; at submit,
`changes_since_baseline` lists what was added or changed since, as pip requirements, for
the job's pods to install before the code runs (backends/kubernetes/packages.py builds
that step, runtime/sync_packages.py runs it).

- Once per pod: a baseline is keyed by the environment (sys.prefix) and by the container's
  start (node boot id + start time of the container's PID 1), so a restarted pod records
  afresh, while the files live in the job store (the user's own directory).
- The user site directory (~/.local, on the notebook's home volume, not in the image) never
  counts as the image's: what lies there is always synced.
- No baseline (not recorded, or unreadable): nothing is synced; never a guess.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import site
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from .runtime.atomic import write_whole

log = logging.getLogger("jupyterlab_mlcluster.environment")

BASELINE_DIR = "environments"  # under the job store's root
BASELINE_MAX_AGE = 30 * 86400  # older baselines (of pods long gone) are removed
MAX_BASELINE_BYTES = 4 * 2**20


def container_start() -> str:
    """Who this container start is: the node's boot id and the start time of PID 1 (the
    container's first process; the init process outside containers)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/1/stat"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            text = ""
        if path.endswith("stat") and ")" in text:
            # fields after the command name; field 22 of the file is the start time
            text = text.rsplit(")", 1)[1].split()[19]
        parts.append(text)
    return ":".join(parts)


def baseline_path(store_dir: str | os.PathLike[str], prefix: str | None = None) -> Path:
    env = os.path.realpath(prefix or sys.prefix)
    key = hashlib.sha256(f"{env}\0{container_start()}".encode()).hexdigest()[:24]
    return Path(store_dir) / BASELINE_DIR / f"{key}.json"


def _user_site() -> str | None:
    with contextlib.suppress(Exception):
        return os.path.realpath(site.getusersitepackages())
    return None


_scanned: tuple[Any, dict[str, dict[str, Any]]] | None = None


def _paths_state(paths: list[str]) -> tuple[Any, ...]:
    """What changes when pip installs or removes anything on `paths`: the directories'
    mtimes (a .dist-info directory comes or goes)."""
    state: list[tuple[str, int | None]] = []
    for path in paths:
        try:
            state.append((path, os.stat(path or ".").st_mtime_ns))
        except OSError:
            state.append((path, None))
    return tuple(state)


def installed(paths: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """canonical name -> {"version", "user_site", "direct_url"} of the distributions
    importable from `paths` (sys.path): the first of a name wins, as for imports. The scan
    (~0.2 s for 200 distributions) is reused while no directory on `paths` changed."""
    global _scanned
    search = list(paths if paths is not None else sys.path)
    state = _paths_state(search)
    if _scanned is not None and _scanned[0] == state:
        return _scanned[1]
    found = _scan(search)
    _scanned = (state, found)
    return found


def _scan(search: list[str]) -> dict[str, dict[str, Any]]:
    user_site = _user_site()
    found: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions(path=search):
        try:
            name = canonicalize_name(dist.metadata["Name"] or "")
            version = dist.version
        except Exception:  # noqa: BLE001 - a broken .dist-info: pip would not see it either
            continue
        if not name or not version or name in found:
            continue
        location = os.path.realpath(str(dist.locate_file("")))
        direct_url = None
        with contextlib.suppress(Exception):
            text = dist.read_text("direct_url.json")
            direct_url = json.loads(text) if text else None
        found[name] = {
            "version": version,
            "user_site": bool(user_site) and location == user_site,
            "direct_url": direct_url if isinstance(direct_url, dict) else None,
        }
    return found


def record_baseline(store_dir: str | os.PathLike[str]) -> Path | None:
    """Record this environment's distributions as the image's, unless this pod already
    did (the first record wins). Returns the baseline's path; None when it cannot be
    written (then nothing will be synced)."""
    path = baseline_path(store_dir)
    if path.exists():
        return path
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _prune(path.parent)
        image = {
            name: info["version"] for name, info in installed().items() if not info["user_site"]
        }
        body = json.dumps(
            {"prefix": os.path.realpath(sys.prefix), "recorded": time.time(), "image": image}
        ).encode()
        with contextlib.suppress(FileExistsError):  # another process's record: the first wins
            write_whole(path, body, replace=False)
    except OSError as exc:
        log.warning("cannot record the environment's packages in %s: %s", path, exc)
        return None
    return path


def _prune(directory: Path) -> None:
    cutoff = time.time() - BASELINE_MAX_AGE
    for old in directory.glob("*.json"):
        with contextlib.suppress(OSError):
            if old.lstat().st_mtime < cutoff:
                old.unlink()


def read_baseline(store_dir: str | os.PathLike[str]) -> dict[str, str] | None:
    """name -> version recorded when this pod started; None without a (readable) one."""
    path = baseline_path(store_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(MAX_BASELINE_BYTES))
        image = data["image"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(image, dict):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # in use: never pruned as a gone pod's
    return {str(k): str(v) for k, v in image.items()}


def requirement(name: str, info: dict[str, Any]) -> str | None:
    """The pip requirement that installs this distribution as the notebook has it; None
    for one a pod cannot get (an editable install: its source is on the notebook's disk)."""
    direct = info.get("direct_url") or {}
    if (direct.get("dir_info") or {}).get("editable"):
        return None
    vcs = direct.get("vcs_info")
    if vcs and direct.get("url") and vcs.get("vcs") and vcs.get("commit_id"):
        return f"{name} @ {vcs['vcs']}+{direct['url']}@{vcs['commit_id']}"
    return f"{name}=={info['version']}"


def changes(
    baseline: dict[str, str], now: dict[str, dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """(requirements of what was added or changed since `baseline`, names of those that
    cannot be synced). Removals are not synced: a pod's image keeps what it has."""
    wanted, skipped = [], []
    for name in sorted(now):
        info = now[name]
        if baseline.get(name) == info["version"] and not info["user_site"]:
            continue
        req = requirement(name, info)
        if req is None:
            skipped.append(name)
        else:
            wanted.append(req)
    return wanted, skipped


def changes_since_baseline(
    store_dir: str | os.PathLike[str],
) -> tuple[list[str], list[str]] | None:
    """What this environment gained since the pod started (see `changes`); None when no
    baseline was recorded for this pod."""
    baseline = read_baseline(store_dir)
    if baseline is None:
        return None
    return changes(baseline, installed())


def local_archives(names: Iterable[str]) -> dict[str, str]:
    """canonical name -> local file a distribution was installed from (`pip install
    ./pkg.whl`, PEP 610's direct_url.json), for the wheel cache: no index has those."""
    wanted = {canonicalize_name(n) for n in names}
    found = {}
    for name, info in installed().items():
        direct = info.get("direct_url") or {}
        url = str(direct.get("url") or "")
        if name in wanted and "archive_info" in direct and url.startswith("file://"):
            found[name] = url[len("file://") :]
    return found


PIP_TIMEOUT = 120.0  # seconds for each pip run at submit; past it, the pods use the index


PIP_CONFIG_TTL = 60.0  # seconds a `pip config list` answer is reused (a sweep submits many jobs)
_pip_config_seen: tuple[float, Any, str] | None = None


def pip_config() -> str:
    """`pip config list` of this environment (files and PIP_* variables), '' on failure;
    reused for PIP_CONFIG_TTL seconds while the PIP_* variables stay the same."""
    global _pip_config_seen
    key = sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_"))
    now = time.monotonic()
    seen = _pip_config_seen
    if seen is not None and seen[1] == key and now - seen[0] < PIP_CONFIG_TTL:
        return seen[2]
    text = _read_pip_config()
    _pip_config_seen = (now, key, text)
    return text


def _read_pip_config() -> str:
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PIP_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot read pip's configuration: %s", exc)
        return ""
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else ""


def _has_matching(directory: Path, requirement: str) -> bool:
    from .runtime.sync_packages import cache_wheels

    name = requirement.split("==")[0]
    return any(wheel_matches_installed(w, name) for w in cache_wheels(directory, requirement))


def fill_wheel_cache(cache: str | os.PathLike[str], requirements: list[str]) -> list[str]:
    """Put a wheel of each requirement the cache lacks into it: the file it was installed
    from, else what `pip wheel` gets from this environment's index (pip's own HTTP cache
    usually has it: the user just installed it). Returns notes on what could not be put
    there (the pods then go to the index for it).

    The cache is shared: nothing is written through a name someone else chose. Wheels are
    made in a private directory of ours inside it (random name, 0700) and renamed into
    place (a rename replaces a planted link, it never follows it)."""
    import shutil
    import tempfile

    directory = Path(cache)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"cannot use the wheel cache {directory}: {exc.strerror}"]
    missing = [r for r in requirements if not _has_matching(directory, r)]
    if not missing:
        return []
    try:
        private = Path(tempfile.mkdtemp(prefix=".mlcluster-", dir=directory))
    except OSError as exc:
        return [f"cannot write to the wheel cache {directory}: {exc.strerror}"]
    notes: list[str] = []
    try:
        archives = local_archives(r.split("==")[0].split(" @ ")[0] for r in missing)
        for path in archives.values():
            source = Path(path)
            if source.suffix == ".whl" and source.is_file():
                try:
                    shutil.copyfile(source, private / source.name)
                except OSError as exc:
                    notes.append(f"could not copy {source.name} into the wheel cache: {exc}")
        pinned = [r for r in missing if "==" in r and r.split("==")[0] not in archives]
        if pinned:
            notes += _pip_wheel(pinned, private)
        for wheel in private.glob("*.whl"):
            try:
                os.replace(wheel, directory / wheel.name)  # whole, or not there
            except OSError as exc:
                notes.append(f"could not put {wheel.name} in the wheel cache: {exc.strerror}")
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return notes


def _pip_wheel(requirements: list[str], directory: Path) -> list[str]:
    """`pip wheel` into `directory`; notes on failure."""
    import subprocess

    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-input",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                "--wheel-dir",
                str(directory),
                *requirements,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PIP_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"could not fill the wheel cache: {exc}"]
    if done.returncode == 0:
        return []
    text = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    errors = [line for line in text.splitlines() if line.startswith("ERROR")]
    why = errors[0] if errors else f"pip wheel exited {done.returncode}"
    return [f"could not put every wheel in the cache (the pods use the index for the rest): {why}"]


def wheel_matches_installed(wheel: Path, name: str) -> bool:
    """Whether every file in the wheel is, byte for byte, one this environment installed for
    `name` (the sha256 its RECORD has for it): the package's files, its .dist-info (entry
    points make scripts) and .data/purelib|platlib (site-packages, where a .pth runs code).
    A wheel with other .data (scripts, rewritten on install, or files outside
    site-packages) cannot be compared and does not match."""
    import base64
    import csv
    import hashlib
    import zipfile

    dist = next(iter(metadata.distributions(name=name, path=sys.path)), None)
    record = dist.read_text("RECORD") if dist is not None else None
    if not record:
        return False
    expected = {row[0]: row[1] for row in csv.reader(record.splitlines()) if len(row) >= 2}
    checked = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                path = member.filename
                top, _, rest = path.partition("/")
                if member.is_dir() or (top.endswith(".dist-info") and rest == "RECORD"):
                    continue
                if top.endswith(".data"):
                    scheme, _, inner = rest.partition("/")
                    if scheme not in ("purelib", "platlib") or not inner:
                        return False
                    path = inner
                digest = hashlib.sha256()
                with archive.open(member) as f:
                    for block in iter(functools.partial(f.read, 1 << 20), b""):
                        digest.update(block)
                text = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
                if expected.get(path) != f"sha256={text}":
                    return False
                checked += 1
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return False
    return checked > 0


def checked_wheels(
    cache: str | os.PathLike[str], requirements: list[str]
) -> tuple[dict[str, list[tuple[str, int, str]]] | None, list[str]]:
    """requirement -> (file name, size, sha256) of the cache's wheels whose files are the
    notebook's installed ones, for the pods to read by that exact name and size and pin by
    that hash (the cache is on a volume others may write). None, with notes saying why,
    unless every requirement has such a wheel: then the pods use the index."""
    from .runtime.sync_packages import cache_wheels, file_digest

    directory = Path(cache)
    checked: dict[str, list[tuple[str, int, str]]] = {}
    notes: list[str] = []
    for req in requirements:
        name = req.split("==")[0]
        wheels = cache_wheels(directory, req)
        good = [w for w in wheels if wheel_matches_installed(w, name)]
        notes += [
            f"the wheel cache's {w.name} is not what the notebook has installed: not used"
            for w in wheels
            if w not in good
        ]
        if not good:
            notes.append(
                f"no wheel of {req} in the cache matches the notebook's: the pods use the index"
            )
            return None, notes
        checked[req] = []
        try:
            for wheel in good:
                digest, size = file_digest(wheel)
                checked[req].append((wheel.name, size, digest))
        except OSError as exc:
            return None, [*notes, f"cannot read the wheel cache: {exc.strerror}"]
    return checked, notes
