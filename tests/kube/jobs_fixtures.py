"""Fixtures and helpers for tests of the Kubernetes job backend (imported by those tests)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_no_job_processes, wait_for

from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.runtime.payload import Payload
from tests.kube.crds import (
    pod_metrics_crd,
    podgroup_crd,
    trainer_crds,
    trainer_runtime,
    training_operator_crds,
)
from tests.kube.helpers import Kube
from tests.kube.player import ClusterPlayer, objects_of

IMAGE = "registry.example.com/team/notebook:2.1"
REPO = Path(__file__).resolve().parents[2]


def spec_of(**options: Any) -> JobSpec:
    return JobSpec.from_options({"backend": "kubernetes", **options})


def code(source: str, **push: Any) -> Payload:
    return Payload(kind="code", source=source, push=push)


def write_settings(namespace: str, **settings: Any) -> None:
    """MLClusterConfig for every process of this test (kernels and supervisors read it too)."""
    config = {
        "kubernetes_namespace": namespace,
        "kubernetes_image": IMAGE,
        # supervisors forked with the Kubernetes client already imported
        "warm_pool_modules": ["kubernetes"],
        **settings,
    }
    path = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "jupyter_mlcluster_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"MLClusterConfig": config}))


@pytest.fixture
def k8s(store_dir: Path, kube_namespace: str, monkeypatch: pytest.MonkeyPatch):
    """make(**MLClusterConfig settings) -> a JobService whose jobs go to this test's
    namespace. Afterwards no job may be left running, in the cluster or on this machine."""
    # Supervisors forked from a warm pool (which starts in /) import this checkout's code,
    # not whichever checkout the package is installed from.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    services: list[JobService] = []

    def make(**settings: Any) -> JobService:
        write_settings(kube_namespace, **settings)
        service = JobService()
        services.append(service)
        return service

    yield make
    for service in services:
        for record in service.store.list_jobs()[0]:
            if not record.final:
                service.cancel(record.id)
        assert_no_job_processes(service)


@pytest.fixture
def player(kube: Kube, kube_namespace: str, tmp_path: Path):
    """The cluster's side (controllers, scheduler, kubelet); its containers are stopped after."""
    node = ClusterPlayer(kube, kube_namespace, tmp_path / "node")
    yield node
    node.stop_all()


@contextlib.contextmanager
def served(kube: Kube, crds: list[dict[str, Any]]) -> Iterator[None]:
    """These CRDs are installed (and served) for the duration."""
    for crd in crds:
        kube.install_crd(crd)
    try:
        yield
    finally:
        for crd in crds:
            kube.uninstall_crd(crd["metadata"]["name"])


@pytest.fixture
def training_operator(kube: Kube):
    """The Training Operator's CRDs are served (for this test only)."""
    with served(kube, training_operator_crds()):
        yield


@pytest.fixture
def trainer(kube: Kube):
    """Kubeflow Trainer v2's CRDs (as published) are served, with its `torch-distributed`
    ClusterTrainingRuntime; yields a function adding another runtime by name."""
    with served(kube, trainer_crds()):
        kube.create(trainer_runtime("torch-distributed"))
        yield lambda name: kube.create(trainer_runtime(name))


@pytest.fixture
def volcano(kube: Kube):
    """Volcano's PodGroup is served."""
    with served(kube, [podgroup_crd()]):
        yield


@pytest.fixture
def metrics_api(kube: Kube):
    """The metrics API (metrics.k8s.io PodMetrics) is served."""
    with served(kube, [pod_metrics_crd()]):
        yield


def log_text(service: JobService, job_id: str, rank: int | None = None) -> list[str]:
    """'rank:line' of a job's stored output (no system lines)."""
    lines, _ = service.logs(job_id, rank)
    return [f"{item['rank']}:{item['line']}" for item in lines if item["stream"] != "system"]


SLEEPY_CELL = """
import os, time
print("rank", os.environ["RANK"], "waiting", flush=True)
time.sleep(300)
"""


def cancel_running(
    service: JobService,
    player: ClusterPlayer,
    kube: Kube,
    namespace: str,
    job_id: str,
    job: dict[str, Any],
    kinds: set[str],
) -> None:
    """Both ranks of the SLEEPY_CELL job `job_id`, whose resumed job object is `job`, are
    scheduled, running and logging while objects of `kinds` stand; a cancel then stops both
    and leaves nothing behind."""
    pods = player.create_pods(job)
    for pod in pods.values():
        player.schedule(pod)
        player.run_rank(pod)

    def running() -> bool:
        record = service.store.get_job(job_id)
        return record.state == "running" and all(rk.state == "running" for rk in record.ranks)

    wait_for(running, timeout=30, message="ranks running")
    wait_for(lambda: len(log_text(service, job_id)) == 2, message="both ranks logging")
    assert objects_of(kube, namespace, job_id).keys() == kinds

    final = service.cancel(job_id)
    player.kill_deleted()
    # (then where the ranks were, or why they could not be read: issue 33)
    assert final.state == "cancelled" and final.reason.startswith("cancelled by user")
    assert [r.state for r in final.ranks] == ["cancelled", "cancelled"]
    assert objects_of(kube, namespace, job_id) == {}
