"""What following many quiet pod logs costs one process: a thread per stream (the former
`PodLogFollower`, kept here only to compare) against the process's one event loop
(backends/kubernetes/log_loop.py), against the API emulator (tests/kube) over HTTP.

    python bench/bench_log_streams.py [--streams 200 500]

For each count N, N running pods with one line of log each; then, in a fresh process per
variant: N streams opened, and once every stream's line has arrived (all open, all quiet):
threads of the process, its RSS and USS (growth over the same process before the streams),
its CPU over a --window of silence, the time to open them all, and the time for stop() of all
until every ("log_end", ...) came.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
MIB = 2**20


class ThreadPerStream:
    """The former follower (before log_loop.py): one daemon thread per stream."""

    def __init__(self, conn: Any, namespace: str, pod: str, container: str, sink: queue.Queue):
        from jupyterlab_mlcluster.backends.kubernetes.client import kind_of
        from jupyterlab_mlcluster.backends.kubernetes.log_loop import QUIET_STREAM_TIMEOUT

        self.pod, self._conn, self._sink, self._container = pod, conn, sink, container
        self._path = kind_of("v1", "Pod").path(namespace, pod, "log")
        self._timeout = (conn.request_timeout, QUIET_STREAM_TIMEOUT)
        self._response: Any = None
        self.thread = threading.Thread(target=self._run, name=f"log-{pod}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._response = self._conn.request(
                "GET",
                self._path,
                query={"container": self._container, "follow": True},
                stream=True,
                timeout=self._timeout,
            )
            for chunk in self._response.stream(amt=None, decode_content=False):
                if chunk:
                    self._sink.put(("log", self.pod, bytes(chunk)))
        except Exception as exc:  # noqa: BLE001
            error = exc
        finally:
            if self._response is not None:
                self._response.release_conn()
            self._sink.put(("log_end", self.pod, error))

    def stop(self) -> None:
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _measure(variant: str, count: int, namespace: str, window: float) -> dict[str, Any]:
    """In the child process: open `count` streams the `variant` way; what they cost."""
    from jupyterlab_mlcluster import kubeconn
    from jupyterlab_mlcluster.backends.kubernetes.log_loop import follow_log

    me = psutil.Process()
    conn = kubeconn.connect(namespace=namespace, pool_size=count + 10)
    conn.request("GET", "/version")

    def follow(pod: str, sink: queue.Queue) -> Any:
        if variant == "thread":
            return ThreadPerStream(conn, namespace, pod, "main", sink)
        return follow_log(conn, namespace, pod, "main", sink)

    warm: queue.Queue = queue.Queue()  # one stream first: imports and lazy setup out of the way
    stream = follow("p0", warm)
    warm.get(timeout=60)
    stream.stop()
    while warm.get(timeout=60)[0] != "log_end":
        pass
    if variant == "thread":
        stream.thread.join(60)
    before_threads = me.num_threads()
    before = me.memory_full_info()
    sink: queue.Queue = queue.Queue()
    started = time.monotonic()
    streams = [follow(f"p{i}", sink) for i in range(count)]
    got: set[str] = set()
    while len(got) < count:
        kind, pod, _ = sink.get(timeout=120)
        assert kind == "log", (kind, pod, _)
        got.add(pod)
    opened = time.monotonic() - started
    cpu = me.cpu_times()
    time.sleep(window)  # measuring idle cost: nothing to wait for
    cpu_after = me.cpu_times()
    after = me.memory_full_info()
    threads = me.num_threads()
    started = time.monotonic()
    for stream in streams:
        stream.stop()
    ended = 0
    while ended < count:
        ended += sink.get(timeout=120)[0] == "log_end"
    stopped = time.monotonic() - started
    busy = (cpu_after.user + cpu_after.system) - (cpu.user + cpu.system)
    return {
        "threads_before": before_threads,
        "threads": threads,
        "rss_mib": (after.rss - before.rss) / MIB,
        "uss_mib": (after.uss - before.uss) / MIB,
        "rss_total_mib": after.rss / MIB,
        "cpu_pct": 100.0 * busy / window,
        "open_s": opened,
        "stop_s": stopped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[200, 500])
    parser.add_argument("--window", type=float, default=5.0, help="idle CPU window (s)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, count, namespace = args.child
        print(json.dumps(_measure(variant, int(count), namespace, args.window)))
        return

    from tests.kube.fixtures import start_cluster

    kubeconfig = Path(tempfile.mkdtemp(prefix="bench-log-streams-")) / "kubeconfig.yaml"
    cluster = start_cluster(kubeconfig)
    kube, namespace = cluster.kube, "bench-logs"
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    try:
        kube.create_namespace(namespace)
        made = 0
        rows = []
        for count in sorted(args.streams):
            for i in range(made, count):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"p{i}"},
                    "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
                }
                kube.create(pod, namespace)
                kube.set_pod_phase(namespace, f"p{i}", "Running")
                kube.append_log(namespace, f"p{i}", f"pod {i} started\n")
            made = max(made, count)
            for variant in ("thread", "loop"):
                out = subprocess.run(
                    [sys.executable, __file__, "--window", str(args.window), "--child"]
                    + [variant, str(count), namespace],
                    env=env,
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                rows.append((count, variant, json.loads(out.strip().splitlines()[-1])))
    finally:
        cluster.thread.stop()
    print(
        f"{'streams':>7} {'variant':>7} {'threads':>13} {'+RSS MiB':>9} {'+USS MiB':>9} "
        f"{'RSS MiB':>8} {'idle CPU %':>10} {'open s':>7} {'stop s':>7}"
    )
    for count, variant, r in rows:
        threads = f"{r['threads_before']} -> {r['threads']}"
        print(
            f"{count:>7} {variant:>7} {threads:>13} {r['rss_mib']:>9.1f} {r['uss_mib']:>9.1f} "
            f"{r['rss_total_mib']:>8.1f} {r['cpu_pct']:>10.2f} {r['open_s']:>7.2f} "
            f"{r['stop_s']:>7.2f}"
        )


if __name__ == "__main__":
    main()
