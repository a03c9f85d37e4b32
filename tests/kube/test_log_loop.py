"""Pod log streams read by one event loop per process (backends/kubernetes/log_loop.py),
against the emulator over HTTP: many streams, one thread; every stream's bytes complete and in
order, then exactly one "log_end"; `stop()` ends a quiet stream at once; failures are the
blocking client's KubeErrors; and behind TLS (a front that requires a client certificate),
the kubeconfig's CA and client certificate are used as the blocking client uses them."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import queue
import select
import signal
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from jupyterlab_mlcluster import kubeconn
from jupyterlab_mlcluster.backends.kubernetes.log_loop import LOG_LOOP, follow_log
from tests.kube.emulator import kubeconfig
from tests.kube.fixtures import KubeCluster, free_port, write_kubeconfig
from tests.kube.helpers import Kube

STREAMS = 200
DEADLINE = 60.0


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }


@pytest.fixture(scope="module")
def running_pods(kube_cluster: KubeCluster) -> Iterator[tuple[Kube, str, list[str]]]:
    """STREAMS running pods in a namespace of their own (module scope: made once)."""
    kube = kube_cluster.kube
    namespace = f"logloop-{uuid.uuid4().hex[:8]}"
    kube.create_namespace(namespace)
    names = [f"p{i}" for i in range(STREAMS)]
    for name in names:
        kube.create(_pod(name), namespace)
        kube.set_pod_phase(namespace, name, "Running")
    yield kube, namespace, names
    kube.delete("v1", "Namespace", namespace)


@pytest.fixture
def conn(running_pods: tuple[Kube, str, list[str]]) -> Iterator[kubeconn.Connection]:
    connection = kubeconn.connect(namespace=running_pods[1])
    yield connection
    connection.close()


def _collect(
    sink: queue.Queue, done: Any, received: dict[str, bytearray], ends: dict[str, list[Any]]
) -> None:
    """Take items from `sink` until `done()` (or fail at DEADLINE)."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"streams still short: {len(ends)} ended"
        try:
            kind, pod, value = sink.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            continue
        if kind == "log":
            assert pod not in ends, f"bytes of {pod} after its log_end"
            received.setdefault(pod, bytearray()).extend(value)
        else:
            assert kind == "log_end"
            ends.setdefault(pod, []).append(value)


