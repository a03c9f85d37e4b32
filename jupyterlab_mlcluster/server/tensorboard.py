"""TensorBoard for jobs, next to the Jupyter server and behind its authentication.

`TensorBoards.open(job records)` starts (or reuses) one TensorBoard process per set of jobs,
bound to 127.0.0.1 on a port the OS picks (tensorboard_launch.py: its flags and a secret
come on stdin, and it answers only requests carrying that secret);
`TensorBoardProxy` (tensorboard_proxy.py, an authenticated Jupyter handler) streams the
browser's requests to it with the secret. Nothing listens anywhere but on loopback, and
nothing reaches it without the server's token or cookie: not another local user who reads
its port in /proc/net/tcp either. Processes idle for `idle_timeout` seconds are stopped;
each caller has at most `per_user` (opening one more stops the caller's least recently
used), the server at most `total` (opening one more is refused, 503, saying so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from jupyter_server.utils import url_path_join

if TYPE_CHECKING:
    from ..jobs.record import JobRecord
    from ..jobs.storage.store import JobStore

log = logging.getLogger(__name__)

ENV_NAME = "MLCLUSTER_TENSORBOARD_DIR"
PROXY_PREFIX = "/mlcluster/tensorboard"
_LISTENING = re.compile(rb"TensorBoard \S+ at http://127\.0\.0\.1:(\d+)/")


class NoTensorBoardData(Exception):
    """A job has written no TensorBoard event file yet."""


class TensorBoardFailed(Exception):
    """The TensorBoard process did not come up."""


class TensorBoardLimit(TensorBoardFailed):
    """No TensorBoard may start now (the message says which setting caps them)."""


def tensorboard_location(store: JobStore, record: JobRecord) -> str:
    """Where a job's ranks write TensorBoard data: `--tensorboard` or the setting (resolved
    at submit), the job's own $MLCLUSTER_TENSORBOARD_DIR (`--env`), else the local default
    in the job's directory."""
    chosen = record.spec.tensorboard or record.spec.env.get(ENV_NAME)
    if chosen:
        return chosen
    return str(store.tensorboard_dir(record.id))


class PlaceRefused(Exception):
    """A TensorBoard directory a shared server's caller may not name (the message says why
    and which settings decide)."""


@dataclasses.dataclass
class TensorBoardPlaces:
    """Where a caller of a shared server may have TensorBoard read: this server reads any
    path its Unix user can, and any URI its credentials open, for everyone, so a caller's
    job may name only the caller's own area (`user_dir`, realpath checked: no symlink or
    `..` leads out), the job's own directory in the store, the operator's default, or a URI
    under an allowed prefix. `{user}` in either setting is the caller's identity."""

    user_dir: str = ""
    allowed_uris: tuple[str, ...] = ()

    def check(self, location: str, owner: str, *, own_dir: str, default: str = "") -> str:
        """The location TensorBoard may read for `owner` (a path: its realpath), else
        PlaceRefused."""
        if "," in location:
            raise PlaceRefused(f"a TensorBoard directory may not contain ',': {location!r}")
        if default and location == default:
            return location  # the operator's MLClusterConfig.tensorboard_dir
        if "://" in location:
            return self._check_uri(location, owner)
        real = os.path.realpath(location)
        roots = [own_dir]
        area = self.area(owner)
        if area:
            roots.append(area)
        for root in roots:
            top = os.path.realpath(root)
            if _within(real, top):
                _check_links(real, top, location)
                return real
        where = f"under {area}" if area else "in the job's own directory"
        raise PlaceRefused(
            f"this server is shared (MLClusterApp.trust_identity_header): a job's TensorBoard "
            f"directory must lie {where} (MLClusterApp.tensorboard_user_dir), and {location!r} "
            f"is {real!r}"
        )

    def area(self, owner: str) -> str:
        """The caller's own directory ('' where there is none: no setting, or an identity
        that is no single path component)."""
        if not self.user_dir or not owner or "/" in owner or owner in (".", "..") or "\0" in owner:
            return ""
        return self.user_dir.replace("{user}", owner)

    def _check_uri(self, location: str, owner: str) -> str:
        rest = location.partition("://")[2]
        parts = rest.split("/")
        if any(p in (".", "..") for p in parts) or any(c in location for c in "?#\\"):
            raise PlaceRefused(
                f"a TensorBoard URI may not hold '.', '..', '?', '#' or '\\': {location!r}"
            )
        for prefix in self.allowed_uris:
            allowed = prefix.replace("{user}", owner).rstrip("/")
            if location == allowed or location.startswith(allowed + "/"):
                return location
        raise PlaceRefused(
            f"this server is shared (MLClusterApp.trust_identity_header): it reads TensorBoard "
            f"URIs only under MLClusterApp.tensorboard_allowed_uris "
            f"({', '.join(self.allowed_uris) or 'none allowed'}), not {location!r}"
        )


