"""Kubernetes jobs supervised together (jobs/running/fleet.py, shared_watches.py): one
process for all of a store's jobs, two list-watches on the API for all of them, and a fleet
killed mid-run replaced by one that adopts every job and loses no log line."""

from __future__ import annotations

import os
import queue
import signal
import time

from helpers import process_gone, wait_for

from tests.kube.jobs_fixtures import code, log_text, spec_of
from tests.kube.player import objects_of

GATED = """
import os, time
print("before", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
print("after", flush=True)
int(os.environ["RANK"]) + x
"""  # waits for a file "go" in its working directory


def _watches(kube, path: str) -> int:
    """Watch requests made on `path` so far."""
    return kube.on_emulator(
        lambda e: sum(
            1 for r in e["get", path] if str(r.params.get("watch", "")).lower() in ("true", "1")
        )
    )


def _running(service, player, ids: list[str]) -> dict[str, list]:
    """Each job's pods made, scheduled and started; returns its rank processes by job."""
    runs: dict[str, list] = {}
    for job_id in ids:
        job = player.resumed(job_id)
        for pod in player.create_pods(job).values():
            player.schedule(pod)
            runs.setdefault(job_id, []).append(player.run_rank(pod))
    for job_id in ids:
        wait_for(
            lambda j=job_id: len(log_text(service, j)) == service.store.get_job(j).spec.workers,
            timeout=60,
            message=f"every rank of {job_id} logging",
        )
    return runs


def test_many_jobs_share_one_supervisor_and_two_watches(k8s, player, kube, kube_namespace):
    service = k8s()
    jobs = [service.submit(spec_of(workers=2), code(GATED, x=i)).id for i in range(5)]
    runs = _running(service, player, jobs)

    holders = {tuple(sorted(service.store.get_job(j).supervisor.items())) for j in jobs}
    assert len(holders) == 1, f"one supervising process for all, not {len(holders)}"
    fleet = service.store.get_job(jobs[0]).supervisor
    assert fleet.get("fleet", "").startswith("kubernetes-")
    # Two list-watches for all five jobs (their objects' kind, their pods), not two a job.
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    batch = f"/apis/batch/v1/namespaces/{kube_namespace}/jobs"
    assert (_watches(kube, pods), _watches(kube, batch)) == (1, 1)

    # One job cancelled while the others run on: its objects go, theirs stay.
    started = time.monotonic()
    final = service.cancel(jobs[0])
    player.kill_deleted()
    assert final.state == "cancelled", final
    assert time.monotonic() - started < 10.0
    assert objects_of(kube, kube_namespace, jobs[0]) == {}
    assert all(service.store.get_job(j).state == "running" for j in jobs[1:])

    (player.workdir / "go").touch()
    for job_id in jobs[1:]:
        for run in runs[job_id]:
            player.end_rank(run)
    for i, job_id in enumerate(jobs[1:], start=1):
        record = service.wait(job_id, timeout=60)
        assert record.state == "succeeded", record.error
        assert service.result(job_id) == ("value", i)  # rank 0's value
        for rank in (0, 1):
            assert log_text(service, job_id, rank) == [f"{rank}:before", f"{rank}:after"]
        assert objects_of(kube, kube_namespace, job_id) == {}
    # Still the one fleet, and no second process ever supervised these jobs.
    assert process_gone(fleet["pid"]) is False
    assert _watches(kube, pods) == 1


