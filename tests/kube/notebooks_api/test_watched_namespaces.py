"""A shared server told its user namespaces (`MLClusterApp.watched_namespaces`, which the
printed Deployment sets) follows Notebooks and their events in each of them, and nowhere
else: the printed RBAC grants those reads only there (issue 22, least privilege), and
/events still tells each owner of their own notebooks.

A real server on a pristine API emulator of its own; every list and watch it made is checked
against the printed RBAC, evaluated as the API server's RBAC authorizer does.
"""

from __future__ import annotations

from typing import Any

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.server.user_namespace import template_namespace
from notebook_controller import objects
from notebook_controller import server_rbac as rbac
from notebook_controller.manifests import all_manifests
from tests.kube.controller_support import install_crds
from tests.kube.fixtures import KubeCluster
from tests.kube.notebooks_api.conftest import per_user_server_config
from tests.kube.notebooks_api.test_notebooks_api import User
from tests.kube.protocol import parse_api_path
from tests.kube.rbac_authz import can

TEMPLATE = "team-{user}"
ALICE, BOB = "alice", "bob"
WATCHED = [template_namespace(ALICE, TEMPLATE), template_namespace(BOB, TEMPLATE)]


@pytest.fixture
def cluster(fresh_kube, monkeypatch) -> KubeCluster:
    made = fresh_kube()
    monkeypatch.setenv("KUBECONFIG", str(made.kubeconfig))
    for namespace in [*WATCHED, "elsewhere", "shared"]:
        made.kube.create_namespace(namespace)
    install_crds(made.kube)
    return made


@pytest.fixture
def jp_server_config(cluster, store_dir, monkeypatch):
    config = per_user_server_config(monkeypatch, TEMPLATE, shared_namespace="shared")
    config["MLClusterApp"]["watched_namespaces"] = list(WATCHED)
    return config


def test_the_notebook_watch_reads_only_the_user_namespaces(
    cluster: KubeCluster, mlc: Any, jp_fetch, jp_ws_fetch, run
) -> None:
    kube = cluster.kube
    alice, bob = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, BOB)
    run(alice.connect())
    run(bob.connect())
    for user in (alice, bob):
        status, reply, _ = run(user.call("POST", "notebooks", body={"name": "nb1"}))
        assert status == 201, reply
    # Each owner hears of their own, from the watch of their own namespace.
    for user in (alice, bob):
        message = run(user.until(lambda m: m["type"] == "notebook"))
        assert message["notebook"]["name"] == "nb1"
    # A notebook changed by the controller (its status) reaches its owner through the watch.
    namespace = WATCHED[0]
    kube.patch(
        "mlcluster.io/v1alpha1",
        "Notebook",
        "nb1",
        {"status": {"phase": "ready", "ready": True, "readyReplicas": 1}},
        namespace,
        subresource="status",
    )
    run(alice.until(lambda m: m["type"] == "notebook" and m["notebook"]["phase"] == "ready"))
    # Each namespace's events are followed too (once its notebooks were listed).
    wait_for(
        lambda: all(events.lists for _, events in mlc.notebook_watch.pairs),
        timeout=60,
        message="events listed in every user namespace",
    )
    # What the server asked: Notebooks and events listed and watched only per user namespace,
    # each granted there by the printed RBAC, none of it cluster-wide.
    printed = all_manifests(user_namespaces=WATCHED, server_namespace="jupyter")
    account = ("jupyter", rbac.SERVICE_ACCOUNT)
    seen = kube.on_emulator(
        lambda e: [
            (str(getattr(r.method, "value", r.method)).upper(), r.url.path, dict(r.params))
            for r in e._requests
            if not r.headers.get("User-Agent", "").startswith("python-requests")
        ]
    )
    watched: set[tuple[str, str | None]] = set()
    for method, path, params in seen:
        api = parse_api_path(path)
        if api is None or api.plural not in ("notebooks", "events") or method != "GET":
            continue
        if api.name:
            continue  # a get of one notebook, by the REST routes
        verb = "watch" if params.get("watch") in ("true", "1") else "list"
        watched.add((api.plural, api.namespace))
        assert api.namespace in WATCHED, f"{verb} {path}: outside the user namespaces"
        assert can(printed, account, verb, api.group, api.plural, api.namespace), path
    assert {(plural, ns) for plural in ("notebooks", "events") for ns in WATCHED} <= watched
    for plural, group in (("notebooks", "mlcluster.io"), ("events", "")):
        assert not can(printed, account, "list", group, plural, None)
        assert not can(printed, account, "watch", group, plural, "elsewhere")
    # Alice's notebook planted elsewhere is not followed (nor would it be shown to her).
    kube.create(
        objects.notebook_resource("planted", "elsewhere", ALICE, labels={"mlcluster.io/owner": "x"})
    )
    messages = run(alice.notebook_messages())
    assert all(m.get("notebook", {}).get("name") != "planted" for m in messages)
