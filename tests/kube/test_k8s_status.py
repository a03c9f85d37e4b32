"""The pure parts of the Kubernetes backend: what pods and job objects mean (status.py), how a
pod log splits into ranks' lines and reports (logs.PodOutput), and the plan (plan.py)."""

from __future__ import annotations

from typing import Any

import pytest

from jupyterlab_mlcluster.backends.kubernetes.logs import PodOutput
from jupyterlab_mlcluster.backends.kubernetes.plan import make_plan
from jupyterlab_mlcluster.backends.kubernetes.status import observe, pod_usage
from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState, SpecError
from jupyterlab_mlcluster.runtime.protocol import encode_record

KEY = bytes(range(32))  # the job's record key (runtime/protocol.py)

UID = "uid-current"


def job(
    kind: str = "Job",
    *,
    suspend: bool = False,
    conditions: list[dict[str, Any]] | None = None,
    uid: str = UID,
) -> dict[str, Any]:
    spec: dict[str, Any] = (
        {"suspend": suspend} if kind == "Job" else {"runPolicy": {"suspend": suspend}}
    )
    return {
        "kind": kind,
        "metadata": {"name": "train", "uid": uid},
        "spec": spec,
        "status": {"conditions": conditions or []},
    }


def pod(
    name: str,
    *,
    index: int | None = None,
    replica: tuple[str, int] | None = None,
    phase: str = "Pending",
    scheduled: bool | None = True,
    container: dict[str, Any] | None = None,
    owner: str = UID,
    reason: str | None = None,
    container_name: str = "worker",
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if index is not None:
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    if replica is not None:
        labels["training.kubeflow.org/replica-type"] = replica[0]
        labels["training.kubeflow.org/replica-index"] = str(replica[1])
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if scheduled is not None:
        status["conditions"].append(
            {
                "type": "PodScheduled",
                "status": str(scheduled),
                **(
                    {}
                    if scheduled
                    else {"reason": "Unschedulable", "message": "0/2 nodes are available"}
                ),
            }
        )
    if container is not None:
        status["containerStatuses"] = [{"name": container_name, "state": container}]
    if reason:
        status["reason"] = reason
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"uid": owner, "controller": True}],
        },
        "status": status,
    }


RUNNING = {"running": {"startedAt": "2026-01-01T00:00:05Z"}}


def terminated(code: int, reason: str = "Error") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": "2026-01-01T00:00:05Z",
            "finishedAt": "2026-01-01T00:01:00Z",
        }
    }


def test_no_pods_yet_is_queued_waiting_for_the_controller():
    obs = observe(job(), [], engine="indexed-job", workers=2)
    assert (obs.state, obs.reason) == (
        JobState.QUEUED,
        "waiting for the Job controller to create the pods",
    )
    obs = observe(job("PyTorchJob"), [], engine="pytorchjob", workers=2)
    assert obs.reason == "waiting for the Training Operator to create the pods"


def test_a_suspended_job_waits_for_kueue():
    obs = observe(
        job(suspend=True), [], engine="indexed-job", workers=1, gang="kueue", queue="team-a"
    )
    assert (obs.state, obs.suspended, obs.reason) == (
        JobState.QUEUED,
        True,
        "waiting for Kueue to admit the job (queue team-a)",
    )


def test_gang_states_from_pods_and_earlier_attempts_are_ignored():
    old = pod("train-0-old", index=0, phase="Failed", container=terminated(1), owner="uid-earlier")
    pods = [
        old,
        pod("train-0-a", index=0, phase="Running", container=RUNNING),
        pod("train-1-a", index=1, container={"waiting": {"reason": "ContainerCreating"}}),
    ]
    obs = observe(job(), pods, engine="indexed-job", workers=2)
    assert obs.failure is None  # the earlier attempt's failed pod is not this attempt's
    assert obs.state == JobState.STARTING and obs.reason is None
    assert [obs.ranks[r].state for r in (0, 1)] == [RankState.RUNNING, RankState.STARTING]
    assert obs.ranks[0].pod == "train-0-a" and obs.ranks[0].started is not None
    pods[2] = pod("train-1-a", index=1, phase="Running", container=RUNNING)
    assert observe(job(), pods, engine="indexed-job", workers=2).state == JobState.RUNNING


def test_one_unscheduled_pod_keeps_the_gang_queued():
    pods = [
        pod("a", index=0, phase="Running", container=RUNNING),
        pod("b", index=1, scheduled=False),
    ]
    obs = observe(job(), pods, engine="indexed-job", workers=2)
    assert obs.state == JobState.QUEUED
    assert (
        obs.reason
        == "waiting for resources: rank 1 of 2 cannot be scheduled yet (0/2 nodes are available)"
    )


