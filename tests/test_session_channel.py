"""A Kubernetes session rank's command channel (runtime/session_channel.py) under attack.

The rank is the real one: `session_worker.serve()` in its own process, as in a pod (its
report channel on stdout, the job's key beside its payload, listening on a port it names
in a signed record), or a `CommandChannel` in this process where a test needs a shorter
deadline than a pod's. The supervisor's side is the real `RankLink` (session_link.py).
The attacker holds no key: any pod of the cluster network can connect to the port. Its
connections come from 127.0.0.2, another address than the supervisor's, as another pod's
would.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import resource
import secrets
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.jobs.session_link import SEND_TIMEOUT, RankLink
from jupyterlab_mlcluster.runtime import session_channel
from jupyterlab_mlcluster.runtime.payload import Payload
from jupyterlab_mlcluster.runtime.protocol import (
    KEY_FILE,
    OutputParser,
    decode_record,
    encode_record,
)
from jupyterlab_mlcluster.runtime.session_channel import HELLO, CommandChannel

REPO = Path(__file__).resolve().parent.parent
ATTACKER = "127.0.0.2"  # another pod's address
SERVE = "import sys; from jupyterlab_mlcluster.runtime import session_worker; sys.exit(session_worker.serve())"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc and 127.0.0.2: Linux")


class Rank:
    """A session rank in its own process, as in a pod; `out` and `err` are its pod log."""

    def __init__(self, payload: Path, key: bytes, nofile: int | None = None):
        self.key = key
        env = dict(
            os.environ,
            MLCLUSTER_REPORT="stdout",
            MLCLUSTER_PAYLOAD=str(payload),
            RANK="0",
            MLCLUSTER_SESSION="victim",
            MLCLUSTER_SESSION_ORPHAN_TIMEOUT="0",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        )
        env.pop("MLCLUSTER_SESSION_PORT", None)

        def limit() -> None:  # a pod's nofile limit, set in the child only
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=limit,
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.records: list[dict] = []
        threading.Thread(
            target=self._pump, args=(self.process.stdout, self.out), daemon=True
        ).start()
        threading.Thread(
            target=self._pump, args=(self.process.stderr, self.err), daemon=True
        ).start()
        wait_for(lambda: self.port is not None, timeout=60, message="the rank's port record")

    def _pump(self, stream, into: list[bytes]) -> None:
        parser = OutputParser(self.key, 0)
        for line in iter(stream.readline, b""):
            into.append(line)
            if into is self.out:
                self.records += [v for kind, v in parser.feed(line) if kind == "control"]

    @property
    def port(self) -> int | None:
        ports = [r["port"] for r in self.records if r.get("type") == "session_channel"]
        return ports[0] if ports else None

    @property
    def stdout(self) -> str:
        return b"".join(self.out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return b"".join(self.err).decode(errors="replace")

    def threads(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE).group(1))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


@pytest.fixture
def rank_factory(tmp_path):
    """rank(nofile=None, key=None) -> a Rank with its own (or the given) job key."""
    ranks: list[Rank] = []

    def make(nofile: int | None = None, key: bytes | None = None) -> Rank:
        payload = tmp_path / f"payload-{len(ranks)}"
        payload.mkdir()
        key = key or secrets.token_bytes(32)
        (payload / KEY_FILE).write_bytes(key)
        ranks.append(Rank(payload, key, nofile))
        return ranks[-1]

    yield make
    for rank in ranks:
        rank.stop()


def connected(link: RankLink, timeout: float = 30) -> bool:
    """The supervisor's loop, reduced to this link: ensure() until connected or failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if link.ensure(time.monotonic()):
            return True
        if getattr(link, "wire", None) is None and link.failures:  # (no dial: failed)
            return False
        time.sleep(0.01)
    return False


def link_to(rank: Rank | int, key: bytes) -> RankLink:
    link = RankLink(0, key, give_up_after=60)
    link.address("127.0.0.1", rank if isinstance(rank, int) else rank.port)
    return link


def cell(source: str, job: str) -> dict:
    data = base64.b64encode(zlib.compress(Payload(kind="code", source=source).dumps())).decode()
    return {"type": "cell", "job": job, "payload_data": data, "env": {}}


