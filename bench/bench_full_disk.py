"""A full disk at random moments, the long randomised version of tests/faults/test_full_disk.py.

    python bench/bench_full_disk.py [--rounds 30] [--seconds 300] [--seed N] [--size 8m]

Needs root (it mounts a tmpfs of --size for the job store). Each round submits a random mix
of jobs (chatty ranks, quiet ones, ones whose result is larger than what is left), fills the
disk at a random moment leaving 0 to 300 KB, tries one more submission, lists the jobs every
way (JobStore opened afresh, JobService, `mlcluster jobs`), frees the disk after a random
while, waits for every job to end, checks the store and purges the round's jobs. Printed:
faults injected, submissions refused whole / accepted whole, listings answered, jobs, jobs
survived (final, and `failed` only saying "no space left on ..."), lost (half-written
submissions, crashed listings, jobs stuck or failed for another reason) and orphaned
processes. Exit status 1 if lost or orphans is not zero.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

STUCK_AFTER = 60.0  # for a job to become final once the disk has space again


def _job(rng: random.Random):
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.runtime.payload import Payload

    kind = rng.choice(["chatty", "quiet", "result"])
    spec = JobSpec.from_options({"workers": rng.randint(1, 2)})
    if kind == "chatty":
        seconds = rng.uniform(0.2, 2.0)
        code = (
            f"import time\nend = time.time() + {seconds!r}\ni = 0\n"
            "while time.time() < end:\n    print(f'line {i} ' + 'x' * 200, flush=True)\n"
            "    i += 1\n    time.sleep(0.002)\n"
        )
    elif kind == "quiet":
        code = f"import time\ntime.sleep({rng.uniform(0.1, 2.0)!r})\n"
    else:
        code = f"import os\nos.urandom({rng.randint(1_000, 600_000)})\n"
    return spec, Payload(source=code)


def _ended_well(record) -> bool:
    from jupyterlab_mlcluster.jobs.model import JobState

    text = f"{record.error or ''} {record.reason or ''}"
    return record.state == JobState.SUCCEEDED or (
        record.state == JobState.FAILED and "no space left on" in text
    )


def run_round(service, disk, rng: random.Random, figures) -> None:
    from helpers import job_processes

    from tests.faults.fulldisk import check_whole, listings, random_payload

    jobs = []
    for _ in range(rng.randint(1, 3)):
        spec, payload = _job(rng)
        jobs.append(service.submit(spec, payload).id)
    time.sleep(rng.uniform(0.0, 0.8))
    disk.fill(leave=rng.choice([0, 0, rng.randint(0, 300_000)]))
    figures.injected += 1
    try:
        spec, _ = _job(rng)
        jobs.append(service.submit(spec, random_payload(rng)).id)
        figures.accepted += 1
    except Exception as exc:  # noqa: BLE001 - which error a full disk raises varies
        text = str(exc).lower()
        if "no space" in text or "disk is full" in text or "disk i/o" in text:
            figures.refused += 1
        else:
            figures.lost += 1
            figures.notes.append(f"submission: {exc!r}")
    try:
        listings(service, set(), figures)
    except Exception as exc:  # noqa: BLE001
        figures.lost += 1
        figures.notes.append(f"listing: {exc!r}")
    time.sleep(rng.uniform(0.0, 1.0))
    disk.free()
    for job_id in jobs:
        record = service.wait(job_id, timeout=STUCK_AFTER)
        figures.jobs += 1
        if record.final and _ended_well(record):
            figures.survived += 1
            if record.state.value == "failed":
                figures.said_full += 1
        else:
            figures.lost += 1
            tail = [line["line"] for line in service.logs(job_id, tail=3)[0]]
            figures.notes.append(
                f"{job_id}: {record.state} {record.error!r} {record.reason!r}; log: {tail}"
            )
    check_whole(service.store, figures)
    deadline = time.monotonic() + 10
    while True:
        left = [p for job_id in jobs for p in job_processes(service, job_id)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    figures.orphans += len(left)
    for job_id in jobs:
        service.cancel(job_id, purge=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--size", default="8m", help="tmpfs size (mount -o size=)")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)

    from tests.faults.fulldisk import Disk, Figures, mounted

    with (
        tempfile.TemporaryDirectory(prefix="bench-full-disk-") as tmp,
        mounted(Path(tmp), args.size) as mount_point,
    ):
        if isinstance(mount_point, str):
            print(mount_point, file=sys.stderr)
            return 2
        os.environ["MLCLUSTER_STORE_DIR"] = str(mount_point / "store")
        os.environ["JUPYTER_CONFIG_DIR"] = str(Path(tmp) / "jupyter-config")
        os.environ["MLCLUSTER_WARM_POOL"] = "0"
        import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
        from jupyterlab_mlcluster.jobs.service import JobService

        service = JobService()
        disk = Disk(mount_point)
        figures = Figures()
        started = time.monotonic()
        rounds = 0
        while rounds < args.rounds and time.monotonic() - started < args.seconds:
            run_round(service, disk, rng, figures)
            rounds += 1
        service.store.close()
    print(f"rounds {rounds} in {time.monotonic() - started:.0f} s (seed {seed})")
    print(
        f"{figures.line()}, of which failed saying the disk was full {figures.said_full},"
        f" orphaned processes {figures.orphans}"
    )
    for note in figures.notes[:20]:
        print("  ", note)
    return 1 if figures.lost or figures.orphans else 0


if __name__ == "__main__":
    sys.exit(main())