@pytest.mark.parametrize(
    "container, reason, message",
    [
        (terminated(1), None, "rank 1 exited with status 1"),
        (
            terminated(137, "OOMKilled"),
            None,
            "rank 1 was killed: out of memory (OOMKilled; ask for more with --memory)",
        ),
        (terminated(137), None, "rank 1 was killed by SIGKILL"),
        (None, "Evicted", "rank 1's pod was evicted: node pressure"),
    ],
)
def test_a_failed_pod_fails_the_job_in_readable_words(container, reason, message):
    pods = [
        pod("a", index=0, phase="Running", container=RUNNING),
        pod("b", index=1, phase="Failed", container=container, reason=reason),
    ]
    obs = observe(job(), pods, engine="indexed-job", workers=2)
    assert obs.failure is not None
    assert (obs.failure.rank, obs.failure.message, obs.failure.pod) == (1, message, "b")


@pytest.mark.parametrize(
    "why, message",
    [
        (
            "EvictionByEvictionAPI",
            "rank 1's pod was evicted (Eviction API): Eviction API: evicting",
        ),
        (
            "PreemptionByScheduler",
            "rank 1's pod was preempted by the scheduler: Eviction API: evicting",
        ),
    ],
)
def test_a_pod_kubernetes_took_away_is_no_ranks_failure(why, message):
    """Its DisruptionTarget says why (an eviction, a preemption): that is the attempt's
    reason, not the rank's exit on the kubelet's SIGTERM (the backend blames no rank)."""
    taken = pod("b", index=1, phase="Failed", container=terminated(143))
    taken["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": why,
            "message": "Eviction API: evicting",
        }
    ]
    pods = [pod("a", index=0, phase="Running", container=RUNNING), taken]
    obs = observe(job(), pods, engine="indexed-job", workers=2)
    assert obs.failure is not None and obs.failure.disrupted
    assert (obs.failure.rank, obs.failure.message) == (1, message)


def test_a_pod_taken_away_is_the_cause_when_its_peer_stopped_in_the_same_second():
    """Kubernetes keeps times to the second: the peer that stopped on the same SIGTERM
    (the save flag is all-reduced) ends in the second the evicted pod did, and on rank
    order alone it would be blamed (this raced in the eviction end-to-end test)."""
    taken = pod("b", index=1, phase="Failed", container=terminated(143))
    taken["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    peer = pod("a", index=0, phase="Failed", container=terminated(143))
    obs = observe(job(), [peer, taken], engine="indexed-job", workers=2)
    assert obs.failure is not None and obs.failure.disrupted
    assert obs.failure.message == "rank 1's pod was evicted (Eviction API)"


def test_job_conditions_decide_too():
    deadline = job(conditions=[{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])
    obs = observe(deadline, [], engine="indexed-job", workers=1)
    assert obs.failure is not None and obs.failure.deadline
    done = job(
        "TFJob",
        conditions=[
            {"type": "Running", "status": "False"},
            {"type": "Succeeded", "status": "True"},
        ],
    )
    assert observe(done, [], engine="tfjob", workers=2).succeeded
    failed = job(
        "PyTorchJob",
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "PyTorchJobFailed",
                "message": "Master replica failed",
            }
        ],
    )
    obs = observe(failed, [], engine="pytorchjob", workers=2)
    assert (
        obs.failure.message
        == "Kubernetes marked the job failed: PyTorchJobFailed: Master replica failed"
    )


def test_all_ranks_succeeded_is_success_without_waiting_for_the_controller():
    pods = [
        pod(f"p{r}", index=r, phase="Succeeded", container=terminated(0, "Completed"))
        for r in range(2)
    ]
    obs = observe(job(), pods, engine="indexed-job", workers=2)
    assert obs.succeeded and [obs.ranks[r].exit_code for r in (0, 1)] == [0, 0]


def test_a_packed_pod_carries_several_ranks():
    pods = [
        pod(
            f"train-{role}-0",
            replica=(role, 0),
            phase="Running",
            container=RUNNING,
            container_name="pytorch",
        )
        for role in ("master", "worker")
    ]
    obs = observe(job("PyTorchJob"), pods, engine="pytorchjob", workers=4, ranks_per_pod=2)
    assert {r: pr.pod for r, pr in obs.ranks.items()} == {
        0: "train-master-0",
        1: "train-master-0",
        2: "train-worker-0",
        3: "train-worker-0",
    }
    assert obs.state == JobState.RUNNING


