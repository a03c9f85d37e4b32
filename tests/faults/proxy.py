"""A small TCP proxy in front of the Kubernetes API emulator that a test can break.

Each client connection carries one HTTP request (the proxy rewrites `Connection:` to
`close`, so it sees every request: method, path, time). Modes:

- `pass`: forward.
- `refuse`: the listening socket is closed (new connections: "Connection refused") and every
  open connection is reset (open watches and log streams break), as when an API server
  restarts.
- `hang`: connections are accepted and nothing is answered; open ones stop moving (their
  bytes wait, as in a network partition) until the mode is `pass` again.
- `throttle`: every request is answered 429 with `Retry-After` (a rate-limit storm); open
  connections are reset when it starts, so every client comes through the storm.
- `fail_deletes`: DELETE requests are answered 503; everything else passes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Seen:
    method: str
    path: str
    at: float
    answered: int | None = None  # the status the proxy answered itself (None: forwarded)


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    retry_after: int = 3
    port: int = 0
    mode: str = "pass"
    requests: list[Seen] = field(default_factory=list)
    faults: int = 0  # client connections reset, or requests answered 429/503, by the proxy

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._moving = threading.Event()
        self._moving.set()
        self._open: set[socket.socket] = set()
        self._clients: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stopped = False
        self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control ----------------------------------------------------------------------------

    def set_mode(self, mode: str) -> None:
        assert mode in ("pass", "refuse", "hang", "throttle", "fail_deletes"), mode
        self.mode = mode
        if mode == "hang":
            self._moving.clear()
        else:
            self._moving.set()
        if mode == "refuse":
            self._close_listener()  # first: no connection may slip in between the two
        if mode in ("refuse", "throttle"):
            self._reset_open()
        if mode != "refuse" and self._listener is None:
            self._listen()

    def stop(self) -> None:
        self._stopped = True
        self._moving.set()
        self._close_listener()
        self._reset_open()

    def count(self, since: float, until: float | None = None, method: str | None = None) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.at >= since
                and (until is None or r.at < until)
                and (method is None or r.method == method)
            )

    # -- sockets ----------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()

    def _reset_open(self) -> None:
        with self._lock:
            conns, self._open = list(self._open), set()
            self.faults += len(self._clients & set(conns))
            self._clients.clear()
        for conn in conns:
            self._reset(conn)

    @staticmethod
    def _reset(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # RST, not FIN, as when a server dies: no lingering on close. The shutdown
            # wakes the proxy's own thread blocked reading it (a close alone would not).
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.shutdown(socket.SHUT_RD)

    def _track(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.add(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._track(client)
            with self._lock:
                self._clients.add(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            head, body = self._read_request(client)
            if head is None:
                return
            request_line, *header_lines = head.split(b"\r\n")
            method, path, _ = request_line.decode("latin-1").split(" ", 2)
            seen = Seen(method, path, time.monotonic())
            with self._lock:
                self.requests.append(seen)
            self._moving.wait()
            if self.mode == "refuse":
                # Accepted just before the listener closed: a server that died mid-request.
                with self._lock:
                    self.faults += 1
                self._reset(client)
                return
            if self.mode == "throttle" or (self.mode == "fail_deletes" and method == "DELETE"):
                status = 429 if self.mode == "throttle" else 503
                seen.answered = status
                self.faults += 1
                self._answer(client, status)
                return
            headers = [h for h in header_lines if not h.lower().startswith(b"connection:")]
            upstream = socket.create_connection(self.upstream)
            self._track(upstream)
            upstream.sendall(b"\r\n".join([request_line, *headers, b"Connection: close"]))
            upstream.sendall(b"\r\n\r\n" + body)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            self._pump(upstream, client)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def _read_request(self, client: socket.socket) -> tuple[bytes | None, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = client.recv(65536)
            if not chunk:
                return None, b""
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = client.recv(65536)
            if not chunk:
                break
            body += chunk
        return head, body

    def _answer(self, client: socket.socket, status: int) -> None:
        reason = {429: "TooManyRequests", 503: "ServiceUnavailable"}[status]
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": reason,
                "message": f"injected by the test's proxy ({status})",
                "code": status,
            }
        ).encode()
        extra = f"Retry-After: {self.retry_after}\r\n" if status == 429 else ""
        client.sendall(
            (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            + body
        )

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                self._moving.wait()  # a hang: the bytes wait, as in a partition
                if self._stopped:
                    return
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