# Bounds of the walk that looks for symlinks leading out of a caller's area: one caller
# must not make the server walk without end (a refusal says so and what to do).
LINK_WALK_ENTRIES = 50_000
LINK_WALK_DEPTH = 40


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _check_links(real: str, top: str, location: str) -> None:
    """PlaceRefused if a symlink anywhere under `real` (TensorBoard follows them all) leads
    out of `top`. A link to a directory inside `top` is walked too, once. Blocking; bounded
    by LINK_WALK_ENTRIES and LINK_WALK_DEPTH. What is made after this look is not seen:
    SECURITY.md says so."""
    seen_dirs = {real}
    stack = [(real, 0)]
    entries = 0
    while stack:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                listed = list(it)
        except (NotADirectoryError, FileNotFoundError):
            continue
        except OSError as exc:
            raise PlaceRefused(
                f"this server is shared: it could not look through {directory!r} for symlinks "
                f"leading out of {top!r} ({exc.strerror})"
            ) from None
        entries += len(listed)
        if entries > LINK_WALK_ENTRIES or depth > LINK_WALK_DEPTH:
            raise PlaceRefused(
                f"this server is shared: the TensorBoard directory {location!r} holds more than "
                f"{LINK_WALK_ENTRIES} entries or is deeper than {LINK_WALK_DEPTH} levels, too "
                "many to check for symlinks leading out of the caller's area; point TensorBoard "
                "at a smaller directory"
            )
        for entry in listed:
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _within(target, top):
                    raise PlaceRefused(
                        f"this server is shared (MLClusterApp.trust_identity_header): "
                        f"{entry.path!r}, under the TensorBoard directory {location!r}, is a "
                        f"symlink to {target!r}, outside {top!r}; TensorBoard would follow it"
                    )
                if os.path.isdir(target) and target not in seen_dirs:
                    seen_dirs.add(target)
                    stack.append((target, depth + 1))
            elif entry.is_dir(follow_symlinks=False) and entry.path not in seen_dirs:
                seen_dirs.add(entry.path)
                stack.append((entry.path, depth + 1))


def inner_prefix(key: str) -> str:
    return f"/tb-{key}"


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def has_event_files(location: str) -> bool:
    """Whether a local directory holds a TensorBoard event file (blocking). A URI
    (s3://, gs://) is TensorBoard's to read: it counts as having data."""
    if "://" in location:
        return True
    root = Path(location)
    if not root.is_dir():
        return False
    return any(
        name.startswith("events.out.tfevents") for _, _, names in os.walk(root) for name in names
    )


@dataclasses.dataclass
class TensorBoardProcess:
    key: str
    owner: str | None
    process: asyncio.subprocess.Process
    port: int
    last_used: float
    secret: str  # what the proxy sends it (tensorboard_launch.SECRET_HEADER)