def test_pod_usage_from_the_metrics_api():
    metrics = {
        "containers": [
            {"name": "istio-proxy", "usage": {"cpu": "5m", "memory": "20Mi"}},
            {"name": "worker", "usage": {"cpu": "1500000000n", "memory": "1Gi"}},
        ]
    }
    assert pod_usage(metrics, "worker") == {"cpu_percent": 150.0, "memory_bytes": 2**30}


# -- pod logs -----------------------------------------------------------------------------------------


def feed(output: PodOutput, *chunks: bytes) -> list[tuple[int, str, Any]]:
    items = [item for chunk in chunks for item in output.feed(chunk)]
    return items + list(output.finish())


def test_a_pod_log_splits_into_lines_and_reports():
    log = (
        b"\n"
        + encode_record({"type": "started", "pid": 1}, KEY, 3)
        + b"hello\n\nworld\n"
        + b"\n"
        + encode_record({"type": "progress", "step": 1, "total": 2, "desc": None}, KEY, 3)
        + b"no newline"
    )
    items = feed(PodOutput([3], key=KEY), log[:7], log[7:30], log[30:])
    assert items == [
        (3, "control", {"type": "started", "pid": 1}),
        (3, "line", "hello"),
        (3, "line", ""),  # the user's own blank line stays
        (3, "line", "world"),
        (3, "control", {"type": "progress", "step": 1, "total": 2, "desc": None}),
        (3, "line", "no newline"),
    ]


def test_attack_a_pod_printing_without_newlines_is_cut_not_buffered():
    """A pod's endless line is cut every MAX_POD_LINE bytes as it comes (the supervisor's
    memory stays bounded), at the same places however the stream is chunked."""
    from jupyterlab_mlcluster.backends.kubernetes.logs import MAX_POD_LINE

    line = b"x" * (2 * MAX_POD_LINE + 5)
    output = PodOutput([0], key=KEY)
    sizes = []
    for start in range(0, len(line), 300_000):
        sizes += [len(v) for _, _, v in output.feed(line[start : start + 300_000])]
        assert len(output._buffer) <= MAX_POD_LINE
    sizes += [len(v) for _, _, v in output.feed(b"\nend\n")]
    assert sizes == [MAX_POD_LINE, MAX_POD_LINE, 5, 3]
    at_once = [len(v) for _, _, v in feed(PodOutput([0], key=KEY), line + b"\nend\n")]
    assert at_once == sizes


def test_a_report_too_long_for_a_pod_line_is_dropped_whole_and_said_once():
    """A signed record over MAX_POD_LINE is cut (its MAC then fails): none of it is shown as
    text, one 'unread' item says so (the supervisor's once-said line), with its blank line
    before it; the lines around it and a resumed stream's counting are as without it."""
    from jupyterlab_mlcluster.backends.kubernetes.logs import MAX_POD_LINE

    record = encode_record({"type": "error", "message": "x" * MAX_POD_LINE}, KEY, 0)
    log = b"a\n\n" + record + b"b\n" + encode_record({"type": "started", "pid": 1}, KEY, 0)
    expected = [
        (0, "line", "a"),
        (0, "unread", None),
        (0, "line", "b"),
        (0, "control", {"type": "started", "pid": 1}),
    ]
    assert feed(PodOutput([0], key=KEY), log) == expected
    output = PodOutput([0], key=KEY)  # the same, arriving in pieces (cut while it comes)
    assert feed(output, *[log[i : i + 300_000] for i in range(0, len(log), 300_000)]) == expected
    assert output.seen() == {0: 2}
    resumed = PodOutput([0], skip={0: 2}, key=KEY)  # said by the stream before
    assert feed(resumed, log) == expected[3:]
    assert resumed.seen() == {0: 2}
    # In a packed pod: the rank whose line it is; its tail goes with it.
    packed = b"[1]:\n[1]:" + record + b"[0]:zero\n"
    assert feed(PodOutput([0, 1], key=KEY), packed) == [(1, "unread", None), (0, "line", "zero")]


def test_a_packed_pod_log_goes_to_each_rank():
    log = b"[1]:one\n[0]:zero\nINFO torchrun says hi\n[1]:" + encode_record(
        {"type": "error", "rank": 1}, KEY, 1
    )
    assert feed(PodOutput([0, 1], key=KEY), log) == [
        (1, "line", "one"),
        (0, "line", "zero"),
        (0, "line", "INFO torchrun says hi"),
        (1, "control", {"type": "error", "rank": 1}),
    ]