def test_a_killed_fleet_is_replaced_and_every_job_keeps_its_logs(k8s, player, kube, kube_namespace):
    service = k8s()
    jobs = [service.submit(spec_of(workers=1), code(GATED, x=i)).id for i in range(3)]
    runs = _running(service, player, jobs)
    first = service.store.get_job(jobs[0]).supervisor
    dependents_made = _dependents_made(kube, kube_namespace)
    assert dependents_made["secrets"] >= 3 and dependents_made["services"] == 3
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: process_gone(first["pid"]), message="the fleet gone")
    service.reap(force=True)  # any reader notices: the jobs live on in the cluster

    def adopted() -> bool:
        holders = [service.store.get_job(j).supervisor or {} for j in jobs]
        return all(h.get("pid") not in (None, first["pid"]) for h in holders)

    wait_for(adopted, timeout=60, message="a new fleet holding every job")
    assert len({service.store.get_job(j).supervisor["pid"] for j in jobs}) == 1
    wait_for(
        lambda: all("following Job" in " ".join(system_lines(service, j)) for j in jobs),
        timeout=60,
        message="every job followed again",
    )
    # Each job was resumed: its dependents were made and checked before that, and the new
    # fleet makes none of them again (a thousand adoptions: a call each, not six).
    assert _dependents_made(kube, kube_namespace) == dependents_made
    (player.workdir / "go").touch()
    for job_runs in runs.values():
        for run in job_runs:
            player.end_rank(run)
    for i, job_id in enumerate(jobs):
        record = service.wait(job_id, timeout=60)
        assert record.state == "succeeded", record.error
        assert service.result(job_id) == ("value", i)
        # Read again from its start by the new fleet, the stored line skipped: none lost,
        # none twice.
        assert log_text(service, job_id) == ["0:before", "0:after"]
    creates = kube.on_emulator(
        lambda e: len(list(e["post", f"/apis/batch/v1/namespaces/{kube_namespace}/jobs"]))
    )
    assert creates == 3  # adopted, not made again


def _dependents_made(kube, namespace: str) -> dict[str, int]:
    """Creates asked of the API so far, of each kind of a job's dependents."""
    return {
        kind: kube.on_emulator(
            lambda e, k=kind: len(list(e["post", f"/api/v1/namespaces/{namespace}/{k}"]))
        )
        for kind in ("secrets", "services")
    }


def system_lines(service, job_id: str) -> list[str]:
    got, _ = service.logs(job_id)
    return [item["line"] for item in got if item["stream"] == "system"]


def _drain(events: queue.Queue) -> list[tuple]:
    out = []
    while True:
        try:
            out.append(events.get_nowait())
        except queue.Empty:
            return out


def test_a_job_the_shared_watch_has_not_seen_yet_is_not_taken_for_gone(kube, kube_namespace):
    """A job subscribes right after making its objects; the shared watch may not have seen
    them yet. What it knows then must not read as "your objects are gone" (a list without
    them); a list asked for later is the whole truth."""
    from jupyterlab_mlcluster.backends.kubernetes.client import kind_of
    from jupyterlab_mlcluster.backends.kubernetes.shared_watches import SharedCluster

    shared = SharedCluster()
    conn = shared.connection(kube_namespace, 10.0)
    # (Secrets: any kind of ours serves, and nothing reacts to these.)
    secrets = shared.source(conn, kube_namespace, kind_of("v1", "Secret"), "job")

    def secret(name: str, job: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": {"mlcluster.io/job-id": job}},
            "data": {},
        }

    kube.create(secret("seen", "j-seen"), kube_namespace)
    wait_for(lambda: "j-seen" in secrets.objects, message="the shared watch listing")
    late: queue.Queue = queue.Queue()
    secrets.subscribe("j-late", late)  # its object is not made yet, as if not seen yet
    assert _drain(late) == []  # the old code put ("job_list", []): taken as gone
    made = kube.create(secret("late", "j-late"), kube_namespace)
    wait_for(lambda: not late.empty(), message="the change")
    ((what, obj),) = _drain(late)
    assert (what, obj["metadata"]["uid"]) == ("job", made["metadata"]["uid"])
    # A second subscriber, now that it is known: the object, as a change.
    known: queue.Queue = queue.Queue()
    secrets.subscribe("j-late", known)
    assert [(w, o["metadata"]["name"]) for w, o in _drain(known)] == [("job", "late")]
    # A list asked for after both subscribed (a compaction: 410, then a relist) replaces.
    lists = secrets.watch.lists
    kube.compact()
    secrets.watch.interrupt()  # (its watch resumes from before the compaction: 410)
    wait_for(lambda: secrets.watch.lists > lists, message="the relist")
    wait_for(lambda: any(e[0] == "job_list" for e in list(late.queue)), message="the list")
    listed = [e for e in _drain(late) if e[0] == "job_list"]
    assert [[o["metadata"]["name"] for o in e[1]] for e in listed] == [["late"]]
    secrets.stopping.set()
    secrets.watch.interrupt()
