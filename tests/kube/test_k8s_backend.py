"""The Kubernetes backend against the API emulator, end to end.

The JobService submits for real and a real supervisor process drives the job over HTTP;
the test plays the Job controller / Training Operator, the scheduler and the kubelet
(`ClusterPlayer`), running the real worker runtime for each rank with the payload read
back from the job's Secrets and feeding its actual output as the pod log.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from helpers import assert_no_job_processes, wait_for
from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError
from jupyterlab_mlcluster.jobs.service import JobService
from jupyterlab_mlcluster.runtime.payload import Payload
from tests.kube.crds import training_operator_crds
from tests.kube.helpers import Kube
from tests.kube.player import ClusterPlayer, objects_of

IMAGE = 'registry.example.com/team/notebook:2.1'

CELL = """
import os
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}")
{"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "x": x}
"""


def spec_of(**options: Any) -> JobSpec:
    return JobSpec.from_options({'backend': 'kubernetes', **options})


def code(source: str, **push: Any) -> Payload:
    return Payload(kind='code', source=source, push=push)


@pytest.fixture
def k8s(store_dir: Path, kube_namespace: str):
    """make(**MLClusterConfig settings) -> a JobService whose jobs go to this test's
    namespace. Afterwards no job may be left running, in the cluster or on this machine."""
    services: list[JobService] = []

    def make(**settings: Any) -> JobService:
        config = {'kubernetes_namespace': kube_namespace, 'kubernetes_image': IMAGE,
                  # supervisors forked with the Kubernetes client already imported
                  'warm_pool_modules': ['kubernetes'], **settings}
        path = Path(os.environ['JUPYTER_CONFIG_DIR']) / 'jupyter_mlcluster_config.json'
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({'MLClusterConfig': config}))
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
def player(kube: Kube, kube_namespace: str, tmp_path: Path) -> ClusterPlayer:
    return ClusterPlayer(kube, kube_namespace, tmp_path / 'node')


@pytest.fixture
def training_operator(kube: Kube):
    """The Training Operator's CRDs are served (for this test only)."""
    crds = training_operator_crds()
    for crd in crds:
        kube.install_crd(crd)
    yield
    for crd in crds:
        kube.uninstall_crd(crd['metadata']['name'])


def log_text(service: JobService, job_id: str, rank: int | None = None) -> list[str]:
    lines, _ = service.logs(job_id, rank)
    return [f'{item["rank"]}:{item["line"]}' for item in lines if item['stream'] != 'system']


# -- the Indexed Job path ------------------------------------------------------------------------


def test_indexed_job_runs_the_cell_and_brings_the_result_back(k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=2), code(CELL, x=41))
    job = player.resumed(record.id)
    # No Training Operator here: an Indexed Job plus a headless Service, created suspended
    # and resumed once its owned Secrets and Service exist.
    assert (job['apiVersion'], job['kind']) == ('batch/v1', 'Job')
    name = job['metadata']['name']
    service_obj = kube.get('v1', 'Service', name, kube_namespace)
    (secret,) = kube.list('v1', 'Secret', kube_namespace, label_selector=f'mlcluster.io/job-id={record.id}')
    for owned in (service_obj, secret):
        (ref,) = owned['metadata']['ownerReferences']
        assert (ref['kind'], ref['uid'], ref['blockOwnerDeletion']) == ('Job', job['metadata']['uid'], True)
    assert job['spec']['template']['spec']['containers'][0]['image'] == IMAGE

    runs = player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == 'succeeded', (final.error, runs[0].text, runs[1].text)
    assert service.result(record.id) == ('value', {'rank': 0, 'world': 2, 'x': 41})
    assert [r.state for r in final.ranks] == ['succeeded', 'succeeded']
    assert [r.exit_code for r in final.ranks] == [0, 0]
    # The pods are gone (foreground deletion), their output is not.
    assert objects_of(kube, kube_namespace, record.id) == {}
    assert log_text(service, record.id, 0) == ['0:hello from rank 0 of 2']
    assert log_text(service, record.id, 1) == ['1:hello from rank 1 of 2']