def test_a_resumed_log_skips_stored_lines_but_not_reports():
    log = (
        b"a\n"
        + encode_record({"type": "metrics", "cpu_percent": 1.0}, KEY, 0)
        + b"b\n"
        + encode_record({"type": "result", "index": 0, "count": 1, "data": "eA=="}, KEY, 0)
        + b"c\n"
    )
    first = PodOutput([0], key=KEY)
    list(first.feed(log[:2]))
    assert first.seen() == {0: 1}
    resumed = PodOutput([0], skip={0: 2}, key=KEY)
    assert feed(resumed, log) == [
        (0, "control", {"type": "result", "index": 0, "count": 1, "data": "eA=="}),  # never skipped
        (0, "line", "c"),
    ]
    assert resumed.seen() == {0: 3}


# -- the plan -----------------------------------------------------------------------------------------


def plan(spec: dict[str, Any], **kwargs: Any):
    options = {
        "namespace": "ns",
        "served_kinds": set(),
        "notebook_image": None,
        "default_image": "img",
        **kwargs,
    }
    return make_plan(JobSpec.from_options({"backend": "kubernetes", **spec}), **options)


def test_plans():
    assert plan({}).engine == "indexed-job"
    assert plan({}, served_kinds={"PyTorchJob", "TFJob"}).engine == "pytorchjob"
    assert plan({"framework": "tensorflow"}, served_kinds={"PyTorchJob", "TFJob"}).engine == "tfjob"
    assert plan({}, default_image="", notebook_image="nb:1").image == "nb:1"
    assert plan({"image": "mine:2"}, notebook_image="nb:1").image == "mine:2"
    assert plan({"queue": "q"}, gang="volcano", served_kinds={"PodGroup"}).queue == "q"
    assert plan({}, default_queue="q").queue is None  # no gang scheduler: no queue
    assert plan({"priority": -1}, priority_classes={"-1": "low"}).priority_class == "low"
    packed = plan(
        {"workers": 8, "gpus_per_worker": 1}, served_kinds={"PyTorchJob"}, gpus_per_node=4
    )
    assert packed.ranks_per_pod == 4
    with pytest.raises(SpecError, match="no container image"):
        plan({}, default_image="")
    with pytest.raises(SpecError, match="does not serve PodGroup"):
        plan({}, gang="volcano")
    with pytest.raises(SpecError, match="through the Training Operator needs its CRDs"):
        plan({}, gang="training-operator")
    # An option nothing would honour is refused, not dropped (no gang scheduler reads it).
    with pytest.raises(SpecError, match="--queue q: no gang scheduler is configured"):
        plan({"queue": "q"})


# --- Kueue standing (backends/kubernetes/kueue.py) ------------------------------------------


def test_kueue_standing_text_and_backoff_when_kueue_answers_nothing():
    import random

    from jupyterlab_mlcluster.backends.kubernetes.kueue import (
        KueueView,
        standing_from,
        standing_text,
    )

    workload = {
        "metadata": {"name": "w1"},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "False", "message": "no quota"}]
        },
    }
    pending = [
        {"metadata": {"name": "other"}, "positionInLocalQueue": 0},
        {"metadata": {"name": "w1"}, "positionInLocalQueue": 1},
    ]
    standing = standing_from("lq", "cq", workload, pending, "uid-1")
    assert standing_text(standing, preempted=False) == (
        "Kueue position 2 in LocalQueue lq (ClusterQueue cq); no quota"
    )
    # Found by owner uid when the Workload cannot be read; a bogus position is ignored.
    by_owner = [{"metadata": {"ownerReferences": [{"uid": "uid-1"}]}, "positionInLocalQueue": -3}]
    assert standing_text(standing_from("lq", None, None, by_owner, "uid-1"), preempted=True) == (
        "preempted by Kueue (suspended again), waiting in LocalQueue lq"
    )

    class Refusing:
        calls = 0

        def request(self, method, path, query=None):
            Refusing.calls += 1
            raise RuntimeError("404 page not found")

    view = KueueView(Refusing(), "ns", "lq", rng=random.Random(7))
    assert view.look("uid-1", now=0.0) is None  # Kueue said nothing: the old reason stays
    assert Refusing.calls == 3
    delays = []
    now = 0.0
    for _ in range(8):
        now = view.next_look
        delays.append(view.next_look)
        assert view.look("uid-1", now=now - 0.01) is None  # not yet: nothing asked
        view.look("uid-1", now=now)
    assert Refusing.calls == 3 + 8 * 3
    gaps = [b - a for a, b in zip(delays, delays[1:], strict=False)]
    assert all(2.0 <= g <= 60.0 for g in gaps) and max(gaps) > 10  # backs off, capped
