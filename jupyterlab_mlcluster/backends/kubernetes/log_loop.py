"""Every pod log stream of a process, read by one asyncio event loop.

A supervisor follows each pod's log for as long as the pod runs; a process supervising many
jobs follows thousands. A thread per stream would cost each its stack and a scheduler entry
for what is, nearly always, waiting: here one daemon thread per process runs one event loop
(aiohttp) that reads them all. `follow` (thread-safe) opens a stream and returns its
`LogStream`: ("log", pod, bytes) items go to the stream's `sink` as chunks arrive, then
exactly one ("log_end", pod, error or None); `stop()` ends it at once (its "log_end" still
comes). Each stream reads only as fast as the sink takes its chunks (aiohttp pauses the
socket when its small buffer is full): nothing is held here beyond what the sink holds.

The request is the blocking `Connection`'s own (kubeconn/streams.py: URL, auth, TLS, proxy);
failures are KubeErrors as its calls' are. The loop, its thread and its sessions (one per
API server and TLS identity) are made on first use in each process: a process forked from
one that streamed has no loop thread, so it makes its own (what it inherited is left alone:
those sockets are its parent's).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import queue
import ssl
import threading
import weakref
from typing import Any

from ...kubeconn.blocking import Connection
from ...kubeconn.errors import as_kube_error, refused
from ...kubeconn.streams import StreamRequest, Transport, prepare_get, ssl_context
from .client import kind_of

# A rank may print nothing for hours: a read timeout that long only costs a resumed stream
# (logs.py's module docstring).
QUIET_STREAM_TIMEOUT = 3600.0
CLOSE_TIMEOUT = 2.0  # at exit: how long the sessions may take to close


class LogStream:
    """One followed container log (what `LogLoop.follow` returns)."""

    def __init__(
        self, pod: str, sink: queue.Queue, request: StreamRequest | None, connect_timeout: float
    ):
        self.pod = pod
        self._sink = sink
        self._request = request
        self._connect_timeout = connect_timeout
        self._host = request.transport.host if request is not None else ""
        self._runner: _LoopThread | None = None
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def stop(self) -> None:
        """End the stream now (from any thread); its ("log_end", ...) still comes."""
        runner = self._runner
        if runner is not None:
            runner.call(self._stop)

    # -- on the loop -------------------------------------------------------------------------

    def _start(self, runner: _LoopThread, context: ssl.SSLContext | None) -> None:
        assert self._request is not None
        try:
            session = runner.session(self._request.transport, context)
        except Exception as exc:  # noqa: BLE001 - reported in the stream's "log_end"
            self.error = as_kube_error(exc, self._host)
            self._ended()
            return
        self._task = runner.loop.create_task(self._read(session, self._request))
        self._task.add_done_callback(self._ended)

    def _stop(self) -> None:
        # Queued after _start (one loop, FIFO). A task cancelled before its first step
        # still runs its done callback: the "log_end" comes.
        if self._task is not None:
            self._task.cancel()

    async def _read(self, session: Any, request: StreamRequest) -> None:
        import aiohttp
        import yarl

        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect_timeout, sock_read=QUIET_STREAM_TIMEOUT
        )
        try:
            async with session.get(
                yarl.URL(request.url, encoded=True),
                headers=request.headers,
                proxy=request.proxy,
                proxy_headers=request.proxy_headers,
                server_hostname=request.server_hostname,
                timeout=timeout,
            ) as response:
                if not 200 <= response.status <= 299:
                    raise refused(response.status, await response.read(), response.headers)
                async for chunk in response.content.iter_any():
                    if chunk:
                        self._sink.put(("log", self.pod, bytes(chunk)))
        except Exception as exc:  # noqa: BLE001 - reported in the stream's "log_end"
            self.error = as_kube_error(exc, self._host)

    def _ended(self, _task: asyncio.Task[None] | None = None) -> None:
        self._sink.put(("log_end", self.pod, self.error))


class _LoopThread:
    """One process's event loop, its daemon thread, and its aiohttp sessions."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._sessions: dict[Transport, Any] = {}
        self.thread = threading.Thread(target=self._run, name="pod-log-streams", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, callback: Any, *args: Any) -> None:
        if self.pid != os.getpid():
            return  # a forked parent's loop: it runs in no thread here
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # closed at exit
            pass

    def session(self, transport: Transport, context: ssl.SSLContext | None) -> Any:
        """On the loop: the session of streams to this API server with this TLS identity."""
        session = self._sessions.get(transport)
        if session is None or session.closed:
            import aiohttp

            connector = aiohttp.TCPConnector(
                # Each stream holds its connection for as long as the pod runs: no limit.
                limit=0,
                limit_per_host=0,
                ssl=context if context is not None else True,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                # The proxy is the connection's own (StreamRequest), as urllib3 would use it.
                trust_env=False,
                auto_decompress=False,
            )
            self._sessions[transport] = session
        return session

    async def _close_sessions(self) -> None:
        for session in list(self._sessions.values()):
            await session.close()

    def close(self) -> None:
        """At exit: the sessions closed (no 'Unclosed client session' noise), the loop stopped."""
        if self.pid != os.getpid() or not self.thread.is_alive():
            return
        try:
            closing = asyncio.run_coroutine_threadsafe(self._close_sessions(), self.loop)
            concurrent.futures.wait([closing], timeout=CLOSE_TIMEOUT)  # (its error: exiting)
        except RuntimeError:  # the loop is closed already
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)


