"""kill -9 at random moments, the long randomised version of tests/faults/test_kill9.py.

    python bench/bench_kill9.py [--rounds 50] [--seconds 300] [--seed N] [--targets ...]

Targets: supervisor-alone (a running job's supervisor, with no other mlcluster process to
notice: this process only reads the store and /proc; everything the ranks started must be
gone within 2 s, by the supervisor's sentinel; the slowest round is printed), supervisor
(cgroup where writable), supervisor-groups (no cgroup: process groups,
the supervisor as child subreaper, the reaper's scan), supervisor-warm (warm ranks forked
from a zygote's fork), zygote, kernel, server (a real `jupyter server`), controller (the
notebook-controller against the Kubernetes API emulator). Each runs `--rounds` rounds or
until `--seconds` pass, whichever is first, and prints one row of the table: faults
injected (kill -9s that hit a live process), rounds survived (every figure zero), and what
was lost: orphaned processes, jobs stuck non-final, lost log lines, duplicate objects.
Exit status 1 if any figure is not zero.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TARGETS = [
    "supervisor-alone",
    "supervisor",
    "supervisor-groups",
    "supervisor-warm",
    "zygote",
    "kernel",
    "server",
    "controller",
]


def _bounded(fn, rounds: int, seconds: float, batch: int = 1):
    """Run `fn(n)` (a Tally for n rounds) in steps until `rounds` are done or time is up."""
    from tests.faults.kill9 import Tally

    total = None
    deadline = time.monotonic() + seconds
    done = 0
    while done < rounds and time.monotonic() < deadline:
        step = fn(min(batch, rounds - done))
        done += step.rounds
        if total is None:
            total = step
        else:
            for name in ("rounds", "injected", "survived", "jobs", "orphans", "stuck", "lost"):
                setattr(total, name, getattr(total, name) + getattr(step, name))
            total.duplicates += step.duplicates
            total.seconds += step.seconds
            total.notes += step.notes
    return total or Tally("none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=300.0, help="per target")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--targets", nargs="*", default=TARGETS, choices=TARGETS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-kill9-"))
    pool = work / "warm-pool"
    pool.mkdir(mode=0o700)
    os.environ.update(
        MLCLUSTER_STORE_DIR=str(work / "store"),
        JUPYTER_CONFIG_DIR=str(work / "jupyter-config"),
        MLCLUSTER_WARM_POOL_DIR=str(pool),
        MLCLUSTER_WARM_POOL="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.config import MLClusterConfig
    from jupyterlab_mlcluster.jobs import warm
    from jupyterlab_mlcluster.jobs.service import JobService
    from tests.faults import kill9

    store = work / "store"
    piddir = work / "pids"
    piddir.mkdir()
    light = MLClusterConfig(warm_pool_modules=["json"])
    print(f"seed {args.seed}, up to {args.rounds} rounds or {args.seconds:.0f} s per target")
    print(kill9.HEADER, flush=True)
    tallies = []
    for target in args.targets:
        rng = random.Random(f"{args.seed}-{target}")
        os.environ["MLCLUSTER_WARM_POOL"] = "1" if target in ("zygote", "supervisor-warm") else "0"
        os.environ["MLCLUSTER_RANK_CGROUP"] = "0" if target == "supervisor-groups" else "1"
        service = JobService(light)
        if target == "supervisor-alone":
            tally, slowest = kill9.lonely_supervisor_rounds(service, args.rounds, piddir)
            tally.notes.insert(0, f"slowest round: {slowest:.2f} s to zero processes")
        elif target.startswith("supervisor"):
            tally = _bounded(
                lambda n, s=service, r=rng: kill9.supervisor_rounds(s, r, n, piddir, batch=5),
                args.rounds,
                args.seconds,
                batch=5,
            )
            tally.target = target
        elif target == "zygote":
            tally = _bounded(
                lambda n, s=service, r=rng: kill9.zygote_rounds(s, r, n, piddir),
                args.rounds,
                args.seconds,
            )
        elif target == "kernel":
            tally = _bounded(
                lambda n, s=service, r=rng: kill9.kernel_rounds(s, r, n, piddir, dict(os.environ)),
                args.rounds,
                args.seconds,
            )
        elif target == "server":
            from tests.server.live import LiveServer

            tally = _bounded(
                lambda n, s=service, r=rng: kill9.server_rounds(
                    s, r, n, piddir, lambda: LiveServer(work / "home", store).start()
                ),
                args.rounds,
                args.seconds,
            )
        else:
            tally = _controller(args, rng, work)
        tallies.append(tally)
        print(tally.row(), flush=True)
        for note in tally.notes[:11]:
            print("   ", note)
    warm.stop(light)
    bad = sum(t.bad for t in tallies)
    print(
        f"total: {sum(t.injected for t in tallies)} faults injected, "
        f"{sum(t.survived for t in tallies)}/{sum(t.rounds for t in tallies)} rounds survived, "
        f"{bad} lost (orphans + stuck + lost lines + duplicates)"
    )
    return 1 if bad else 0


def _controller(args, rng, work: Path):
    from tests.faults import kill9
    from tests.kube.controller_support import install_crds
    from tests.kube.fixtures import start_cluster

    cluster = start_cluster(work / "kubeconfig.yaml")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = cluster.kube
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kube.create_namespace(namespace)
    install_crds(kube)
    try:
        return kill9.controller_rounds(
            kube, namespace, rng, args.rounds, work / "controller.log", seconds=args.seconds
        )
    finally:
        cluster.thread.stop()


if __name__ == "__main__":
    sys.exit(main())
