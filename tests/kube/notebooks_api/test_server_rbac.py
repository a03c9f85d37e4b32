"""The shared Jupyter server's RBAC (`mlcluster manifests`, notebook_controller/server_rbac.py)
grants what the server really does, in the namespace it does it, and nothing like `*`.

A real server (per-user namespaces, identity from the header) on a pristine Kubernetes API
emulator of its own (no other test's clients in its request log) goes through what users do:
notebooks spawned, read, stopped, started, deleted; Kubernetes jobs submitted over REST, run,
cancelled, cleaned up by the reaper after their supervisor died; the cluster's capacity read.
Every request it and its jobs' supervisors made is then checked against the printed rules:
cluster-wide requests against the cluster-wide ClusterRole, requests in a user namespace
against it or the user-namespace ClusterRole bound there; nothing may touch any other
namespace. Requests the server makes knowing they may be refused (and copes) are listed in
notebook_controller/server_rbac.py, not granted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from helpers import assert_no_job_processes, wait_for

from jupyterlab_mlcluster.server.user_namespace import template_namespace
from notebook_controller import server_rbac as rbac
from notebook_controller.manifests import all_manifests
from tests.kube.controller_support import install_crds
from tests.kube.fixtures import KubeCluster
from tests.kube.jobs_fixtures import SLEEPY_CELL
from tests.kube.notebooks_api.conftest import per_user_server_config
from tests.kube.notebooks_api.test_notebooks_api import User
from tests.kube.notebooks_api.test_user_namespaces import profile_crd
from tests.kube.player import ClusterPlayer, objects_of
from tests.kube.protocol import parse_api_path

ALICE, BOB = "alice", "bob"
TEMPLATE = "team-{user}"
CELL = 'print("hi", flush=True)\n42\n'


@pytest.fixture
def cluster(fresh_kube, monkeypatch) -> KubeCluster:
    """An emulator of this test's own, the one the server (and its supervisors) talk to."""
    made = fresh_kube()
    monkeypatch.setenv("KUBECONFIG", str(made.kubeconfig))
    return made


@pytest.fixture
def jp_server_config(cluster, store_dir, monkeypatch):
    return per_user_server_config(monkeypatch, TEMPLATE, shared_namespace="shared")


@pytest.fixture
def players(cluster: KubeCluster, tmp_path: Path) -> Iterator[dict[str, ClusterPlayer]]:
    made = {}
    for user in (ALICE, BOB):
        namespace = template_namespace(user, TEMPLATE)
        cluster.kube.create_namespace(namespace)
        made[user] = ClusterPlayer(cluster.kube, namespace, tmp_path / f"node-{user}")
    cluster.kube.create_namespace("shared")
    yield made
    for player in made.values():
        player.stop_all()


def _allowed(rules: list[dict[str, Any]], verb: str, group: str, resource: str) -> bool:
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
        for rule in rules
    )


def _verb(method: str, name: str | None, params: dict[str, str]) -> str:
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


