"""Benchmark of the notebook-controller against the Kubernetes API emulator.

Measures (1) the time for N Notebooks, created as fast as a client can, to reach their full
object set (StatefulSet, Service, VirtualService, AuthorizationPolicy) and a status, and
(2) the controller's CPU use once everything is in shape (idle), with psutil.

    python bench/bench_controller.py [--notebooks 1000] [--namespaces 10] [--idle-seconds 10]
                                     [--old REV]

The emulator runs in this process (one thread), with the 8 creating clients; the controller
is a separate process started as ``python -m notebook_controller``. They share this
machine's cores. `--old REV`: the same burst again, on a fresh emulator, with the controller
of git revision REV of this repository (unpacked beside); both in one table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_list import export  # after the sys.path line
from notebook_controller import objects
from notebook_controller.crd import notebook_crd
from tests.helpers import stop_process
from tests.kube.fixtures import start_cluster
from tests.kube.istio import istio_crds

CHILDREN = [
    ("apps", "statefulsets"),
    ("", "services"),
    ("networking.istio.io", "virtualservices"),
    ("security.istio.io", "authorizationpolicies"),
]


class Creators:
    """The creating clients: a kept-alive HTTP connection per thread, a POST per Notebook.
    (Through the tests' `requests` client, the 8 threads' own work was a tenth of this
    process's CPU, which the emulator shares: the clients are not what is measured.)"""

    def __init__(self, url: str) -> None:
        self.address = urllib.parse.urlsplit(url)
        self.local = threading.local()

    def create(self, notebook: dict) -> None:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = self.local.connection = http.client.HTTPConnection(
                self.address.hostname, self.address.port, timeout=60
            )
        meta = notebook["metadata"]
        connection.request(
            "POST",
            f"/apis/{notebook['apiVersion']}/namespaces/{meta['namespace']}/notebooks",
            json.dumps(notebook),
            {"Content-Type": "application/json", "Authorization": "Bearer emulator-token"},
        )
        response = connection.getresponse()
        body = response.read()
        if response.status != 201:
            raise RuntimeError(f"create {meta['name']}: {response.status} {body[:200]!r}")


def wait(predicate, timeout: float, interval: float = 0.5, tick=None) -> float:
    """Poll `predicate` until true; `tick()` (if given) is called at each poll."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not done after {timeout} s")
        if tick is not None:
            tick()
        time.sleep(interval)
    return time.monotonic() - start


class Progress:
    """The burst as it goes, on stderr every `every` seconds (owned objects so far, API
    requests, controller CPU and RSS), and the controller's peak RSS: where the time and the
    memory go shows in the timeline, not in the end figures alone."""

    def __init__(self, thread, process: psutil.Process, begin: float, every: float = 10.0):
        self.thread, self.process, self.begin, self.every = thread, process, begin, every
        self.peak_rss = 0.0
        self._last = begin

    def __call__(self) -> None:
        rss = self.process.memory_info().rss / 2**20
        self.peak_rss = max(self.peak_rss, rss)
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        counts, requests = self.thread.call(
            lambda e: ([e.count(g, p) for g, p in CHILDREN], e._request_count)
        )
        cpu = sum(self.process.cpu_times()[:2])
        here = sum(os.times()[:2])  # this process: the emulator and the creating clients
        print(
            f"[{now - self.begin:6.1f} s] owned {counts}, {requests} requests,"
            f" controller {cpu:.1f} s CPU, {rss:.0f} MiB, emulator {here:.1f} s CPU,"
            f" load {os.getloadavg()[0]:.1f}",
            file=sys.stderr,
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--old", metavar="REV", help="also measure this git revision's controller")
    args = parser.parse_args()
    trees = {"this checkout": ROOT}
    with tempfile.TemporaryDirectory(prefix="mlcluster-bench-controller-") as tmp:
        if args.old:
            old = Path(tmp) / "old-tree"
            export(args.old, old)
            trees[f"old ({args.old})"] = old
        results = {label: burst(args, tree) for label, tree in trees.items()}
    names = [name for name, _ in next(iter(results.values()))]
    table = [("measure", *results)] + [
        (name, *(dict(rows)[name] for rows in results.values())) for name in names
    ]
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    for n, row in enumerate(table):
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    return 0


def burst(args: argparse.Namespace, tree: Path) -> list[tuple[str, str]]:
    """One burst of `args.notebooks` against a fresh emulator, the controller run from
    `tree`: (measure, value) rows."""

    cluster = start_cluster(Path(tempfile.mkdtemp()) / "kubeconfig.yaml")
    kube, thread = cluster.kube, cluster.thread
    kube.install_crd(notebook_crd())
    for crd in istio_crds():
        kube.install_crd(crd)
    namespaces = [f"bench-{i}" for i in range(args.namespaces)] + ["warmup"]
    for namespace in namespaces:
        kube.create_namespace(namespace)

    log = open(os.environ.get("BENCH_LOG", Path(tempfile.mkdtemp()) / "controller.log"), "a")
    controller = subprocess.Popen(
        [
            sys.executable,
            *os.environ.get("BENCH_PYTHON_ARGS", "").split(),
            "-m",
            "notebook_controller",
            f"--kubeconfig={cluster.kubeconfig}",
            "--no-culling",
            f"--log-level={os.environ.get('BENCH_LOG_LEVEL', 'WARNING')}",
        ],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=log,
        stderr=log,
    )
    process = psutil.Process(controller.pid)
    try:
        kube.create(objects.notebook_resource("warmup", "warmup", "bench", workspace_size=None))
        warmup = wait(
            lambda: kube.find("security.istio.io/v1", "AuthorizationPolicy", "warmup", "warmup"),
            timeout=600,  # the controller's imports, on a loaded machine
            interval=0.1,
        )
        requests_before = thread.call(lambda e: e._request_count)
        cpu_before = sum(process.cpu_times()[:2])
        here_before = sum(os.times()[:2])

        names = [(namespaces[i % args.namespaces], f"nb-{i:04d}") for i in range(args.notebooks)]
        begin = time.monotonic()
        progress = Progress(thread, process, begin)
        creators = Creators(cluster.url)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda nn: creators.create(objects.notebook_resource(nn[1], nn[0], "bench")),
                    names,
                )
            )
        created = time.monotonic() - begin
        expected = args.notebooks + 1

        def complete() -> bool:
            counts = thread.call(lambda e: [e.count(g, p) for g, p in CHILDREN])
            return all(count == expected for count in counts)

        wait(complete, args.timeout, tick=progress)
        objects_done = time.monotonic() - begin
        wait(
            lambda: (
                thread.call(
                    lambda e: e.count(
                        "mlcluster.io",
                        "notebooks",
                        lambda nb: bool((nb.get("status") or {}).get("phase")),
                    )
                )
                == expected
            ),
            args.timeout,
            tick=progress,
        )
        status_done = time.monotonic() - begin
        burst_cpu = sum(process.cpu_times()[:2]) - cpu_before
        here_cpu = sum(os.times()[:2]) - here_before
        burst_requests = thread.call(lambda e: e._request_count) - requests_before

        # Idle means no more API traffic: wait until requests stop for 3 s in a row.
        quiet_since, last_count = time.monotonic(), -1
        while time.monotonic() - quiet_since < 3:
            count = thread.call(lambda e: e._request_count)
            if count != last_count:
                quiet_since, last_count = time.monotonic(), count
            progress()
            time.sleep(0.5)
        quiet = time.monotonic() - begin - 3
        process.cpu_percent(None)
        time.sleep(args.idle_seconds)
        idle_cpu = process.cpu_percent(None)
        rss = process.memory_info().rss / 2**20
    finally:
        stop_process(controller, grace=30)
        thread.stop()
        log.close()

    rows = [
        ("notebooks", f"{args.notebooks} in {args.namespaces} namespaces"),
        ("controller start to first notebook served", f"{warmup + 0:.1f} s (incl. imports)"),
        ("client creates (8 threads)", f"{created:.1f} s"),
        (
            "all owned objects present",
            f"{objects_done:.1f} s  ({args.notebooks / objects_done:.0f} notebooks/s)",
        ),
        ("all statuses written", f"{status_done:.1f} s"),
        ("last API request of the burst", f"{quiet:.1f} s"),
        (
            "API requests during the burst (all clients)",
            f"{burst_requests}  ({burst_requests / args.notebooks:.1f} per notebook)",
        ),
        ("controller CPU during the burst", f"{burst_cpu:.1f} s"),
        ("emulator (and clients) CPU during the burst", f"{here_cpu:.1f} s"),
        (
            f"controller idle CPU ({args.idle_seconds:.0f} s sample)",
            f"{idle_cpu:.1f} % of one core",
        ),
        ("controller RSS after the burst", f"{rss:.0f} MiB (peak {progress.peak_rss:.0f} MiB)"),
        ("machine", f"{psutil.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"),
    ]
    return rows


if __name__ == "__main__":
    sys.exit(main())