def attacker(port: int, timeout: float = 10) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout, source_address=(ATTACKER, 0))


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """The other end closed `sock` (EOF or reset) within `within` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


# -- 1. the port stays open -----------------------------------------------------------------


def test_attack_a_full_descriptor_table_does_not_close_a_ranks_port(rank_factory):
    # A pod's nofile limit of 64, and a keyless pod opening twice as many idle connections:
    # accept() fails (EMFILE) again and again. The rank goes on accepting (it drops the
    # flooder's oldest handshakes for room), so the supervisor gets in while the flood is
    # held and after it, and its commands run.
    rank = rank_factory(nofile=64)
    flood = []
    for _ in range(120):
        with contextlib.suppress(OSError):
            flood.append(attacker(rank.port, timeout=2))
    assert len(flood) > 64
    during = link_to(rank, rank.key)
    assert connected(during), during.last_error
    during.close()
    for sock in flood:
        sock.close()
    after = link_to(rank, rank.key)
    assert connected(after), after.last_error
    after.send({**cell("print('the supervisor got through', flush=True)", "c1"), "seq": 1})
    wait_for(lambda: "the supervisor got through" in rank.stdout, timeout=30, message="the cell")
    after.close()
    assert rank.process.poll() is None


# -- 2. what a keyless connection may cost ------------------------------------------------


def test_attack_a_slow_handshake_ends_at_its_deadline_by_the_clock():
    # One byte every 0.2 s: each read returns in time, the handshake never ends by itself.
    channel = CommandChannel(secrets.token_bytes(32), 0, lambda job: None, handshake_timeout=1.0)
    try:
        slow = attacker(channel.port)
        assert slow.makefile("rb").readline().startswith(HELLO)
        started = time.monotonic()
        with pytest.raises(OSError):
            while time.monotonic() - started < 10:
                slow.sendall(b"A")
                time.sleep(0.2)
        assert time.monotonic() - started < 5  # closed near 1 s, not after 10 s of trickle
        slow.close()
    finally:
        channel.close()


def test_attack_many_keyless_connections_cost_no_thread_and_at_most_a_kilobyte_each(
    rank_factory,
):
    rank = rank_factory()
    threads, rss = rank.threads(), rank.rss_kib()
    # A hello of 60 KB without a newline is refused once past 1 KiB, unbuffered.
    big = attacker(rank.port)
    big.sendall(b"B" * 60000)
    assert closed_by_peer(big, within=5)
    big.close()
    flood = []
    for _ in range(300):
        sock = attacker(rank.port)
        with contextlib.suppress(OSError):
            sock.sendall(b"B" * 1000)  # below the cap: a hello still coming
        flood.append(sock)
    supervisor = link_to(rank, rank.key)
    assert connected(supervisor), supervisor.last_error  # the flood does not crowd it out
    assert rank.threads() <= threads + 1, "a thread per connection"
    assert rank.rss_kib() - rss < 8 * 1024
    # At most MAX_PENDING handshakes are held: the flood's oldest were closed for room.
    wait_for(
        lambda: (
            sum(not closed_by_peer(s, within=0.01) for s in flood) <= session_channel.MAX_PENDING
        ),
        timeout=10,
        message="the flood's handshakes past the cap closed",
    )
    for sock in flood:
        sock.close()
    supervisor.close()


def test_attack_refused_connections_are_counted_not_logged_one_by_one(rank_factory, capfd):
    # Each refused connection used to write a line to the pod log, which is the running
    # cell's log: 200 refusals, one line (the count comes once a minute).
    rank = rank_factory()
    for _ in range(200):
        with attacker(rank.port) as sock:
            sock.makefile("rb").readline()
            sock.sendall(b"not a hello\n")
            assert closed_by_peer(sock, within=10)
    supervisor = link_to(rank, rank.key)
    assert connected(supervisor)  # (the rank is alive and has read them all)
    supervisor.close()
    assert sum("refused" in line for line in rank.stderr.splitlines()) == 1, rank.stderr
    # The count, once the period is over (a short one, in this process).
    channel = CommandChannel(secrets.token_bytes(32), 0, lambda job: None, refusal_period=0.5)
    try:
        for _ in range(50):
            with attacker(channel.port) as sock:
                sock.sendall(b"x\n")
                assert closed_by_peer(sock, within=10)

        lines: list[str] = []

        def counted() -> int:
            """Refusals the output accounts for: a line each, or the count it gives."""
            err = capfd.readouterr().err
            lines.extend(x for x in err.splitlines() if "mlcluster session: rank 0 refused" in x)
            counts = [re.search(r" (\d+) more times? in the last", x) for x in lines]
            return sum(1 if m is None else int(m.group(1)) for m in counts)

        wait_for(lambda: counted() == 50, timeout=10, message="every refusal counted")
        assert 2 <= len(lines) <= 10, lines
    finally:
        channel.close()


# -- 3. a command holds on its own connection only ------------------------------------------


class Recorder:
    """On the wire between the supervisor and a rank: what the supervisor sends, kept."""

    def __init__(self, upstream: int):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sent = b""
        threading.Thread(target=self._run, args=(upstream,), daemon=True).start()

    def _run(self, upstream: int) -> None:
        client, _ = self.server.accept()
        rank = socket.create_connection(("127.0.0.1", upstream))
        threading.Thread(target=self._pump, args=(rank, client, False), daemon=True).start()
        self._pump(client, rank, True)

    def _pump(self, src: socket.socket, dst: socket.socket, keep: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if keep:
                    self.sent += data
                dst.sendall(data)

    def lines(self) -> list[bytes]:
        return [line + b"\n" for line in self.sent.split(b"\n") if line]


def test_attack_a_command_replayed_on_another_connection_or_attempt_is_refused(rank_factory):
    rank = rank_factory()
    wire = Recorder(rank.port)
    first = link_to(wire.port, rank.key)
    assert connected(first)
    first.send({**cell("print('RAN the recorded cell', flush=True)", "c1"), "seq": 1})
    wait_for(lambda: "RAN the recorded cell" in rank.stdout, timeout=30, message="the cell")
    wait_for(lambda: len(wire.lines()) == 2, timeout=10, message="the recorded lines")
    recorded = wire.lines()[1]  # (the first is the supervisor's hello)

    # The same rank, a new connection of the supervisor's: the recorded line injected.
    second = link_to(rank, rank.key)
    assert connected(second)
    second.sock.sendall(recorded)
    wait_for(lambda: "ignored a command" in rank.stderr, timeout=30, message="the refusal")
    assert rank.stdout.count("RAN the recorded cell") == 1
    second.close()
    first.close()

    # The session restarted: fresh pods, the same job key, the supervisor's sequence
    # numbers from 1 again. The line recorded in the first attempt is refused there too.
    fresh = rank_factory(key=rank.key)
    third = link_to(fresh, rank.key)
    assert connected(third)
    third.sock.sendall(recorded)
    wait_for(lambda: "ignored a command" in fresh.stderr, timeout=30, message="the refusal")
    # Its own supervisor's commands, numbered from 1 on this connection, run.
    third.send({**cell("print('RAN the new attempt', flush=True)", "c2"), "seq": 1})
    wait_for(lambda: "RAN the new attempt" in fresh.stdout, timeout=30, message="the new cell")
    assert "RAN the recorded cell" not in fresh.stdout
    third.close()


def test_a_dropped_connections_commands_are_sent_again_signed_for_the_next(rank_factory):
    # The link keeps the cell's commands and sends them again after a reconnect, signed
    # for the new connection: the rank that had them refuses them as replays (their
    # numbers), and nothing runs twice.
    rank = rank_factory()
    link = link_to(rank, rank.key)
    assert connected(link)
    link.send({**cell("print('RAN once', flush=True)", "c1"), "seq": 1})
    wait_for(lambda: "RAN once" in rank.stdout, timeout=30, message="the cell")
    link.close()  # dropped; the window still holds the cell
    link.retry_at = 0.0
    assert connected(link)
    wait_for(lambda: "ignored a command" in rank.stderr, timeout=30, message="the resend refused")
    link.send({**cell("print('RAN next', flush=True)", "c2"), "seq": 2})
    wait_for(lambda: "RAN next" in rank.stdout, timeout=30, message="the next cell")
    assert rank.stdout.count("RAN once") == 1
    link.close()


@pytest.mark.slow
def test_a_rank_that_stops_reading_holds_up_no_send():
    # A partitioned pod, or one whose reading is stuck: once its buffers are full, a
    # blocking send of a cell (megabytes) held the supervisor's loop up to SEND_TIMEOUT.
    key = secrets.token_bytes(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        link = link_to(server.getsockname()[1], key)
        assert not link.ensure(time.monotonic())  # dialling, on the link's own thread
        conn, _ = server.accept()
        with conn:
            nonce = secrets.token_hex(16)
            conn.sendall(HELLO + nonce.encode() + b"\n")
            hello = decode_record(conn.makefile("rb").readline().rstrip(b"\n"), key, 0)
            assert hello and hello["rank_nonce"] == nonce
            conn.sendall(encode_record({"type": "hello_ok", "nonce": hello["nonce"]}, key, 0))
            assert connected(link)
            big = {**cell("x = 1", "c1"), "pushed": "p" * 2**25, "seq": 1}
            started = time.monotonic()
            assert link.send(big)
            assert link.send({"type": "interrupt", "job": "c1", "seq": 2})
            # A send that waited on the socket would take SEND_TIMEOUT; what is left is
            # signing 32 MiB in this thread, seconds at most on a loaded machine.
            assert time.monotonic() - started < SEND_TIMEOUT / 2
            link.close()


def test_a_forged_hello_or_one_for_another_nonce_gets_no_channel():
    key = secrets.token_bytes(32)
    channel = CommandChannel(key, 0, lambda job: None, handshake_timeout=5.0)
    try:
        for hello in (
            lambda nonce: encode_record(
                {"type": "hello", "rank_nonce": nonce, "nonce": "n"}, b"k" * 32, 0
            ),
            lambda nonce: encode_record({"type": "hello", "rank_nonce": "x", "nonce": "n"}, key, 0),
            lambda nonce: encode_record(
                {"type": "hello", "rank_nonce": nonce, "nonce": "n"}, key, 1
            ),
        ):
            with attacker(channel.port) as sock:
                nonce = sock.makefile("rb").readline().rstrip(b"\n")[len(HELLO) :].decode()
                sock.sendall(hello(nonce))
                assert closed_by_peer(sock, within=10)
        assert channel.current is None
    finally:
        channel.close()
