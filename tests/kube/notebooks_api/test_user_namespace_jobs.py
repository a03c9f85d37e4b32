"""Kubernetes jobs submitted through the REST API, each in the caller's own namespace, played
as attacks: the server extension (in-process Jupyter server) against the Kubernetes API
emulator, identity from the `kubeflow-userid` header, users mapped to namespaces by
`user_namespace_template` (as their notebooks are).

User B (bob) tries to see, follow, cancel and purge user A's (alice's) job, and to make a job
of his land in her namespace by naming it; the jobs' objects (job object, payload Secrets,
Service, pods) of each user stay in that user's namespace, never in the configured shared one,
and the supervisor, cancel and the reaper's cleanup act there.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_no_job_processes, wait_for

from jupyterlab_mlcluster.server.user_namespace import template_namespace
from tests.kube.controller_support import install_crds
from tests.kube.helpers import Kube
from tests.kube.jobs_fixtures import SLEEPY_CELL
from tests.kube.notebooks_api.conftest import per_user_server_config
from tests.kube.notebooks_api.test_notebooks_api import User
from tests.kube.notebooks_api.test_user_namespaces import call_with_query
from tests.kube.player import ClusterPlayer, objects_of

ALICE, BOB = "alice", "bob"

CELL = """
import os
print("hello from rank", os.environ["RANK"], flush=True)
{"rank": int(os.environ["RANK"])}
"""


@pytest.fixture
def template(kube_namespace: str) -> str:
    """This test's own namespaces: `<kube_namespace>-<user>` (the emulator is shared)."""
    return f"{kube_namespace}-{{user}}"


@pytest.fixture
def jp_server_config(store_dir, monkeypatch, template, kube_namespace):
    return per_user_server_config(monkeypatch, template, shared_namespace=kube_namespace)


@pytest.fixture
def user_namespaces(kube: Kube, template: str) -> Iterator[dict[str, str]]:
    """alice's and bob's namespaces (as `mlcluster manifests --user-namespace` makes them)."""
    made = {user: template_namespace(user, template) for user in (ALICE, BOB)}
    for name in made.values():
        kube.create_namespace(name)
    yield made
    for name in made.values():
        kube.delete("v1", "Namespace", name)


@pytest.fixture
def players(kube: Kube, user_namespaces: dict[str, str], tmp_path: Path):
    """The cluster's side in each user's namespace; its containers are stopped after."""
    made = {
        user: ClusterPlayer(kube, namespace, tmp_path / f"node-{user}")
        for user, namespace in user_namespaces.items()
    }
    yield made
    for player in made.values():
        player.stop_all()


@pytest.fixture
def server(mlc):
    """The running server extension; afterwards none of its jobs may be left running."""
    yield mlc
    for record in mlc.service.store.list_jobs()[0]:
        if not record.final:
            mlc.service.cancel(record.id)
    assert_no_job_processes(mlc.service)


