"""GET /jobs on a big job store: this checkout's server, and optionally an older one beside it.

    python bench/bench_list.py [--jobs 10000] [--requests 300] [--old REV] [--store DIR]

Fills a job store with `--jobs` ended jobs (bench_server.fill_store), starts a real
`jupyter server` with the extension on a copy of it (and, with `--old REV`, a second one
running git revision REV of this repository on another copy), waits `--settle` seconds (the
servers' start-up reads, such as the first /metrics read, are not what is measured), then
sends each path `--requests` times on one keep-alive connection per server. With two
servers the requests alternate in random order, so both see the same machine load, and
each path's answers must be byte for byte the same. Prints median, p95 and max (ms), and
each server's CPU use while idle (before the requests): its background work, which
competes with its requests (and with the other server's: so a server is stopped, SIGSTOP,
while the other one answers; they take turns in blocks of BLOCK requests).
`--store DIR`: fill DIR once and reuse it on later runs.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TOKEN = "mlcluster-test-token"
BLOCK = 10
PATHS = ["jobs", "jobs?parent=none", "jobs?state=failed&offset=500", "jobs?limit=1000"]


def serve(tree: str, home: str, store: str) -> None:
    """(Child process) a LiveServer of `tree` on `store`: prints its port, stops at EOF."""
    sys.path.insert(0, tree)
    from tests.server.live import LiveServer

    server = LiveServer(Path(home), Path(store)).start(timeout=300)
    assert server.proc is not None
    print(server.port, server.proc.pid, flush=True)
    sys.stdin.read()
    server.stop()


def fill(store: Path, count: int) -> None:
    sys.path.insert(0, str(REPO))
    from bench.bench_server import fill_store
    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    t0 = time.perf_counter()
    job_store = JobStore(store)
    fill_store(job_store, count)
    job_store.close()
    print(f"filled {store} with {count} jobs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def export(rev: str, into: Path) -> None:
    """Revision `rev` of this repository's files, unpacked into `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


class Server:
    def __init__(self, name: str, tree: Path, home: Path, store: Path):
        self.name = name
        shutil.copytree(store, home / "store")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(tree), str(home), str(home / "store")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        port, pid = self.proc.stdout.readline().split()
        self.process = psutil.Process(int(pid))  # the jupyter server itself
        self.conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)

    def cpu_seconds(self) -> float:
        return sum(self.process.cpu_times()[:2])

    def get(self, path: str) -> tuple[float, bytes]:
        t0 = time.perf_counter()
        self.conn.request(
            "GET", f"/mlcluster/api/{path}", headers={"Authorization": f"token {TOKEN}"}
        )
        response = self.conn.getresponse()
        body = response.read()
        elapsed = time.perf_counter() - t0
        if response.status != 200:
            raise RuntimeError(f"{self.name} GET {path}: {response.status} {body[:300]!r}")
        return elapsed, body

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(120)
        # An older revision's helper may leave its server running (one was found orphaned
        # after a run): nothing the bench started outlives it.
        if self.process.is_running():
            self.process.terminate()
            try:
                self.process.wait(20)
            except psutil.TimeoutExpired:
                self.process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--requests", type=int, default=300, help="per path (a tenth for limit=1000)"
    )
    parser.add_argument("--old", metavar="REV", help="also measure this git revision's server")
    parser.add_argument("--store", type=Path, help="fill this directory once and reuse it")
    parser.add_argument(
        "--settle", type=float, default=8.0, help="seconds between start and measuring"
    )
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU sampled")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    with tempfile.TemporaryDirectory(prefix="mlcluster-bench-list-") as tmp:
        work = Path(tmp)
        store = args.store or work / "store0"
        if not (store / "jobs.db").exists():
            fill(store, args.jobs)
        trees = {"new": REPO}
        if args.old:
            export(args.old, work / "old-tree")
            trees["old"] = work / "old-tree"
        servers = []
        try:
            for name, tree in trees.items():
                (work / name).mkdir()
                servers.append(Server(name, tree, work / name, store))
            time.sleep(args.settle)
            for path in PATHS:
                bodies = {s.name: s.get(path)[1] for s in servers}
                if len(set(bodies.values())) > 1:
                    raise SystemExit(f"the servers answer GET {path} differently")
            cpu0 = {s.name: s.cpu_seconds() for s in servers}
            time.sleep(args.idle)
            idle = {s.name: (s.cpu_seconds() - cpu0[s.name]) / args.idle for s in servers}
            load_start = os.getloadavg()[0]
            times: dict[tuple[str, str], list[float]] = {}
            for path in PATHS:
                count = args.requests if "limit=1000" not in path else max(10, args.requests // 10)
                for _ in range(0, count, BLOCK):
                    random.shuffle(servers)
                    for server in servers:
                        others = [s for s in servers if s is not server]
                        for other in others:
                            other.process.suspend()
                        try:
                            for _ in range(BLOCK):
                                elapsed = server.get(path)[0] * 1000
                                times.setdefault((path, server.name), []).append(elapsed)
                        finally:
                            for other in others:
                                other.process.resume()
            load_end = os.getloadavg()[0]
        finally:
            for server in servers:
                server.stop()
    print(f"{args.jobs} jobs; load average {load_start:.1f} at start, {load_end:.1f} at end")
    for name, share in sorted(idle.items()):
        print(f"{name} server idle: {share * 100:.1f} % of a core")
    print(f"{'GET':<32} {'server':<6} {'n':>5} {'median':>8} {'p95':>8} {'max':>8}")
    for (path, name), ms in sorted(times.items()):
        ms.sort()
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        print(
            f"{path:<32} {name:<6} {len(ms):>5} {statistics.median(ms):>8.1f} {p95:>8.1f} {ms[-1]:>8.1f}"
        )


if __name__ == "__main__":
    main()