def test_many_streams_share_one_thread_and_arrive_complete(running_pods, conn):
    kube, namespace, names = running_pods
    first = {n: "".join(f"{n} early {i}\n" for i in range(3)) for n in names}
    second = {n: [f"{n} late {i}\n" for i in range(3)] for n in names}
    for name in names:
        kube.append_log(namespace, name, first[name])
    threads_before = threading.active_count()
    sink: queue.Queue = queue.Queue()
    streams = {n: follow_log(conn, namespace, n, "main", sink) for n in names}
    received: dict[str, bytearray] = {}
    ends: dict[str, list[Any]] = {}
    _collect(
        sink,
        lambda: all(received.get(n, b"") == first[n].encode() for n in names),
        received,
        ends,
    )
    # All STREAMS are open now: one loop thread reads them (a thread per stream: +STREAMS).
    grown = threading.active_count() - threads_before
    assert grown <= 2, f"{grown} more threads for {STREAMS} streams"
    assert LOG_LOOP.threads() == 1
    for part in range(3):
        for name in names:
            kube.append_log(namespace, name, second[name][part])
    # Half end with their container, half are stopped by us.
    finished, stopped = names[: STREAMS // 2], names[STREAMS // 2 :]
    expected = {n: (first[n] + "".join(second[n])).encode() for n in names}
    _collect(sink, lambda: all(received.get(n) == expected[n] for n in names), received, ends)
    for name in finished:
        kube.set_pod_phase(namespace, name, "Succeeded")
    for name in stopped:
        streams[name].stop()
    _collect(sink, lambda: len(ends) == STREAMS, received, ends)
    assert {n: bytes(received[n]) for n in names} == expected
    assert all(ends[n] == [None] for n in names), {n: e for n, e in ends.items() if e != [None]}
    assert sink.empty()  # exactly one log_end each (a second would have come with the first)
    assert threading.active_count() - threads_before <= 2


def test_stop_ends_a_quiet_stream_at_once(running_pods, conn):
    kube, namespace, names = running_pods
    name = names[-1]
    kube.append_log(namespace, name, "before the silence\n")
    sink: queue.Queue = queue.Queue()
    stream = follow_log(conn, namespace, name, "main", sink)
    assert sink.get(timeout=DEADLINE)[2].endswith(b"before the silence\n")
    started = time.monotonic()
    stream.stop()
    assert sink.get(timeout=DEADLINE) == ("log_end", name, None)
    # the read timeout is an hour: only stop() can have ended it
    assert time.monotonic() - started < 5.0
    stream.stop()  # twice: nothing more
    with pytest.raises(queue.Empty):
        sink.get(timeout=0.3)


def test_the_stream_is_the_blocking_clients_request(running_pods, conn):
    """Same path, query and bearer token as the blocking client would send."""
    kube, namespace, names = running_pods
    name = names[-2]  # still running
    path = kube.path("v1", "Pod", namespace, name, "log")
    sink: queue.Queue = queue.Queue()
    stream = follow_log(conn, namespace, name, "main", sink)
    kube.append_log(namespace, name, "marker\n")
    while not sink.get(timeout=DEADLINE)[2].endswith(b"marker\n"):
        pass
    stream.stop()
    assert sink.get(timeout=DEADLINE)[0] == "log_end"
    asked = kube.on_emulator(lambda e: [dict(r.headers) for r in e["get", path]])
    assert asked and asked[-1].get("Authorization") == "Bearer emulator-token"


def test_failures_are_the_blocking_clients_errors(running_pods, conn, tmp_path):
    kube, namespace, _ = running_pods
    kube.create(_pod("waiting"), namespace)  # its container never started
    sink: queue.Queue = queue.Queue()
    follow_log(conn, namespace, "waiting", "main", sink)
    kind, pod, error = sink.get(timeout=DEADLINE)
    assert (kind, pod) == ("log_end", "waiting")
    assert isinstance(error, kubeconn.KubeError) and error.status == 400
    assert "is waiting to start" in error.message
    with pytest.raises(kubeconn.KubeError) as blocking:
        conn.request("GET", f"/api/v1/namespaces/{namespace}/pods/waiting/log")
    assert str(error) == str(blocking.value)

    # An API server that is not there: the connection's "cannot be reached" error.
    nowhere = f"http://127.0.0.1:{free_port()}"
    gone = kubeconn.connect(kubeconfig=str(write_kubeconfig(tmp_path / "gone.yaml", nowhere)))
    try:
        follow_log(gone, namespace, "waiting", "main", sink)
        kind, pod, error = sink.get(timeout=DEADLINE)
    finally:
        gone.close()
    assert kind == "log_end" and isinstance(error, kubeconn.ClusterUnavailable)
    assert f"{nowhere} cannot be reached" in str(error)


def _in_forked_child(conn_namespace: str, pod: str) -> dict[str, Any]:
    """In a process forked from this one (whose loop runs): follow `pod`'s log there."""
    inherited = LOG_LOOP._runner
    conn = kubeconn.connect(namespace=conn_namespace)
    sink: queue.Queue = queue.Queue()
    stream = follow_log(conn, conn_namespace, pod, "main", sink)
    first = sink.get(timeout=DEADLINE)
    threads = LOG_LOOP.threads()
    stream.stop()
    end = sink.get(timeout=DEADLINE)
    return {
        "first": first[2].decode() if first[0] == "log" else repr(first),
        "end": repr(end),
        "own_loop": LOG_LOOP._runner is not inherited and threads == 1,
    }


def test_a_forked_process_makes_its_own_loop(running_pods, conn):
    """A process forked while streams are open (as the warm pool forks) inherits no loop
    thread: it makes its own, and the parent's streams go on, untouched."""
    kube, namespace, names = running_pods
    parents, childs = names[-4], names[-5]
    sink: queue.Queue = queue.Queue()
    stream = follow_log(conn, namespace, parents, "main", sink)
    kube.append_log(namespace, parents, "parent before\n")
    kube.append_log(namespace, childs, "forked\n")
    while not sink.get(timeout=DEADLINE)[2].endswith(b"parent before\n"):
        pass
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's atexit/pytest
        code = 1
        try:
            os.close(reader)
            os.write(writer, json.dumps(_in_forked_child(namespace, childs)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    try:
        with os.fdopen(reader, "rb") as pipe:
            # poll, not select: a long test process may hold descriptors past select's 1024
            waiting = select.poll()
            waiting.register(pipe, select.POLLIN)
            if not waiting.poll(3 * DEADLINE * 1000):
                os.kill(pid, signal.SIGKILL)  # hung: fail, never hang the run
            report = json.loads(pipe.read() or b"{}")
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and report, report
    assert report["first"].endswith("forked\n") and report["own_loop"], report
    assert report["end"] == repr(("log_end", childs, None))
    kube.append_log(namespace, parents, "parent after\n")
    assert sink.get(timeout=DEADLINE) == ("log", parents, b"parent after\n")
    stream.stop()
    assert sink.get(timeout=DEADLINE) == ("log_end", parents, None)


# --- behind TLS -------------------------------------------------------------------------------


class _Certificates:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (PEM)."""

    def __init__(self) -> None:
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = self._sign("test CA", self.ca_key.public_key(), ca=True)
        self.server_key, self.server = self._issue("127.0.0.1", server=True)
        self.client_key, self.client = self._issue("tester", server=False)

    def _sign(self, name: str, public: Any, *, ca: bool = False, server: bool = False) -> bytes:
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.SubjectKeyIdentifier.from_public_key(public), critical=False
            )
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
        if server:
            address = x509.IPAddress(ipaddress.ip_address(name))
            builder = builder.add_extension(x509.SubjectAlternativeName([address]), False)
        return builder.sign(self.ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    def _issue(self, name: str, *, server: bool) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        return pem, self._sign(name, key.public_key(), server=server)


class _TlsFront:
    """The emulator behind TLS that requires a client certificate signed by the CA, in a
    thread of its own: each connection piped to the emulator's port."""

    def __init__(self, certs: _Certificates, tmp: Path, upstream: str) -> None:
        for name, pem in (("ca", certs.ca), ("crt", certs.server), ("key", certs.server_key)):
            (tmp / f"server.{name}").write_bytes(pem)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp / "server.ca")
        self.context.load_cert_chain(tmp / "server.crt", tmp / "server.key")
        self.context.verify_mode = ssl.CERT_REQUIRED
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.loop = asyncio.new_event_loop()
        self.handshakes = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._pipe, "127.0.0.1", 0, ssl=self.context)
        )
        self.url = f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            pipes = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def tls_front(kube_cluster: KubeCluster, tmp_path_factory: Any) -> Iterator[tuple[Any, Any, Path]]:
    certs = _Certificates()
    tmp = tmp_path_factory.mktemp("tls")
    front = _TlsFront(certs, tmp, kube_cluster.url)
    yield front, certs, tmp
    front.stop()


