"""A session's rank in a Kubernetes pod or a Slurm task: where its cells come from
(runtime/session_worker.py).

A local session rank reads its commands from a pipe only its supervisor holds. A pod or a
Slurm task has no such pipe: here the rank listens on a TCP port (`MLCLUSTER_SESSION_PORT`,
any free one by default), says which (and its host) in a signed record of its report
channel (a pod's log, a Slurm task's report file), and the supervisor connects to the pod's
IP, or the task's host, on it. Nobody else may drive the rank, so a connection counts only
after a handshake in which both sides prove they hold the job's key (the one beside the
payload, never in the environment), bound to fresh nonces of both:

    rank -> supervisor   HELLO <rank nonce>
    supervisor -> rank   signed {"type": "hello", "rank_nonce": <rank nonce>, "nonce": <n>}
    rank -> supervisor   signed {"type": "hello_ok", "nonce": <n>}

Then the supervisor sends signed command lines (session_worker.py) with a sequence number
that only goes up, signed not with the job's key but with the connection's own
(`connection_key`: the job's key over both nonces), so a line recorded on the wire is
refused when replayed on the same connection (its number) and on any other: another
connection to this rank, or the pods of a restarted session, which keep the job's key
while the supervisor's numbers start again. Several connections may try at once (a
stranger's cannot hold the port), and the newest authenticated one is the channel (the
supervisor reconnects after a drop; the sequence numbers carry on, the lines it sends
again are signed for the new connection).

Anyone on the pod network can connect, so what a connection that has not proved the key
costs is bounded: one thread (`_listen`) accepts and runs every handshake without blocking
(no thread per connection), each within `HANDSHAKE_TIMEOUT` by the clock (not per read:
a byte now and then holds nothing), reading at most `MAX_HELLO` bytes; at most
`MAX_PENDING` run at once, and past that (or when the process is out of file
descriptors) the oldest handshake of the address holding the most is dropped, so one
flooding pod never crowds out the supervisor's. A failing `accept` (no descriptors, no
buffers) pauses listening briefly and goes on: only closing the listening socket ends it.
Refused connections are said in the rank's output (its pod log, which is the running
cell's log) once, then as a count at most every `REFUSAL_PERIOD` seconds.

A rank without its supervisor for `MLCLUSTER_SESSION_ORPHAN_TIMEOUT` seconds (none connected
since it started, or since the last connection dropped: the supervisor died and nobody
deleted the pods) ends as a stopped session's rank does (atexit runs, exit 0), so that its
pod frees its node's GPUs and CPUs instead of idling forever; a live supervisor reconnects
long before (it gives up on a rank sooner: MLClusterConfig.kubernetes_session_channel_timeout).

`interrupt` commands are acted on here, at once, while the rank's main thread runs a cell:
SIGINT to itself (KeyboardInterrupt in the cell's code, as the local supervisor's signal).
So are `pdb_in` commands, a line typed at a pdb of this rank's (pdb_relay.ChannelRelay).
Integrity and authenticity, not secrecy: see SECURITY.md (a cell's code crosses the pod
network as the payload Secrets' data does the API server's).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import hashlib
import hmac
import os
import queue
import secrets
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable

from . import pdb_relay, reporting
from .protocol import decode_record, encode_record

HELLO = b"MLCLUSTER-SESSION-HELLO "
HANDSHAKE_TIMEOUT = 10.0  # a whole handshake, by the clock
MAX_HELLO = 1024  # the supervisor's signed hello is about 200 bytes
MAX_PENDING = 64  # handshakes in progress at once (each: a socket and <= MAX_HELLO bytes)
REFUSAL_PERIOD = 60.0  # seconds between two counts of refused connections in the output
MAX_COMMAND = 256 * 1024 * 1024  # one cell's code and pushed variables, base64
ACCEPT_PAUSE = (0.05, 1.0)  # first and longest pause after a failing accept
# accept() errors that mean the listening socket is gone (closed, shut down): the end.
_LISTENING_GONE = {errno.EBADF, errno.EINVAL, errno.ENOTSOCK}
_OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE}
NOT_PROVEN = "a connection that did not prove the session's key"


def connection_key(key: bytes, rank_nonce: str, supervisor_nonce: str) -> bytes:
    """What one connection's commands are signed with: the job's key over both ends'
    nonces of its handshake (fresh on each side), so a command holds on that connection
    only."""
    message = b"mlcluster-session-connection\x00%s\x00%s" % (
        rank_nonce.encode(),
        supervisor_nonce.encode(),
    )
    return hmac.new(key, message, hashlib.sha256).digest()


@dataclasses.dataclass(eq=False)
class _Handshake:
    sock: socket.socket
    peer: str
    nonce: str
    deadline: float
    data: bytes = b""


class CommandChannel:
    """`read()` gives the next command line from the supervisor and the key it must be
    signed with (blocking); (b"", None) once the rank was left without its supervisor."""

    def __init__(
        self,
        key: bytes,
        rank: int,
        on_interrupt: Callable[[str | None], None],
        *,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        refusal_period: float = REFUSAL_PERIOD,
    ):
        self.key, self.rank, self.on_interrupt = key, rank, on_interrupt
        self.handshake_timeout = handshake_timeout
        self.lines: queue.Queue[tuple[bytes, bytes | None]] = queue.Queue()
        self.lock = threading.Lock()
        self.current: socket.socket | None = None
        self.seen_seq = 0  # the highest sequence number of an authentic command
        self.alone_since: float | None = time.monotonic()  # no supervisor connected since
        self.orphan_timeout = float(os.environ.get("MLCLUSTER_SESSION_ORPHAN_TIMEOUT", "0") or 0)
        self.refusals = Refusals(rank, refusal_period)
        # Handshakes in progress: the listening thread's alone.
        self.pending: dict[socket.socket, _Handshake] = {}
        self.pause = 0.0  # how long listening pauses after a failing accept
        self.paused_until: float | None = None
        # Authenticated connections, newest last: one thread reads them in turn (a newer
        # one shuts the one before down), so no thread is started after this.
        self.authenticated: queue.Queue[tuple[socket.socket, bytes] | None] = queue.Queue()
        port = int(os.environ.get("MLCLUSTER_SESSION_PORT", "0") or 0)
        # Both IPv4 and IPv6 where the pod has both (a pod IP may be either).
        dual = socket.has_dualstack_ipv6()
        self.server = socket.create_server(
            ("", port), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        )
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        threading.Thread(target=self._listen, name="session-channel", daemon=True).start()
        threading.Thread(target=self._read, name="session-commands", daemon=True).start()
        if self.orphan_timeout > 0:
            threading.Thread(target=self._watch, name="session-orphan", daemon=True).start()
        # The host: a Slurm task's supervisor dials it (a pod's dials the pod's IP).
        reporting.send({"type": "session_channel", "host": socket.gethostname(), "port": self.port})

    def read(self) -> tuple[bytes, bytes | None]:
        return self.lines.get()

    def close(self) -> None:
        """Stop listening and reading (the listening thread ends within a second)."""
        with contextlib.suppress(OSError):
            self.server.close()
        with self.lock:
            current = self.current
        if current is not None:
            with contextlib.suppress(OSError):
                current.shutdown(socket.SHUT_RDWR)
        self.authenticated.put(None)

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.orphan_timeout / 4))
            with self.lock:
                since = self.alone_since
            if since is not None and time.monotonic() - since > self.orphan_timeout:
                print(
                    f"mlcluster session: rank {self.rank} heard from no supervisor for"
                    f" {self.orphan_timeout:g} s: ending",
                    file=sys.stderr,
                    flush=True,
                )
                self.lines.put((b"", None))
                return

    # -- accepting and handshakes: one thread, never blocked by a peer ----------------------

    def _listen(self) -> None:
        self.selector.register(self.server, selectors.EVENT_READ)
        try:
            while self.server.fileno() != -1:
                try:
                    if not self._turn():
                        return  # the listening socket is gone
                except Exception:  # noqa: BLE001 - nothing a peer does ends the listening
                    time.sleep(ACCEPT_PAUSE[0])
        finally:
            for handshake in list(self.pending.values()):
                self._drop(handshake)
            self.selector.close()

    def _turn(self) -> bool:
        """Wait for what comes (a connection, a hello, a deadline) and deal with it; False
        once the listening socket is gone."""
        now = time.monotonic()
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            with contextlib.suppress(KeyError):  # (registered already)
                self.selector.register(self.server, selectors.EVENT_READ)
        waits = [1.0] + [h.deadline - now for h in self.pending.values()]
        if self.paused_until is not None:
            waits.append(self.paused_until - now)
        for selected, _ in self.selector.select(max(0.0, min(waits))):
            if selected.fileobj is self.server:
                accepted = self._accept()
                if accepted is None:
                    return False
                if accepted:
                    self.pause = 0.0
                else:  # out of descriptors or buffers: pause, then go on
                    self.pause = min(ACCEPT_PAUSE[1], max(ACCEPT_PAUSE[0], 2 * self.pause))
                    self.paused_until = time.monotonic() + self.pause
                    with contextlib.suppress(KeyError, ValueError):
                        self.selector.unregister(self.server)
            elif self.pending.get(selected.fileobj) is selected.data:  # type: ignore[call-overload]
                self._advance(selected.data)
        now = time.monotonic()
        for handshake in [h for h in self.pending.values() if h.deadline <= now]:
            self._refuse(handshake)
        self.refusals.flush()
        return True

    def _accept(self) -> bool | None:
        """Accept what waits: True, False when accepting fails for now, None when the
        listening socket is gone."""
        for _ in range(MAX_PENDING):
            try:
                conn, peer = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                if self.server.fileno() == -1 or exc.errno in _LISTENING_GONE:
                    return None
                if exc.errno == errno.ECONNABORTED:
                    continue  # the peer gave up before we took it
                if exc.errno in _OUT_OF_DESCRIPTORS and self.pending:
                    self._refuse(self._crowding())  # a descriptor back, for this one
                    continue
                return False
            try:
                self._begin(conn, str(peer[0]) if isinstance(peer, tuple) else str(peer))
            except Exception:  # noqa: BLE001 - a failing connection never ends the listening
                with contextlib.suppress(OSError):
                    conn.close()
        return True

    def _crowding(self) -> _Handshake:
        """The handshake to drop for room: the oldest of the address holding the most (a
        flood from one pod never pushes out the supervisor's)."""
        counts = collections.Counter(h.peer for h in self.pending.values())
        most = max(counts.values())
        return min(
            (h for h in self.pending.values() if counts[h.peer] == most), key=lambda h: h.deadline
        )

    def _begin(self, conn: socket.socket, peer: str) -> None:
        if len(self.pending) >= MAX_PENDING:
            self._refuse(self._crowding())
        conn.setblocking(False)
        nonce = secrets.token_hex(16)
        greeting = HELLO + nonce.encode() + b"\n"
        if conn.send(greeting) != len(greeting):  # a fresh socket's buffer takes it whole
            raise OSError("the greeting did not fit")
        handshake = _Handshake(conn, peer, nonce, time.monotonic() + self.handshake_timeout)
        self.selector.register(conn, selectors.EVENT_READ, handshake)
        self.pending[conn] = handshake

    def _advance(self, handshake: _Handshake) -> None:
        try:
            chunk = handshake.sock.recv(MAX_HELLO + 1 - len(handshake.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._refuse(handshake)
            return
        handshake.data += chunk
        line, newline, rest = handshake.data.partition(b"\n")
        if not newline:
            if len(handshake.data) > MAX_HELLO:
                self._refuse(handshake)
            return
        hello = decode_record(line, self.key, self.rank)
        theirs = hello.get("nonce") if hello else None
        if (
            rest  # the supervisor says nothing more before hello_ok
            or not hello
            or hello.get("type") != "hello"
            or hello.get("rank_nonce") != handshake.nonce
            or not isinstance(theirs, str)
            or not theirs
            or len(theirs) > 128
        ):
            self._refuse(handshake)
            return
        reply = encode_record({"type": "hello_ok", "nonce": theirs}, self.key, self.rank)
        try:
            sent = handshake.sock.send(reply)
        except OSError:
            sent = 0
        if sent != len(reply):
            self._refuse(handshake)
            return
        self._forget(handshake)
        handshake.sock.setblocking(True)
        self._authenticated(handshake.sock, connection_key(self.key, handshake.nonce, theirs))

    def _forget(self, handshake: _Handshake) -> None:
        self.pending.pop(handshake.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(handshake.sock)

    def _drop(self, handshake: _Handshake) -> None:
        self._forget(handshake)
        with contextlib.suppress(OSError):
            handshake.sock.close()

    def _refuse(self, handshake: _Handshake) -> None:
        self._drop(handshake)
        self.refusals.note(NOT_PROVEN)

    def _authenticated(self, conn: socket.socket, conn_key: bytes) -> None:
        with self.lock:
            old, self.current = self.current, conn
            self.alone_since = None
        if old is not None:
            with contextlib.suppress(OSError):
                old.shutdown(socket.SHUT_RDWR)  # the supervisor reconnected: one channel
        self.authenticated.put((conn, conn_key))

    # -- the authenticated connection's commands --------------------------------------------

    def _read(self) -> None:
        while True:
            item = self.authenticated.get()
            if item is None:
                return  # closed
            conn, conn_key = item
            try:
                with conn, conn.makefile("rb") as reader:
                    while True:
                        raw = reader.readline(MAX_COMMAND)
                        if not raw:
                            break
                        self._command(raw, conn_key)
            except OSError:
                pass
            finally:
                with self.lock:
                    if self.current is conn:
                        self.current, self.alone_since = None, time.monotonic()

    def _command(self, raw: bytes, conn_key: bytes) -> None:
        record = decode_record(raw.rstrip(b"\n"), conn_key, self.rank)
        seq = record.get("seq") if record else None
        if record is None or not isinstance(seq, int):
            self.lines.put((raw, conn_key))  # session_worker says it was refused
            return
        with self.lock:
            fresh = seq > self.seen_seq
            self.seen_seq = max(self.seen_seq, seq)
        if record.get("type") == "interrupt":
            if fresh:
                job = record.get("job")
                self.on_interrupt(job if isinstance(job, str) else None)
            else:
                self.refusals.note("a replayed interrupt")
            return
        if record.get("type") == "pdb_in":  # a line typed at a paused rank's pdb, now
            if fresh:
                pdb_relay.deliver(record.get("link"), record.get("line"))
            return
        self.lines.put((raw, conn_key))


class Refusals:
    """What the rank refused, said in its output: the first of a kind at once, then at most
    one count per `period` (a pod's output is its running cell's log, which a flood of
    refused connections would otherwise fill)."""

    def __init__(self, rank: int, period: float):
        self.rank, self.period = rank, period
        self.lock = threading.Lock()
        self.said_at: dict[str, float] = {}
        self.unsaid: dict[str, int] = {}

    def note(self, what: str) -> None:
        now = time.monotonic()
        with self.lock:
            said = self.said_at.get(what)
            if said is None or (now - said >= self.period and not self.unsaid.get(what)):
                self.said_at[what] = now
                self._say(f"refused {what}")
            else:
                self.unsaid[what] = self.unsaid.get(what, 0) + 1
        self.flush()

    def flush(self) -> None:
        now = time.monotonic()
        with self.lock:
            for what, count in list(self.unsaid.items()):
                if count and now - self.said_at[what] >= self.period:
                    self._say(
                        f"refused {what} {count} more time{'s' if count > 1 else ''}"
                        f" in the last {self.period:g} s"
                    )
                    self.said_at[what], self.unsaid[what] = now, 0

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"mlcluster session: rank {self.rank} {text}", file=sys.stderr, flush=True)