def test_the_servers_rbac_grants_exactly_what_it_does(
    cluster: KubeCluster, players, mlc, jp_fetch, jp_ws_fetch, run
) -> None:
    kube = cluster.kube
    install_crds(kube)
    kube.install_crd(profile_crd())
    namespaces = {user: player.namespace for user, player in players.items()}
    alice, bob = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, BOB)
    store = mlc.service.store

    # Notebooks: the whole life of one, and the watch behind /events.
    run(alice.connect())
    for method, path, body, expected in [
        ("POST", ("notebooks",), {"name": "nb1"}, 201),
        ("GET", ("notebooks",), None, 200),
        ("GET", ("notebooks", "nb1"), None, 200),
        ("POST", ("notebooks", "nb1", "stop"), None, 200),
        ("POST", ("notebooks", "nb1", "start"), None, 200),
        ("DELETE", ("notebooks", "nb1"), None, 204),
        ("GET", ("cluster",), None, 200),
    ]:
        status, reply, _ = run(alice.call(method, *path, body=body))
        assert status == expected, (method, path, reply)

    # Jobs: one run to its end, one cancelled, one cleaned up by the reaper.
    def submit(user: User, source: str) -> str:
        status, made, _ = run(
            user.call("POST", "jobs", body={"code": source, "backend": "kubernetes"})
        )
        assert status == 201, made
        return made["id"]

    a_id = submit(alice, CELL)
    b_id, b2_id = submit(bob, SLEEPY_CELL), submit(bob, SLEEPY_CELL)
    players[ALICE].play(a_id)
    wait_for(lambda: store.get_job(a_id).final, timeout=60, message="alice's job finished")
    assert store.get_job(a_id).state == "succeeded", store.get_job(a_id).error
    players[BOB].resumed(b_id)
    players[BOB].resumed(b2_id)
    assert run(bob.call("DELETE", "jobs", b_id))[0] == 200
    os.kill(store.get_job(b2_id).supervisor["pid"], signal.SIGKILL)
    assert run(bob.call("DELETE", "jobs", b2_id))[0] == 200
    for user, job_id in ((ALICE, a_id), (BOB, b_id), (BOB, b2_id)):
        wait_for(
            lambda: objects_of(kube, namespaces[user], job_id) == {},  # noqa: B023
            message=f"{job_id}'s objects gone",
        )
    assert_no_job_processes(mlc.service)

    seen = kube.on_emulator(
        lambda e: [
            (str(getattr(r.method, "value", r.method)).upper(), r.url.path, dict(r.params))
            for r in e._requests
            # All of them (this emulator is the server's alone), but the test's own.
            if not r.headers.get("User-Agent", "").startswith("python-requests")
        ]
    )
    used: set[tuple[str, str, str]] = set()
    refused_ok = {(c["verb"], c["group"], c["resource"]) for c in rbac.MAY_BE_REFUSED}
    for method, path, params in seen:
        api = parse_api_path(path)
        if api is None:
            continue  # discovery: open to every authenticated client
        verb = _verb(method, api.name, params)
        resource = api.plural + (f"/{api.subresource}" if api.subresource else "")
        used.add((verb, api.group, resource))
        granted = _allowed(rbac.CLUSTER_RULES, verb, api.group, resource)
        if api.namespace in namespaces.values():
            granted = granted or _allowed(rbac.USER_NAMESPACE_RULES, verb, api.group, resource)
        else:
            assert api.namespace is None, f"{method} {path}: outside the users' namespaces"
        if api.namespace is None and (verb, api.group, resource) in refused_ok:
            continue
        assert granted, f"{method} {path} ({verb} {api.group or 'core'}/{resource}) not granted"
    # The scenario did reach every kind of call the rules are there for.
    for call in [
        ("list", "kubeflow.org", "profiles"),
        ("list", "mlcluster.io", "notebooks"),
        ("watch", "mlcluster.io", "notebooks"),
        ("watch", "", "events"),
        ("get", "mlcluster.io", "notebooks"),
        ("create", "mlcluster.io", "notebooks"),
        ("patch", "mlcluster.io", "notebooks"),
        ("delete", "mlcluster.io", "notebooks"),
        ("list", "", "nodes"),
        ("create", "batch", "jobs"),
        ("delete", "batch", "jobs"),
        ("create", "", "secrets"),
        ("get", "", "pods/log"),
    ]:
        assert call in used, (call, sorted(used))
    kube.uninstall_crd(profile_crd()["metadata"]["name"])


def test_the_servers_rbac_is_printed_valid_and_without_wildcards(capsys) -> None:
    import yaml

    from notebook_controller.cli import print_manifests

    argv = ["--no-gateway", "--user-namespace=team-a", "--user-namespace=team-b"]
    assert print_manifests([*argv, "--server-namespace=jupyter"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == all_manifests(
        include_gateway=False, user_namespaces=["team-a", "team-b"], server_namespace="jupyter"
    )
    server = [
        m
        for m in printed
        if m["metadata"].get("labels", {}).get("app.kubernetes.io/name") == rbac.SERVICE_ACCOUNT
        # its RBAC; the server's own Deployment and policies: test_attacks_cluster.py
        and (m["kind"] == "ServiceAccount" or m["apiVersion"].startswith("rbac."))
    ]
    assert [(m["kind"], m["metadata"].get("namespace")) for m in server] == [
        ("ServiceAccount", "jupyter"),
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("ClusterRole", None),
        ("Role", "jupyter"),
        ("RoleBinding", "jupyter"),
        ("RoleBinding", "team-a"),
        ("RoleBinding", "team-b"),
    ]
    subject = {"kind": "ServiceAccount", "name": rbac.SERVICE_ACCOUNT, "namespace": "jupyter"}
    for obj in server:
        kubernetes_validate.validate(obj, desired_version="1.33", strict=True)
        if "subjects" in obj:
            assert obj["subjects"] == [subject]
        for rule in obj.get("rules", []):
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
            assert "resourceNames" not in rule or rule["resourceNames"]
    # Cluster-wide it only reads; writes are bound per user namespace.
    cluster_role = next(
        m for m in server if m["metadata"]["name"] == rbac.ROLE and m["kind"] == "ClusterRole"
    )
    assert {v for rule in cluster_role["rules"] for v in rule["verbs"]} <= {"get", "list", "watch"}
    assert all("secrets" not in rule["resources"] for rule in cluster_role["rules"])
    user_bindings = [
        m for m in server if m["kind"] == "RoleBinding" and m["metadata"]["namespace"] != "jupyter"
    ]
    assert {m["roleRef"]["name"] for m in user_bindings} == {rbac.USER_NAMESPACE_ROLE}
    # Secrets in user namespaces: created and deleted, never read back.
    secrets = [r for r in rbac.USER_NAMESPACE_RULES if "secrets" in r["resources"]]
    assert [r["verbs"] for r in secrets] == [["create", "delete"]]
    # A bad server namespace is refused, and nothing is printed.
    assert print_manifests([*argv, "--server-namespace=Bad_NS"]) != 0
    captured = capsys.readouterr()
    assert captured.out == "" and "--server-namespace" in captured.err