def _tls_kubeconfig(path: Path, url: str, namespace: str, ca: bytes, client: Any) -> str:
    config = kubeconfig(url, namespace)
    config["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(ca).decode()
    if client is not None:
        user = config["users"][0]["user"]
        user["client-certificate-data"] = base64.b64encode(client[1]).decode()
        user["client-key-data"] = base64.b64encode(client[0]).decode()
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_behind_tls_the_kubeconfigs_ca_and_client_certificate_are_used(running_pods, tls_front):
    kube, namespace, names = running_pods
    front, certs, tmp = tls_front
    name = names[-3]  # still running
    kube.append_log(namespace, name, "over tls\n")
    client = (certs.client_key, certs.client)
    path = _tls_kubeconfig(tmp / "good.yaml", front.url, namespace, certs.ca, client)
    conn = kubeconn.connect(kubeconfig=path)
    sink: queue.Queue = queue.Queue()
    try:
        stream = follow_log(conn, namespace, name, "main", sink)
        received = bytearray()
        while not received.endswith(b"over tls\n"):
            kind, _, value = sink.get(timeout=DEADLINE)
            assert kind == "log", value
            received.extend(value)
        stream.stop()
        assert sink.get(timeout=DEADLINE) == ("log_end", name, None)
    finally:
        conn.close()
    assert front.handshakes >= 1

    # A server the kubeconfig's CA did not sign, and a client without a certificate, are
    # refused as the blocking client refuses them.
    stranger = _Certificates()
    refused = {
        "an unknown CA": _tls_kubeconfig(
            tmp / "ca.yaml", front.url, namespace, stranger.ca, client
        ),
        "no client certificate": _tls_kubeconfig(
            tmp / "anon.yaml", front.url, namespace, certs.ca, None
        ),
    }
    for what, path in refused.items():
        conn = kubeconn.connect(kubeconfig=path)
        try:
            with pytest.raises(kubeconn.ClusterUnavailable):
                conn.request("GET", "/version")
            follow_log(conn, namespace, name, "main", sink)
            kind, _, error = sink.get(timeout=DEADLINE)
        finally:
            conn.close()
        assert kind == "log_end" and isinstance(error, kubeconn.ClusterUnavailable), (what, error)
