"""Running the notebook-controller in tests, and reading what it made."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kopf.testing import KopfRunner

from notebook_controller import objects
from notebook_controller.config import ControllerConfig
from notebook_controller.crd import notebook_crd
from notebook_controller.handlers import build_registry, build_settings
from tests.kube.helpers import Kube, KubeApiError
from tests.kube.istio import istio_crds

NB = "mlcluster.io/v1alpha1"
OWNED = [
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Service"),
    ("apps/v1", "StatefulSet"),
    ("networking.istio.io/v1", "VirtualService"),
    ("security.istio.io/v1", "AuthorizationPolicy"),
]


def install_crds(
    kube: Kube,
    networking: tuple[str, ...] = ("v1", "v1beta1"),
    security: tuple[str, ...] = ("v1", "v1beta1"),
) -> None:
    kube.install_crd(notebook_crd())
    for crd in istio_crds(networking, security):
        kube.install_crd(crd)


@contextlib.contextmanager
def running_controller(namespace: str, **settings: Any) -> Iterator[KopfRunner]:
    """The controller in-process (kopf's KopfRunner), limited to one namespace."""
    config = ControllerConfig(namespaces=[namespace], retry_delay=0.5, **settings)
    with KopfRunner(
        ["run", "--standalone", "--namespace", namespace],
        registry=build_registry(config),
        settings=build_settings(config),
        timeout=30,
    ) as runner:
        yield runner
    assert runner.exception is None, runner.output[-3000:]


def owned(kube: Kube, namespace: str, name: str, istio: str = "v1") -> dict[str, dict[str, Any]]:
    """Every object labelled as the notebook's, by kind."""
    found: dict[str, dict[str, Any]] = {}
    for api_version, kind in OWNED:
        api_version = api_version.replace("istio.io/v1", f"istio.io/{istio}")
        try:
            listed = kube.list(
                api_version, kind, namespace, label_selector=f"{objects.LABEL_NOTEBOOK}={name}"
            )
        except KubeApiError as exc:
            if exc.status == 404:
                continue  # not served by this cluster (no Istio)
            raise
        for obj in listed:
            assert kind not in found, f"two {kind}s for {name}"
            found[kind] = obj
    return found


def wait_owned(
    kube: Kube, namespace: str, name: str, count: int = 5, timeout: float = 15, istio: str = "v1"
) -> dict[str, dict[str, Any]]:
    return kube.wait_for(
        lambda: (o := owned(kube, namespace, name, istio)) and len(o) == count and o,
        timeout=timeout,
        message=f"{count} objects of {name}",
    )


def notebook_status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get(NB, "Notebook", name, namespace).get("status") or {}


def wait_phase(
    kube: Kube, namespace: str, name: str, phase: str, timeout: float = 15
) -> dict[str, Any]:
    return kube.wait_for(
        lambda: (
            (s := notebook_status(kube, namespace, name)).get("phase", "").startswith(phase) and s
        ),
        timeout=timeout,
        message=f"phase {phase!r} (now {notebook_status(kube, namespace, name)})",
    )


def create_notebook(
    kube: Kube, namespace: str, name: str = "nb1", workspace: str | None = "5Gi", **kwargs: Any
) -> dict[str, Any]:
    return kube.create(
        objects.notebook_resource(
            name,
            namespace,
            "alice@example.com",
            cpu="1",
            memory="2Gi",
            workspace_size=workspace,
            **kwargs,
        )
    )