def test_attack_rest_jobs_land_in_the_callers_namespace_and_stay_out_of_reach(
    kube: Kube,
    kube_namespace: str,
    user_namespaces: dict[str, str],
    players: dict[str, ClusterPlayer],
    server,
    jp_fetch,
    jp_ws_fetch,
    run,
    monkeypatch,
) -> None:
    # The reaper's cleanup retries on the one backoff policy (up to 60 s apart) while a
    # deleted job's pods are still going: its scale shortened (shape unchanged), so the
    # wait below measures where it deletes, not how long a loaded machine backs off.
    monkeypatch.setenv("MLCLUSTER_KUBE_BACKOFF", "0.2,2")
    install_crds(kube)  # the server watches Notebooks in every namespace
    alice_ns, bob_ns = user_namespaces[ALICE], user_namespaces[BOB]
    alice, bob = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, BOB)
    store = server.service.store

    def submit(user: User, source: str, **options: Any) -> str:
        status, made, _ = run(
            user.call("POST", "jobs", body={"code": source, "backend": "kubernetes", **options})
        )
        assert status == 201, made
        return made["id"]

    a_id = submit(alice, CELL, name="alices-job")
    b_id = submit(bob, SLEEPY_CELL, name="bobs-job")

    # Each job's namespace is recorded with it (its plan) and its objects are made there.
    assert store.get_job(a_id).backend_state["namespace"] == alice_ns
    assert store.get_job(b_id).backend_state["namespace"] == bob_ns
    a_obj = players[ALICE].resumed(a_id)
    b_obj = players[BOB].resumed(b_id)
    assert a_obj["metadata"]["namespace"] == alice_ns
    assert b_obj["metadata"]["namespace"] == bob_ns
    assert set(objects_of(kube, alice_ns, a_id)) >= {"Job", "Secret", "Service"}
    for job_id in (a_id, b_id):
        assert objects_of(kube, kube_namespace, job_id) == {}, "the shared namespace"
    assert objects_of(kube, bob_ns, a_id) == {} and objects_of(kube, alice_ns, b_id) == {}

    # Bob, by id and by name: alice's job is as missing as one that never existed.
    for ref in (a_id, "alices-job"):
        for method, path in [
            ("GET", ("jobs", ref)),
            ("GET", ("jobs", ref, "logs")),
            ("GET", ("jobs", ref, "result")),
            ("GET", ("jobs", ref, "metrics")),
            ("DELETE", ("jobs", ref)),
        ]:
            status, error, _ = run(bob.call(method, *path))
            assert status == 404, (method, path, status, error)
        assert run(call_with_query(bob, "DELETE", "jobs", ref, params={"purge": "true"})) == 404
    status, listed, _ = run(bob.call("GET", "jobs"))
    assert [j["id"] for j in listed["jobs"]] == [b_id]
    assert not store.get_job(a_id).final and not store.cancel_requested(a_id)
    assert (
        kube.get("batch/v1", "Job", a_obj["metadata"]["name"], alice_ns)["metadata"]["uid"]
        == a_obj["metadata"]["uid"]
    )

    # Bob, naming alice's namespace: the body's field is refused (the API takes no namespace),
    # nothing stored; a query parameter is ignored: his job lands in his own namespace.
    jobs_before = store.list_jobs()[1]
    status, error, _ = run(
        bob.call(
            "POST",
            "jobs",
            body={"code": "pass", "backend": "kubernetes", "namespace": alice_ns},
        )
    )
    assert status == 400 and "namespace" in error["message"], error
    assert store.list_jobs()[1] == jobs_before
    status = run(
        call_with_query(
            bob,
            "POST",
            "jobs",
            params={"namespace": alice_ns},
            body={"code": SLEEPY_CELL, "backend": "kubernetes", "name": "bobs-second"},
        )
    )
    assert status == 201
    (b2,) = [j for j in store.list_jobs()[0] if j.name == "bobs-second"]
    assert b2.backend_state["namespace"] == bob_ns and b2.owner == BOB
    b2_obj = players[BOB].resumed(b2.id)
    assert b2_obj["metadata"]["namespace"] == bob_ns
    assert objects_of(kube, alice_ns, b2.id) == {}

    # Alice's job runs to its end in her namespace: her result and logs, then nothing left.
    players[ALICE].play(a_id)
    wait_for(lambda: store.get_job(a_id).final, timeout=60, message="alice's job finished")
    status, record, _ = run(alice.call("GET", "jobs", a_id))
    assert (status, record["state"]) == (200, "succeeded"), record
    status, result, _ = run(alice.call("GET", "jobs", a_id, "result"))
    assert (status, result) == (200, {"kind": "value", "value": {"rank": 0}}), result
    status, logs, _ = run(alice.call("GET", "jobs", a_id, "logs"))
    assert "hello from rank 0" in json.dumps(logs)
    wait_for(lambda: objects_of(kube, alice_ns, a_id) == {}, message="alice's objects gone")

    # Bob cancels his own: the supervisor deletes the objects in his namespace.
    status, cancelled, _ = run(bob.call("DELETE", "jobs", b_id))
    assert (status, cancelled["state"]) == (200, "cancelled"), cancelled
    wait_for(lambda: objects_of(kube, bob_ns, b_id) == {}, message="bob's objects gone")
    # And with its supervisor dead, the reaper's cleanup finds them there too.
    os.kill(store.get_job(b2.id).supervisor["pid"], signal.SIGKILL)
    status, cancelled, _ = run(bob.call("DELETE", "jobs", b2.id))
    assert (status, cancelled["state"]) == (200, "cancelled"), cancelled
    wait_for(lambda: objects_of(kube, bob_ns, b2.id) == {}, message="the reaper's cleanup")
    assert kube.find("batch/v1", "Job", b2_obj["metadata"]["name"], bob_ns) is None


