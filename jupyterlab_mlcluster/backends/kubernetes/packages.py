"""The notebook's packages in job pods, as pure functions: the pod's start step, its
variables and the wheel cache's volume (runtime/sync_packages.py runs the step in the pod;
environment.py finds what to install; backend.py decides, at submit, from the notebook pod).

A pod of a job whose image is the notebook's own starts with
`python -m jupyterlab_mlcluster.runtime.sync_packages <the rank's command>`: it installs the
requirements, then becomes the rank's command (the worker, or torchrun for a packed pod).
A wheel cache on a volume the notebook mounts (a PersistentVolumeClaim) is mounted in the
pods at the same path, read-only, with the same subPath.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SYNC_MODULE = "jupyterlab_mlcluster.runtime.sync_packages"
REQUIREMENTS_ENV = "MLCLUSTER_SYNC_PACKAGES"
CACHE_ENV = "MLCLUSTER_WHEEL_CACHE"
HASHES_ENV = "MLCLUSTER_WHEEL_HASHES"
FILES_ENV = "MLCLUSTER_WHEEL_FILES"
CACHE_VOLUME = "wheel-cache"
# pip's own variables for the index the notebook uses (pip reads them in the pod).
INDEX_SETTINGS = {
    "index-url": "PIP_INDEX_URL",
    "extra-index-url": "PIP_EXTRA_INDEX_URL",
    "trusted-host": "PIP_TRUSTED_HOST",
}


@dataclasses.dataclass(frozen=True)
class PackageSync:
    """What a job's pods install before the rank runs, and from where (stored in the plan)."""

    requirements: tuple[str, ...]
    index: tuple[tuple[str, str], ...] = ()  # (pip variable, value), credentials removed
    cache_path: str | None = None  # the wheel cache's directory, the same in every pod
    cache_claim: str | None = None  # its PersistentVolumeClaim
    cache_mount: str | None = None  # where the notebook mounts the claim (the pods too)
    cache_sub_path: str | None = None
    # requirement -> sha256 of its wheels in the cache, checked by the notebook at submit
    cache_hashes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # requirement -> (file name, size) of those wheels: the pods read these files alone
    cache_files: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    notes: tuple[str, ...] = ()  # said in the job's log when it starts

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PackageSync | None:
        if not data:
            return None
        return cls(
            requirements=tuple(data.get("requirements") or ()),
            index=tuple(tuple(pair) for pair in data.get("index") or ()),
            cache_path=data.get("cache_path"),
            cache_claim=data.get("cache_claim"),
            cache_mount=data.get("cache_mount"),
            cache_sub_path=data.get("cache_sub_path"),
            cache_hashes=tuple(
                (str(req), tuple(hashes)) for req, hashes in data.get("cache_hashes") or ()
            ),
            cache_files=tuple(
                (str(req), tuple((str(name), int(size)) for name, size in wheels))
                for req, wheels in data.get("cache_files") or ()
            ),
            notes=tuple(data.get("notes") or ()),
        )


def sync_command(command: list[str]) -> list[str]:
    """The pod's command: install first, then run `command` (which must start with `python`:
    the image's interpreter, the one the packages go into)."""
    return ["python", "-m", SYNC_MODULE, *command]


def sync_env(sync: PackageSync) -> list[dict[str, Any]]:
    env = [{"name": REQUIREMENTS_ENV, "value": json.dumps(list(sync.requirements))}]
    env += [{"name": name, "value": value} for name, value in sync.index]
    if sync.cache_path and sync.cache_claim:
        env.append({"name": CACHE_ENV, "value": sync.cache_path})
        hashes = {req: list(digests) for req, digests in sync.cache_hashes}
        env.append({"name": HASHES_ENV, "value": json.dumps(hashes)})
        files = {req: [list(wheel) for wheel in wheels] for req, wheels in sync.cache_files}
        env.append({"name": FILES_ENV, "value": json.dumps(files)})
    return env


def cache_volume(sync: PackageSync) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(volume, mount) of the wheel cache in a pod, or None without one."""
    if not (sync.cache_claim and sync.cache_mount):
        return None
    volume = {
        "name": CACHE_VOLUME,
        "persistentVolumeClaim": {"claimName": sync.cache_claim, "readOnly": True},
    }
    mount: dict[str, Any] = {"name": CACHE_VOLUME, "mountPath": sync.cache_mount, "readOnly": True}
    if sync.cache_sub_path:
        mount["subPath"] = sync.cache_sub_path
    return volume, mount


def find_cache_volume(pod: Mapping[str, Any], path: str) -> tuple[str, str, str | None] | None:
    """(claim, mountPath, subPath) of the PersistentVolumeClaim the notebook pod's main
    container mounts `path` from (the deepest mount holding it); None when `path` is on no
    claim (the pods could not share it)."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return None
    claims = {
        v.get("name"): (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in spec.get("volumes") or []
    }
    path = posixpath.normpath(path)
    best = None
    for mount in containers[0].get("volumeMounts") or []:
        where = posixpath.normpath(str(mount.get("mountPath") or ""))
        inside = path == where or path.startswith(where.rstrip("/") + "/")
        if inside and (best is None or len(where) > len(best[1])):
            best = (claims.get(mount.get("name")), where, mount.get("subPath") or None)
    if best is None or not best[0]:
        return None
    return best  # type: ignore[return-value]


def index_settings(pip_config: str) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The index settings of `pip config list`'s output as pip variables for the pods (the
    last of a key wins, as in pip: environment over files), with any credentials in an
    index URL removed (they would stand in the job object for anyone who may read it).
    Returns (settings, notes)."""
    values: dict[str, str] = {}
    for line in pip_config.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        option = key.rsplit(".", 1)[-1].strip()
        if option in INDEX_SETTINGS:
            values[INDEX_SETTINGS[option]] = value.strip().strip("'\"")
    notes = []
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if name in values:
            urls = []
            for url in values[name].split():
                parts = urlsplit(url)
                if parts.username or parts.password:
                    host = parts.hostname or ""
                    netloc = f"{host}:{parts.port}" if parts.port else host
                    url = urlunsplit(parts._replace(netloc=netloc))
                    notes.append(
                        f"the credentials in the index URL {url} are not passed to the job's "
                        "pods (they would be readable in the job object); put them in the "
                        "image's pip configuration or use a wheel cache"
                    )
                urls.append(url)
            values[name] = " ".join(urls)
    return tuple(sorted(values.items())), tuple(notes)