class LogLoop:
    """The process's loop for log streams, made on first use (in each process: see the
    module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runner: _LoopThread | None = None
        # A fork while another thread held the lock would leave it held in the child.
        os.register_at_fork(after_in_child=_fresh_lock(weakref.ref(self)))

    def runner(self) -> _LoopThread:
        with self._lock:
            runner = self._runner
            if runner is None or runner.pid != os.getpid():
                if runner is not None:
                    # The parent's loop, sessions and sockets: never touched here (closing
                    # a TLS socket would write to the parent's connection). Kept referenced,
                    # so that no finalizer ever runs on them.
                    _INHERITED.append(runner)
                runner = self._runner = _LoopThread()
            return runner

    def follow(
        self, conn: Connection, namespace: str, pod: str, container: str, sink: queue.Queue
    ) -> LogStream:
        """Follow a container's log into `sink` (GET .../pods/{pod}/log?follow=true)."""
        path = kind_of("v1", "Pod").path(namespace, pod, "log")
        try:
            request = prepare_get(conn, path, {"container": container, "follow": True})
            # Here, not on the loop: it reads the CA and client certificate files (once).
            context = ssl_context(request.transport)
        except Exception as exc:  # noqa: BLE001 - reported in the stream's "log_end"
            stream = LogStream(pod, sink, None, conn.request_timeout)
            stream.error = as_kube_error(exc, conn.host)
            sink.put(("log_end", pod, stream.error))
            return stream
        stream = LogStream(pod, sink, request, conn.request_timeout)
        runner = stream._runner = self.runner()
        runner.call(stream._start, runner, context)
        return stream

    def threads(self) -> int:
        """Threads this loop runs in this process (0 or 1)."""
        runner = self._runner
        return int(runner is not None and runner.pid == os.getpid() and runner.thread.is_alive())

    def close(self) -> None:
        runner = self._runner
        if runner is not None:
            runner.close()


def _fresh_lock(ref: weakref.ref[LogLoop]) -> Any:
    def forked() -> None:
        loop = ref()
        if loop is not None:
            loop._lock = threading.Lock()

    return forked


_INHERITED: list[_LoopThread] = []
LOG_LOOP = LogLoop()
atexit.register(LOG_LOOP.close)


def follow_log(
    conn: Connection, namespace: str, pod: str, container: str, sink: queue.Queue
) -> LogStream:
    """`LOG_LOOP.follow`: the process's one loop."""
    return LOG_LOOP.follow(conn, namespace, pod, container, sink)