def test_a_backend_view_places_jobs_without_changing_the_shared_backend(
    kube: Kube, kube_namespace: str, server
) -> None:
    """No namespace passed (a server that does not map users to namespaces, the CLI, a
    kernel): the plan's namespace is the configured one, as before. A view placing jobs in
    another namespace leaves the backend that other submissions share as it was."""
    from jupyterlab_mlcluster.jobs.model import JobSpec

    spec = JobSpec.from_options({"backend": "kubernetes"})
    backend = server.service.backend("kubernetes")
    assert backend.prepare(spec)["namespace"] == kube_namespace
    assert backend.in_namespace("elsewhere").prepare(spec)["namespace"] == "elsewhere"
    assert backend.prepare(spec)["namespace"] == kube_namespace
    with pytest.raises(Exception, match="does not place jobs in namespaces"):
        server.service.backend("local").in_namespace("elsewhere")


def test_a_job_for_a_user_without_a_namespace_fails_saying_so(
    kube: Kube, kube_namespace: str, template: str, server, jp_fetch, jp_ws_fetch, run
) -> None:
    """carol has no namespace yet: her job is not run anywhere else (not in the shared one);
    it fails with the API server's answer naming her namespace, and nothing is left."""
    install_crds(kube)
    carol = User(jp_fetch, jp_ws_fetch, "carol")
    missing = template_namespace("carol", template)
    status, made, _ = run(
        carol.call("POST", "jobs", body={"code": "pass", "backend": "kubernetes"})
    )
    assert status == 201, made
    store = server.service.store
    wait_for(lambda: store.get_job(made["id"]).final, timeout=60, message="carol's job final")
    final = store.get_job(made["id"])
    assert final.state == "failed" and missing in (final.error or ""), final.error
    assert objects_of(kube, kube_namespace, made["id"]) == {}


def test_a_namespace_the_server_cannot_tell_refuses_the_job_and_stores_nothing(
    kube: Kube, user_namespaces, server, jp_fetch, jp_ws_fetch, run
) -> None:
    """Profiles are served but the server may not read them (403): it never guesses where
    alice's job goes (the shared namespace, the template): 502, nothing stored or made."""
    from tests.kube.notebooks_api.test_user_namespaces import profile_crd

    install_crds(kube)
    kube.install_crd(profile_crd())
    kube.on_emulator(lambda e: e["get", "/apis/kubeflow.org/v1/profiles"] << 403)
    server.namespace_of.ttl = 0  # read again now
    try:
        alice = User(jp_fetch, jp_ws_fetch, ALICE)
        status, error, _ = run(
            alice.call("POST", "jobs", body={"code": "pass", "backend": "kubernetes"})
        )
        assert status == 502 and "403" in error["message"], error
        assert server.service.store.list_jobs()[1] == 0
    finally:
        kube.on_emulator(lambda e: e.remove_reactions())
        kube.uninstall_crd(profile_crd()["metadata"]["name"])