class TensorBoards:
    """The server's TensorBoard processes, by key (the sorted job ids they show)."""

    def __init__(
        self,
        base_url: str,
        *,
        idle_timeout: float,
        start_timeout: float,
        reload_interval: float,
        per_user: int = 3,
        total: int = 20,
        executable: str = sys.executable,
    ) -> None:
        self.base_url = base_url
        self.idle_timeout = idle_timeout
        self.start_timeout = start_timeout
        self.reload_interval = reload_interval
        self.per_user = per_user  # 0: no cap
        self.total = total  # 0: no cap
        self.executable = executable
        self.running: dict[str, TensorBoardProcess] = {}
        self._starting: dict[str, asyncio.Future] = {}
        self._starting_owner: dict[str, str | None] = {}
        self._reaper: asyncio.Task | None = None

    @staticmethod
    def key(job_ids: Iterable[str]) -> str:
        return "-".join(sorted(set(job_ids)))

    def path(self, key: str) -> str:
        return url_path_join(self.base_url, PROXY_PREFIX, key) + "/"

    async def open(self, runs: dict[str, str], owner: str | None) -> str:
        """The URL path of a TensorBoard over `runs` (job id -> data location), started if
        none runs for these jobs yet. Concurrent calls for the same jobs share one start.
        TensorBoardLimit where the caps allow no new one."""
        key = self.key(runs)
        current = self.running.get(key)
        if current is not None and current.process.returncode is None:
            current.last_used = time.monotonic()
            return self.path(key)
        pending = self._starting.get(key)
        if pending is None:
            # Room is made and the start counted before any await: concurrent opens see it.
            evicted = self._make_room(owner)
            pending = asyncio.ensure_future(self._start(key, runs, owner, evicted))
            self._starting[key] = pending
            self._starting_owner[key] = owner

            def started(_: asyncio.Future) -> None:
                self._starting.pop(key, None)
                self._starting_owner.pop(key, None)

            pending.add_done_callback(started)
        await asyncio.shield(pending)
        self._ensure_reaper()
        return self.path(key)

    def _make_room(self, owner: str | None) -> list[TensorBoardProcess]:
        """Take out of `running` the caller's least recently used TensorBoards that one more
        would put over `per_user` (returned: they are stopped before the new one starts),
        or TensorBoardLimit where the caller's starts under way fill its share, or the
        server runs `total` already (others' TensorBoards are never stopped for it)."""
        for key, current in list(self.running.items()):
            if current.process.returncode is not None:
                self.running.pop(key, None)
        starting = sum(1 for who in self._starting_owner.values() if who == owner)
        if self.per_user and starting >= self.per_user:
            raise TensorBoardLimit(
                f"{starting} TensorBoards of yours are starting, the most one user may have "
                f"(MLClusterApp.tensorboard_max_per_user): wait for them"
            )
        mine = sorted(
            (p for p in self.running.values() if p.owner == owner), key=lambda p: p.last_used
        )
        over = max(0, len(mine) + starting + 1 - self.per_user) if self.per_user else 0
        if self.total and len(self.running) - over + len(self._starting) >= self.total:
            raise TensorBoardLimit(
                f"this server runs {self.total} TensorBoards, the most it may "
                "(MLClusterApp.tensorboard_max_total); each stops after "
                f"{self.idle_timeout:g} s unused (tensorboard_idle_timeout): try again later"
            )
        evicted = mine[:over]
        for current in evicted:
            self.running.pop(current.key, None)
        return evicted

    def _argv(self, key: str, runs: dict[str, str]) -> list[str]:
        spec = ",".join(f"{job_id}:{location}" for job_id, location in sorted(runs.items()))
        # Its own prefix is the key alone: the proxy maps the outer path (under the server's
        # base URL, which may hold escaped characters) onto it; its pages link relatively.
        return [
            "--logdir_spec",
            spec,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--path_prefix",
            inner_prefix(key),
            "--load_fast",
            "false",
            "--reload_interval",
            str(self.reload_interval),
        ]

    async def _start(
        self,
        key: str,
        runs: dict[str, str],
        owner: str | None,
        evicted: list[TensorBoardProcess],
    ) -> None:
        for old in evicted:
            log.info(
                "mlcluster: stopping TensorBoard for %s: its user opened more than %d",
                old.key,
                self.per_user,
            )
            await _stop(old.process)
        secret = secrets.token_urlsafe(32)
        process = await asyncio.create_subprocess_exec(
            self.executable,
            "-m",
            "jupyterlab_mlcluster.server.tensorboard_launch",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C at the server's terminal is the server's
        )
        try:
            # Its flags (the jobs' directories) and secret: on stdin, not its command line.
            assert process.stdin is not None
            settings = {"argv": self._argv(key, runs), "secret": secret}
            process.stdin.write(json.dumps(settings).encode() + b"\n")
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()
            process.stdin.close()
            port = await asyncio.wait_for(self._port(process), self.start_timeout)
        except (TimeoutError, TensorBoardFailed) as exc:
            await _stop(process)
            raise TensorBoardFailed(f"TensorBoard did not start: {exc or 'timed out'}") from None
        # Keep reading its output, or TensorBoard blocks once the pipe is full.
        asyncio.ensure_future(_drain(process))
        self.running[key] = TensorBoardProcess(key, owner, process, port, time.monotonic(), secret)
        log.info("mlcluster: TensorBoard for %s on 127.0.0.1:%d", key, port)

    @staticmethod
    async def _port(process: asyncio.subprocess.Process) -> int:
        tail: list[bytes] = []
        assert process.stderr is not None
        while True:
            line = await process.stderr.readline()
            if not line:
                said = b"".join(tail[-5:]).decode(errors="replace").strip()
                raise TensorBoardFailed(f"it exited ({process.returncode}): {said}")
            tail.append(line[:500])
            match = _LISTENING.search(line)
            if match:
                return int(match.group(1))

    def touch(self, key: str) -> TensorBoardProcess | None:
        current = self.running.get(key)
        if current is None or current.process.returncode is not None:
            return None
        current.last_used = time.monotonic()
        return current

    def _ensure_reaper(self) -> None:
        if self.idle_timeout > 0 and (self._reaper is None or self._reaper.done()):
            self._reaper = asyncio.ensure_future(self._reap_idle())

    async def _reap_idle(self) -> None:
        while self.running:
            await asyncio.sleep(min(30.0, max(0.05, self.idle_timeout / 4)))
            now = time.monotonic()
            for key, current in list(self.running.items()):
                exited = current.process.returncode is not None
                if exited or now - current.last_used > self.idle_timeout:
                    self.running.pop(key, None)
                    log.info("mlcluster: stopping idle TensorBoard for %s", key)
                    await _stop(current.process)

    async def stop_showing(self, job_ids: Iterable[str]) -> None:
        """Stop every TensorBoard that shows one of these jobs (a place refused on a later
        open: what runs on it must not go on serving it)."""
        refused = set(job_ids)
        for key, current in list(self.running.items()):
            if refused & set(key.split("-")):
                self.running.pop(key, None)
                log.info("mlcluster: stopping TensorBoard for %s: its place is refused", key)
                await _stop(current.process)

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for current in list(self.running.values()):
            await _stop(current.process)
        self.running.clear()


async def _drain(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        while process.stderr is not None and await process.stderr.read(65536):
            pass


async def _stop(process: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
