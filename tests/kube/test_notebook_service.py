"""The server extension's per-user NotebookService against the emulator, with the controller,
called directly (no HTTP; the REST API and /events are in notebooks_api/).
"""

from __future__ import annotations

from typing import Any

import pytest

from jupyterlab_mlcluster.kubeconn import KubeConnection
from jupyterlab_mlcluster.server import notebooks
from tests.kube.controller_support import NB, wait_owned, wait_phase
from tests.kube.helpers import Kube


def test_users_manage_only_their_own_notebook_servers(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    service = notebooks.NotebookService(
        KubeConnection(kube_namespace), image="quay.io/jupyter/base-notebook:latest"
    )
    alice, bob = "alice@example.com", "bob"
    with controller():
        made = service.create(
            alice, {"name": "nb1", "cpu": 2, "memory": "4Gi", "workspace_size": "1Gi"}
        )
        assert made["name"] == "nb1" and made["owner"] == alice and not made["ready"]
        service.create(bob, {"name": "nb2"})
        children = wait_owned(kube, kube_namespace, "nb1")
        assert children["AuthorizationPolicy"]["spec"]["rules"][0]["when"][0]["values"] == [alice]
        assert [n["name"] for n in service.list(alice)] == ["nb1"]
        with pytest.raises(notebooks.NotebookNotFound):
            service.get(bob, "nb1")
        with pytest.raises(notebooks.NotebookExists):
            service.create(alice, {"name": "nb1"})

        kube.run_statefulset(kube_namespace, "nb1")
        kube.wait_for(
            lambda: service.get(alice, "nb1")["ready"], message="ready through the service"
        )
        assert service.stop(alice, "nb1")["stopped"]
        kube.wait_for(
            lambda: (
                kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"] == 0
            )
        )
        kube.run_statefulset(kube_namespace, "nb1")  # the StatefulSet controller removes the pod
        kube.wait_for(lambda: service.get(alice, "nb1")["phase"] == "stopped", message="stopped")
        with pytest.raises(notebooks.NotebookNotFound):
            service.stop(bob, "nb1")
        assert not service.start(alice, "nb1")["stopped"]
        kube.wait_for(
            lambda: (
                kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"] == 1
            )
        )
        wait_phase(kube, kube_namespace, "nb1", "starting")
        kube.run_statefulset(kube_namespace, "nb1")
        kube.wait_for(lambda: service.get(alice, "nb1")["ready"], message="ready again")

        service.delete(alice, "nb1")  # foreground: the Notebook goes after what it owns
        kube.wait_for(
            lambda: kube.find(NB, "Notebook", "nb1", kube_namespace) is None, message="deleted"
        )
        assert (
            kube.list(
                "apps/v1",
                "StatefulSet",
                kube_namespace,
                label_selector="mlcluster.io/notebook-name=nb1",
            )
            == []
        )
        assert kube.list("v1", "Pod", kube_namespace) == []
        assert [n["name"] for n in service.list(bob)] == ["nb2"]
