"""The Kubernetes API server failing at random under running jobs: the long randomised
version of tests/faults/test_kube_api_faults.py.

    python bench/bench_api_faults.py [--rounds 20] [--seconds 600] [--longest 20] [--seed N]
                                     [--failing-deletes 60]

Each round a real supervisor runs a ticking job against the Kubernetes API emulator, reached
through a TCP proxy that the script breaks 1-3 times (connections refused with open watches
reset, everything hung, a 429 storm with Retry-After), each fault up to `--longest` s, and
half the rounds cancel while deletes fail for a while. Printed: faults injected, connections
broken by the proxy, rounds survived (the job carried on, was cancelled with every object
deleted, no line lost or duplicated), the supervisor's highest CPU share and file growth
during a fault. Exit status 1 if anything was lost or left.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop starting rounds after")
    parser.add_argument("--longest", type=float, default=20.0, help="the longest fault, seconds")
    parser.add_argument(
        "--failing-deletes",
        type=float,
        default=None,
        help="every round's cancel meets deletes failing (503) for this many seconds",
    )
    parser.add_argument("--seed", type=int, default=20261126)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-api-faults-"))
    os.environ.update(
        MLCLUSTER_STORE_DIR=str(work / "store"),
        JUPYTER_CONFIG_DIR=str(work / "jupyter-config"),
        MLCLUSTER_WARM_POOL="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    # The emulator first: $KUBECONFIG must name the proxy before the client is imported.
    from tests.faults.proxy import FaultProxy
    from tests.kube.fixtures import start_cluster, write_kubeconfig

    cluster = start_cluster(work / "kubeconfig.yaml")
    host, port = cluster.url.removeprefix("http://").split(":")
    proxy = FaultProxy((host, int(port)))
    os.environ["KUBECONFIG"] = str(write_kubeconfig(work / "proxied.yaml", proxy.url))

    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.service import JobService
    from tests.faults.apifaults import ApiTally, random_rounds
    from tests.kube.jobs_fixtures import write_settings
    from tests.kube.player import ClusterPlayer

    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.kube.create_namespace(namespace)
    write_settings(namespace)
    player = ClusterPlayer(cluster.kube, namespace, work / "node")
    service = JobService()
    print(
        f"seed {args.seed}: up to {args.rounds} rounds or {args.seconds:.0f} s, faults up to "
        f"{args.longest:.0f} s",
        flush=True,
    )
    try:
        tally = random_rounds(
            service,
            player,
            cluster.kube,
            namespace,
            proxy,
            random.Random(args.seed),
            args.rounds,
            seconds=args.seconds,
            longest=args.longest,
            failing_deletes=args.failing_deletes,
        )
    finally:
        for record in service.store.list_jobs()[0]:
            if not record.final:
                service.cancel(record.id)
        player.stop_all()
        proxy.stop()
        cluster.thread.stop()
    print(ApiTally.HEADER)
    print(tally.row())
    for note in tally.notes[:10]:
        print("   ", note)
    print(
        f"total: {tally.injected} faults injected, {tally.survived}/{tally.rounds} rounds "
        f"survived, lost {tally.lost} lines, left {tally.left} objects"
    )
    return 1 if tally.bad else 0


if __name__ == "__main__":
    sys.exit(main())
