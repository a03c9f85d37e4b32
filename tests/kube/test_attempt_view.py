"""What a Kubernetes attempt's supervisor knows of its job object and pods is what the events
of its watches said (supervise_watches.ClusterView): plain tuples any source may put, so a
list-watch over many jobs could feed the same view later."""

from __future__ import annotations

from jupyterlab_mlcluster.backends.kubernetes.supervise_watches import ClusterView


def _obj(name: str, uid: str = "") -> dict:
    return {"metadata": {"name": name, "uid": uid}}


def test_the_view_holds_only_the_attempts_job_object_and_what_a_relist_says():
    view = ClusterView()
    view.uid = "u2"
    assert view.empty
    # A same-named object of an earlier attempt (another uid) is not this attempt's.
    assert view.take(("job", _obj("j", "u1")))
    assert view.job is None
    assert view.take(("job", _obj("j", "u2")))
    assert view.job == _obj("j", "u2")
    assert view.take(("job_deleted", _obj("j", "u1")))
    assert view.job == _obj("j", "u2")
    assert view.take(("pod", _obj("p0"))) and view.take(("pod", _obj("p1")))
    assert set(view.pods) == {"p0", "p1"}
    assert view.take(("pod_deleted", _obj("p0")))
    assert set(view.pods) == {"p1"}
    # A relist replaces what was known: what it leaves out is gone.
    assert view.take(("pod_list", [_obj("p2")]))
    assert set(view.pods) == {"p2"}
    assert view.take(("job_list", [_obj("j", "u1")]))
    assert view.job is None
    assert view.take(("pod_list", []))
    assert view.empty
    # Not a watch's event: left to the attempt (its logs, a watch's failure).
    assert not view.take(("log", "p2", b"x"))
    assert not view.take(("watch_error", "pod", OSError("down")))


def _pod(name: str, phase: str) -> dict:
    return {"metadata": {"name": name, "uid": ""}, "status": {"phase": phase}}


def test_a_pod_deleted_after_it_ended_is_still_judged_and_no_longer_counts_as_left():
    """Kubernetes lets an evicted pod go right after it reports Failed; when both changes
    come in one batch the attempt must still see that pod fail (its reason is the job's),
    while deleting the job's objects waits only for pods that still exist."""
    view = ClusterView()
    view.uid = "u"
    view.take(("job", _obj("j", "u")))
    for name in ("p0", "p1", "p2"):
        view.take(("pod", _pod(name, "Running")))
    # Deleted once it had failed (the DELETED event carries the pod's last state).
    view.take(("pod_deleted", _pod("p1", "Failed")))
    # Deleted while running: nothing to judge it on.
    view.take(("pod_deleted", _pod("p2", "Running")))
    assert set(view.pods) == {"p0"}
    assert [p["metadata"]["name"] for p in view.judged_pods()] == ["p1", "p0"]
    # A relist that no longer holds an ended pod keeps its end too.
    view.take(("pod", _pod("p0", "Succeeded")))
    view.take(("pod_list", []))
    assert {p["metadata"]["name"] for p in view.judged_pods()} == {"p0", "p1"}
    view.take(("job_list", []))
    assert view.empty  # nothing left in the API
    # A pod of the same name created again is the one judged, not its ended namesake.
    view.take(("pod", _pod("p1", "Running")))
    assert [p["status"]["phase"] for p in view.judged_pods()] == ["Succeeded", "Running"]
