"""The right culprit, measured: rank 1 raises ValueError while rank 0 waits in a barrier (and
then fails with gloo's "Connection closed by peer"), run N times; the job must name rank 1.

    python bench/bench_culprit.py [--runs 50] [--mode warm|cold|both] [--freeze]

Runs tests/compat/scripts/culprit.py as written (no freezing unless --freeze) through the
JobService in a fresh store, as `mlcluster run` would, and prints, per mode, how many runs
named the wrong rank and how long a run took. Exit status 1 if any run was wrong. The figure
of issue 23's closing note comes from here; tests/compat/test_failures.py is the in-suite,
deterministic version.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRIPT = ROOT / "tests" / "compat" / "scripts" / "culprit.py"


def run(mode: str, runs: int, freeze: bool) -> tuple[int, int, float]:
    """(runs, wrong, seconds per run) of one mode, in a store of its own."""
    with tempfile.TemporaryDirectory(prefix="bench-culprit-") as tmp:
        os.environ["MLCLUSTER_STORE_DIR"] = str(Path(tmp) / "store")
        # A pool of its own: a developer's running zygote may hold another version's code.
        pool = Path(tmp) / "pool"
        pool.mkdir(mode=0o700)
        os.environ["MLCLUSTER_WARM_POOL_DIR"] = str(pool)
        os.environ["MLCLUSTER_WARM_POOL"] = "1" if mode == "warm" else "0"
        os.environ["CULPRIT_FREEZE"] = "1" if freeze else "0"
        import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
        from jupyterlab_mlcluster.jobs.model import JobSpec
        from jupyterlab_mlcluster.jobs.service import JobService
        from jupyterlab_mlcluster.runtime.errors import read_error_file
        from jupyterlab_mlcluster.runtime.payload import Payload

        service = JobService()
        wrong = 0
        started = time.monotonic()
        for n in range(runs):
            payload = Payload(kind="script", filename=str(SCRIPT))
            record = service.submit(JobSpec(workers=2), payload)
            record = service.wait(record.id, timeout=120)
            ok = record.state == "failed" and record.failed_rank == 1
            ok = ok and record.error == "rank 1 failed: ValueError: rank 1 broke"
            ok = ok and {r.rank: str(r.state) for r in record.ranks} == {
                0: "cancelled",
                1: "failed",
            }
            if not ok:
                wrong += 1
                print(f"  run {n}: {record.state} rank {record.failed_rank}: {record.error}")
                for rank in (0, 1):
                    report = read_error_file(service.store.error_path(record.id, rank), rank)
                    when = report and report.get("timestamp")
                    exit_code = record.ranks[rank].exit_code
                    print(f"    rank {rank}: exit {exit_code}, reported at {when}")
        per_run = (time.monotonic() - started) / max(runs, 1)
        stop_pool(pool)
        return runs, wrong, per_run


def stop_pool(pool: Path) -> None:
    from jupyterlab_mlcluster.jobs import warm

    for sock in pool.glob("zygote-*.sock"):
        try:
            warm.request(sock, {"op": "stop"}, timeout=2)
        except (OSError, ValueError, RuntimeError):
            pass  # already gone


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--mode", choices=["warm", "cold", "both"], default="both")
    parser.add_argument("--freeze", action="store_true", help="make the race certain")
    args = parser.parse_args()
    modes = ["warm", "cold"] if args.mode == "both" else [args.mode]
    print("| ranks | runs | wrong culprit | s/run |")
    print("|---|---|---|---|")
    failed = False
    for mode in modes:
        runs, wrong, per_run = run(mode, args.runs, args.freeze)
        failed |= wrong > 0
        print(f"| {mode} | {runs} | {wrong} | {per_run:.2f} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
