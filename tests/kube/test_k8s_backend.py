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
def player(kube: Kube, kube_namespace: str, tmp_path: Path):
    node = ClusterPlayer(kube, kube_namespace, tmp_path / 'node')
    yield node
    node.stop_all()


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


def record_of(service: JobService, job_id: str):
    return service.store.get_job(job_id)


def wait_state(service: JobService, job_id: str, predicate, timeout: float = 30, message: str = 'state'):
    return wait_for(lambda: (lambda r: r if predicate(r) else None)(record_of(service, job_id)),
                    timeout=timeout, message=message)


# -- the Training Operator path -------------------------------------------------------------------

FAILING_CELL = """
import os, time
print("rank", os.environ["RANK"], "up", flush=True)
if os.environ["RANK"] == "1":
    1 / 0
time.sleep(120)
"""


def test_pytorchjob_failing_rank_fails_the_job_with_its_traceback(
        training_operator, k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=3), code(FAILING_CELL))
    job = player.resumed(record.id)
    assert (job['apiVersion'], job['kind']) == ('kubeflow.org/v1', 'PyTorchJob')
    assert set(job['spec']['pytorchReplicaSpecs']) == {'Master', 'Worker'}
    assert job['spec']['pytorchReplicaSpecs']['Worker']['replicas'] == 2
    pods = player.create_pods(job)
    assert sorted(pods) == [0, 1, 2]
    for pod in pods.values():
        player.schedule(pod)
    runs = {rank: player.run_rank(pod) for rank, pod in pods.items()}
    wait_state(service, record.id, lambda r: r.state == 'running', message='the job running')
    assert player.end_rank(runs[1]) == 1  # the kubelet reports the failed container

    final = service.wait(record.id, timeout=60)
    player.kill_deleted()
    assert final.state == 'failed'
    assert final.failed_rank == 1
    assert final.error == 'rank 1 failed: ZeroDivisionError: division by zero'
    report = service.error_report(record.id)
    assert report['exc_type'] == 'ZeroDivisionError' and '1 / 0' in report['traceback']
    assert 'line 5' in report['traceback']
    assert [r.state for r in final.ranks] == ['cancelled', 'failed', 'cancelled']
    assert final.ranks[1].exit_code == 1
    # Fail-fast: the other ranks' pods were deleted with the job, nothing is left.
    assert objects_of(kube, kube_namespace, record.id) == {}
    assert 'rank 1 up' in ''.join(log_text(service, record.id, 1))
    # The kernel's error display gets the rank's traceback.
    with pytest.raises(Exception) as raised:
        service.raise_for_state(final)
    assert 'Traceback of rank 1' in str(raised.value) and '1 / 0' in str(raised.value)


# -- cancel, and gang scheduling through Volcano ------------------------------------------------------

SLEEPY_CELL = """
import os, time
print("rank", os.environ["RANK"], "waiting", flush=True)
time.sleep(300)
"""


@pytest.fixture
def volcano(kube: Kube):
    from tests.kube.crds import podgroup_crd
    crd = podgroup_crd()
    kube.install_crd(crd)
    yield
    kube.uninstall_crd(crd['metadata']['name'])


def test_cancel_deletes_everything_including_the_podgroup(volcano, k8s, player, kube, kube_namespace):
    service = k8s(kubernetes_gang='volcano', kubernetes_queue='training')
    record = service.submit(spec_of(workers=2, cpus=2, memory='1Gi'), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    (group,) = kube.list('scheduling.volcano.sh/v1beta1', 'PodGroup', kube_namespace,
                         label_selector=f'mlcluster.io/job-id={record.id}')
    assert group['spec']['minMember'] == 2 and group['spec']['queue'] == 'training'
    assert group['spec']['minResources'] == {'cpu': '4', 'memory': '2Gi'}
    assert job['spec']['template']['spec']['schedulerName'] == 'volcano'
    pods = player.create_pods(job)
    for pod in pods.values():
        player.schedule(pod)
        player.run_rank(pod)
    wait_state(service, record.id, lambda r: all(rk.state == 'running' for rk in r.ranks), message='ranks running')
    wait_for(lambda: len(log_text(service, record.id)) == 2, message='both ranks logging')
    assert objects_of(kube, kube_namespace, record.id).keys() == {'Pod', 'Secret', 'Service', 'Job', 'PodGroup'}

    final = service.cancel(record.id)
    player.kill_deleted()
    assert final.state == 'cancelled' and final.reason == 'cancelled by user'
    assert [r.state for r in final.ranks] == ['cancelled', 'cancelled']
    assert objects_of(kube, kube_namespace, record.id) == {}


# -- conflicts ---------------------------------------------------------------------------------------

CONFLICT = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'reason': 'Conflict',
            'code': 409, 'message': 'Operation cannot be fulfilled: the object has been modified; '
                                    'please apply your changes to the latest version and try again'}


def test_conflicts_are_retried(k8s, player, kube, kube_namespace):
    import re
    jobs_path = re.compile(rf'/apis/batch/v1/namespaces/{kube_namespace}/jobs/[^/]+')
    secrets_path = f'/api/v1/namespaces/{kube_namespace}/secrets'
    kube.on_emulator(lambda e: e['patch', jobs_path][:2] << 409 << CONFLICT)
    kube.on_emulator(lambda e: e['post', secrets_path][:1] << 409 << CONFLICT)
    service = k8s()
    record = service.submit(spec_of(workers=1), code('print("resumed at last")\n6 * 7'))
    player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == 'succeeded', final.error
    assert service.result(record.id) == ('value', 42)
    patches = kube.on_emulator(lambda e: len(list(e['patch', jobs_path])))
    posts = kube.on_emulator(lambda e: len(list(e['post', secrets_path])))
    assert (patches, posts) == (3, 2)  # two conflicts, then the resume; one, then the Secret
    assert objects_of(kube, kube_namespace, record.id) == {}


# -- waiting for resources -------------------------------------------------------------------------------


def test_an_unschedulable_pod_is_a_readable_reason(k8s, player, kube, kube_namespace):
    service = k8s()
    record = service.submit(spec_of(workers=2, gpus_per_worker=1), code(SLEEPY_CELL))
    job = player.resumed(record.id)
    wait_state(service, record.id, lambda r: r.reason == 'waiting for the Job controller to create the pods',
               message='waiting for pods')
    pods = player.create_pods(job)
    player.schedule(pods[0])
    kube.set_pod_unschedulable(kube_namespace, pods[1], '0/3 nodes are available: 3 Insufficient nvidia.com/gpu.')
    record_ = wait_state(service, record.id, lambda r: r.reason and 'Insufficient' in r.reason, message='the reason')
    assert record_.state == 'queued'
    assert record_.reason == ('waiting for resources: rank 1 of 2 cannot be scheduled yet '
                              '(0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)')
    assert [r.state for r in record_.ranks] == ['starting', 'pending']

    player.schedule(pods[1])
    kube.set_container_waiting(kube_namespace, pods[0], 'ImagePullBackOff',
                               f'Back-off pulling image "{IMAGE}"')
    record_ = wait_state(service, record.id, lambda r: r.reason and 'ImagePullBackOff' in r.reason,
                         message='the image reason')
    assert record_.state == 'starting'
    assert record_.reason == f'rank 0 cannot start: ImagePullBackOff: Back-off pulling image "{IMAGE}"'
    final = service.cancel(record.id)
    assert final.state == 'cancelled'
    assert objects_of(kube, kube_namespace, record.id) == {}
