"""A Kubernetes job's ranks' stacks, read by each rank's own helper (runtime/stack_port.py):
a pod has no SYS_PTRACE and Kubernetes cannot signal a container, so the rank listens on a
port of its pod and dumps its own stacks for whoever proves the job's key.

Where each rank listens: the rank says its port in a signed record of its pod log, and its
pod's IP is in the pod's status; the job's supervisor writes both, for the ranks of the
current attempt, to `k8s-stacks.json` in the job's directory (`write_endpoints`), which
the asking process (server, CLI, kernel: `KubernetesBackend.collect_stacks`) reads. Both
ask with the job's key (beside its payload, in the job's private directory).

Nothing a rank sends is trusted: an answer counts only when signed with the job's key for
that rank and bound to this ask's nonce; what is read is bounded (MAX_ANSWER) and so is
the time (each rank on a thread of its own, every one within `timeout`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...jobs import forensics
from ...jobs.forensics.readers import (
    HELPER_READER,
    READ_TIMEOUT,
    ReadFailed,
    parse_faulthandler,
)
from ...jobs.model import RankState
from ...runtime.atomic import write_whole
from ...runtime.protocol import decode_record, encode_record, key_path, read_key_file
from ...runtime.stack_port import ASK_TIMEOUT, HELLO, MAX_DUMP

if TYPE_CHECKING:
    from ...jobs.record import JobRecord
    from ...jobs.storage.store import JobStore

FILE = "k8s-stacks.json"
READER = f"{HELPER_READER} via its pod's stack port"
CONNECT_TIMEOUT = 2.0
MAX_ANSWER = 2 * MAX_DUMP + 4096  # the dump, JSON-escaped, and its signature


def write_endpoints(job_dir: Path, attempt: int, endpoints: dict[int, dict[str, Any]]) -> None:
    """The current attempt's ranks' {pod, ip, port} (the supervisor's)."""
    data = {"attempt": attempt, "ranks": {str(r): e for r, e in sorted(endpoints.items())}}
    write_whole(job_dir / FILE, json.dumps(data))


def read_endpoints(job_dir: Path) -> dict[int, dict[str, Any]]:
    try:
        data = json.loads((job_dir / FILE).read_text())
        return {int(r): dict(e) for r, e in data["ranks"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def ask(
    host: str, port: int, key: bytes, rank: int, *, ack: bool = False, timeout: float = 5.0
) -> dict[str, Any]:
    """One exchange with rank `rank`'s helper: its signed answer (ReadFailed otherwise)."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=min(CONNECT_TIMEOUT, timeout))
    except OSError as exc:
        raise ReadFailed(f"its stack port ({host}:{port}) cannot be reached: {exc}") from None
    with sock:
        try:
            hello = _read_line(sock, deadline, len(HELLO) + 64)
            if not hello.startswith(HELLO):
                raise ReadFailed(f"{host}:{port} is not its stack helper")
            nonce = secrets.token_hex(16)
            request = {
                "type": "stacks_ask",
                "rank_nonce": hello[len(HELLO) :].decode("ascii", "replace"),
                "nonce": nonce,
                "ack": ack,
            }
            sock.sendall(encode_record(request, key, rank))
            raw = _read_line(sock, deadline, MAX_ANSWER)
        except (OSError, TimeoutError) as exc:
            raise ReadFailed(f"its helper did not answer within {timeout:g} s ({exc})") from None
    answer = decode_record(raw, key, rank)
    want = "stacks_acked" if ack else "stacks_dump"
    if answer is None or answer.get("type") != want or answer.get("nonce") != nonce:
        raise ReadFailed("its answer was not signed with the job's key for this ask: ignored")
    return answer


def _read_line(sock: socket.socket, deadline: float, limit: int) -> bytes:
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        if len(data) > limit:
            raise ReadFailed(f"its answer is over {limit} bytes: ignored")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ReadFailed("its helper closed the connection without an answer")
        data += chunk
    return data.split(b"\n", 1)[0]


def rank_stacks(answer: dict[str, Any], rank: int) -> forensics.RankStacks:
    text = str(answer.get("text") or "")
    main = answer.get("main") if isinstance(answer.get("main"), int) else None
    helper = answer.get("helper")
    threads = [t for t in parse_faulthandler(text, main) if t.ident != helper]
    reader = READER + ("; cut at its size limit" if answer.get("cut") else "")
    return forensics.RankStacks(rank, None, reader, threads)


def job_key(payload: Path) -> bytes | None:
    return read_key_file(key_path(payload))


def read_stacks(
    job_id: str,
    key: bytes | None,
    endpoints: dict[int, dict[str, Any]],
    wanted: list[int],
    missing: dict[int, str],
    *,
    why: str = "asked",
    timeout: float = 5.0,
) -> forensics.StackReport:
    """`wanted` ranks' stacks from their helpers, in parallel; `missing`: those known unread."""
    began = time.monotonic()
    report = forensics.StackReport(job=job_id, ranks=[], missing=dict(missing), why=why)
    targets = []
    for rank in wanted:
        point = endpoints.get(rank) or {}
        if key is None:
            report.missing[rank] = "the job's key is not here"
        elif not point.get("port"):
            report.missing[rank] = "its helper has not said its port (MLCLUSTER_STACKS_PORT=off?)"
        elif not point.get("ip"):
            report.missing[rank] = f"its pod {point.get('pod', '')} has no IP yet"
        else:
            targets.append((rank, point))

    def one(target: tuple[int, dict[str, Any]]) -> forensics.RankStacks | ReadFailed:
        rank, point = target
        try:
            answer = ask(str(point["ip"]), int(point["port"]), key, rank, timeout=timeout)  # type: ignore[arg-type]
            return rank_stacks(answer, rank)
        except ReadFailed as exc:
            return exc

    if targets:
        with concurrent.futures.ThreadPoolExecutor(min(len(targets), 16)) as pool:
            for (rank, _), outcome in zip(targets, pool.map(one, targets), strict=True):
                if isinstance(outcome, ReadFailed):
                    report.missing[rank] = str(outcome)
                else:
                    report.ranks.append(outcome)
    report.ranks.sort(key=lambda r: r.rank)
    report.seconds = time.monotonic() - began
    return report


def let_go(endpoint: dict[str, Any] | None, key: bytes, rank: int) -> None:
    """Tell a failing rank its peers were read (it then exits; best effort: it waits a
    bounded time anyway)."""
    if endpoint and endpoint.get("ip") and endpoint.get("port"):
        with contextlib.suppress(ReadFailed):
            ask(
                str(endpoint["ip"]), int(endpoint["port"]), key, rank, ack=True, timeout=ASK_TIMEOUT
            )


def collect(
    store: JobStore, job: JobRecord, ranks: list[int] | None, native: bool
) -> forensics.StackReport:
    """The running job's ranks' stacks, asked from the process that wants them."""
    if native:
        raise forensics.StacksUnavailable(
            f"{forensics.NATIVE_UNAVAILABLE} in a pod (no SYS_PTRACE): its rank's own helper "
            "reads Python frames only"
        )
    wanted = list(range(job.spec.workers)) if ranks is None else list(ranks)
    records = {r.rank: r for r in job.ranks}
    missing: dict[int, str] = {}
    live = []
    for rank in wanted:
        record = records.get(rank)
        if record is None or record.state != RankState.RUNNING:
            ended = record is not None and RankState(record.state).final
            missing[rank] = "it has ended" if ended else "it has not started yet"
        else:
            live.append(rank)
    return read_stacks(
        job.id,
        job_key(store.payload_path(job.id)),
        read_endpoints(store.job_dir(job.id)),
        live,
        missing,
        timeout=READ_TIMEOUT,
    )
