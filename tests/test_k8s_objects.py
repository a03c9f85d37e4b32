"""The Kubernetes manifest builders: literal expected dicts, real schemas, the payload path.

Built-in kinds are validated with kubernetes-validate (strict, 1.33); PyTorchJob/TFJob with
schemas derived from the Training Operator SDK and PodGroup with a hand-written schema (see
tests/k8s_schemas.py).
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jupyterlab_mlcluster.backends.kubernetes import objects, rbac
from jupyterlab_mlcluster.backends.kubernetes.objects import (
    build_job_objects,
    check_request,
    choose_engine,
    choose_ranks_per_pod,
    job_selector,
    label_value,
    object_name,
    pod_ranks,
    split_packed_line,
    with_owner,
)
from jupyterlab_mlcluster.backends.kubernetes.payload import (
    CHUNK_SIZE,
    MAX_COMPRESSED_BYTES,
    PayloadTooLarge,
    join_payload,
    split_payload,
)
from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError
from jupyterlab_mlcluster.runtime.ports import reserve_port
from tests.k8s_schemas import K8S_VERSION, validate_builtin, validate_custom, validate_manifest

REPO = Path(__file__).resolve().parent.parent

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(  # optional DNS-subdomain prefix "/" name
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)

MOUNTS = [
    {"name": "payload", "mountPath": "/var/run/mlcluster/payload", "readOnly": True},
    {"name": "dshm", "mountPath": "/dev/shm"},
]
WORKER_COMMAND = ["python", "-m", "jupyterlab_mlcluster.runtime.worker"]
NO_SERVICE_ACCESS = {"automountServiceAccountToken": False, "enableServiceLinks": False}
BASE_ENV = [
    {"name": "MLCLUSTER_PAYLOAD", "value": "/var/run/mlcluster/payload"},
    {"name": "MLCLUSTER_REPORT", "value": "stdout"},
    {"name": "PYTHONUNBUFFERED", "value": "1"},
    {"name": "TORCHELASTIC_RESTART_COUNT", "value": "0"},
    {"name": "TORCHELASTIC_MAX_RESTARTS", "value": "0"},
]


def spec_of(**options) -> JobSpec:
    return JobSpec.from_options(options, default_backend="kubernetes")


def build(spec: JobSpec | None = None, job_id: str = "j1", **kwargs) -> objects.JobObjects:
    """build_job_objects with unremarkable defaults, for tests about one aspect."""
    defaults = {
        "namespace": "n",
        "image": "i",
        "user": "u",
        "payload_chunks": [b"x"],
        "engine": "indexed-job",
    }
    if kwargs.get("engine") == "trainjob":
        defaults["runtime"] = "torch-distributed"
    return build_job_objects(job_id, spec or spec_of(), **{**defaults, **kwargs})


def labels_for(job_id: str, user: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "jupyterlab-mlcluster",
        "mlcluster.io/job-id": job_id,
        "mlcluster.io/user": user,
    }


def job_metadata(
    name: str, namespace: str, labels: dict[str, str], user: str, display_name: str | None = None
) -> dict:
    """A built job object's metadata: the job's labels and the annotations every job has."""
    annotations = {"mlcluster.io/user": user, "mlcluster.io/attempt": "0"}
    if display_name:
        annotations["mlcluster.io/name"] = display_name
    return {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}


def payload_secret(name: str, namespace: str, labels: dict[str, str], index: int, data: str):
    """Chunk `index` of job object `name`'s payload (`data`: the chunk in base64)."""
    key = f"payload-{index:03d}"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-{key}", "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "immutable": True,
        "data": {key: data},
    }


def rank_env(job_id: str, rank_field: str, world_size: int, master_addr: str) -> list[dict]:
    """A one-rank pod's environment: its RANK from `rank_field`, no GPUs."""
    return [
        {"name": "MLCLUSTER_JOB_ID", "value": job_id},
        *BASE_ENV,
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": rank_field}}},
        {"name": "WORLD_SIZE", "value": str(world_size)},
        {"name": "MASTER_ADDR", "value": master_addr},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]


def payload_source(name: str, index: int) -> dict:
    key = f"payload-{index:03d}"
    return {"secret": {"name": f"{name}-{key}", "items": [{"key": key, "path": key}]}}


def volumes(name: str, chunks: int) -> list[dict]:
    return [
        {
            "name": "payload",
            "projected": {
                "sources": [payload_source(name, i) for i in range(chunks)],
                "defaultMode": 0o444,
            },
        },
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]


def pod_templates(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    if obj["kind"] == "Job":
        return [spec["template"]]
    if obj["kind"] == "TrainJob":  # what we patch into the runtime's pod template
        return [
            job["template"]["spec"]["template"]
            for patch in spec["runtimePatches"]
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        ]
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("tfReplicaSpecs") or {}
    return [r["template"] for r in replicas.values()]


def all_combinations():
    """Every engine x gang x framework the builders accept, with GPUs and without."""
    for engine, gang, framework, gpus in itertools.product(
        objects.ENGINES, objects.GANGS, ("pytorch", "tensorflow", "jax", "none"), (0, 2)
    ):
        spec = spec_of(
            workers=3,
            gpus_per_worker=gpus,
            cpus=1.5,
            memory="3Gi",
            framework=framework,
            name="sweep",
            timeout="10m",
            # (a queue without a gang scheduler is refused: nothing would read it)
            queue="team-a" if gang != "none" else None,
        )
        try:
            check_request(spec, engine=engine, gang=gang)
        except SpecError:
            continue
        yield engine, gang, spec


# --- literal expected objects -----------------------------------------------------------


def test_pytorchjob_with_training_operator_gang_is_exactly_this():
    spec = spec_of(
        workers=3,
        gpus_per_worker=1,
        cpus=2,
        memory="8Gi",
        framework="pytorch",
        name="train",
        timeout="90s",
        queue="team-a",
        env={"EPOCHS": "3"},
    )
    built = build(
        spec,
        "j3fa9c21b0",
        namespace="alice",
        image="registry.example/nb:1.0",
        user="alice",
        payload_chunks=[b"chunk-0", b"chunk-1"],
        engine="pytorchjob",
        gang="training-operator",
        priority_class="high",
        service_account="mlcluster-runner",
    )
    labels = labels_for("j3fa9c21b0", "alice")
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "registry.example/nb:1.0",
                    "command": WORKER_COMMAND,
                    "env": [
                        {"name": "EPOCHS", "value": "3"},
                        {"name": "MLCLUSTER_JOB_ID", "value": "j3fa9c21b0"},
                        *BASE_ENV,
                        {"name": "LOCAL_RANK", "value": "0"},
                        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
                        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                    ],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi"},
                        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                    },
                    "volumeMounts": MOUNTS,
                    "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                }
            ],
            "volumes": volumes("train-j3fa9c21b0", 2),
            **NO_SERVICE_ACCESS,
            "serviceAccountName": "mlcluster-runner",
            "priorityClassName": "high",
        },
    }
    assert built.job == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": job_metadata("train-j3fa9c21b0", "alice", labels, "alice", "train"),
        "spec": {
            "nprocPerNode": "1",
            "runPolicy": {
                "cleanPodPolicy": "Running",
                "backoffLimit": 0,
                "suspend": True,
                "activeDeadlineSeconds": 90,
                "schedulingPolicy": {"minAvailable": 3, "queue": "team-a", "priorityClass": "high"},
            },
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": template},
                "Worker": {"replicas": 2, "restartPolicy": "Never", "template": template},
            },
        },
    }
    assert built.dependents == [
        payload_secret("train-j3fa9c21b0", "alice", labels, 0, "Y2h1bmstMA=="),
        payload_secret("train-j3fa9c21b0", "alice", labels, 1, "Y2h1bmstMQ=="),
    ]
    assert built.resume == {"spec": {"runPolicy": {"suspend": False}}}
    for obj in built.all():
        validate_manifest(obj)


def test_indexed_job_with_volcano_is_exactly_this():
    spec = spec_of(workers=2, cpus=0.5, framework="tensorflow")
    built = build(
        spec, "j00ff", namespace="bob", image="nb:2", user="bob", gang="volcano", queue="research"
    )
    labels = labels_for("j00ff", "bob")
    assert built.job == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": job_metadata("j00ff", "bob", labels, "bob"),
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "worker",
                            "operator": "NotIn",
                            "values": [0],
                        },
                    }
                ]
            },
            "suspend": True,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"scheduling.k8s.io/group-name": "j00ff"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "nb:2",
                            "command": WORKER_COMMAND,
                            "env": [
                                *rank_env(
                                    "j00ff",
                                    "metadata.annotations"
                                    "['batch.kubernetes.io/job-completion-index']",
                                    2,
                                    "j00ff-0.j00ff",
                                ),
                                {
                                    "name": "MLCLUSTER_TF_WORKERS",
                                    "value": "j00ff-0.j00ff:2222,j00ff-1.j00ff:2222",
                                },
                            ],
                            "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}},
                            "volumeMounts": MOUNTS,
                        }
                    ],
                    "volumes": volumes("j00ff", 1),
                    **NO_SERVICE_ACCESS,
                    "restartPolicy": "Never",
                    "subdomain": "j00ff",
                    "schedulerName": "volcano",
                },
            },
        },
    }
    assert built.dependents == [
        payload_secret("j00ff", "bob", labels, 0, "eA=="),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "j00ff", "namespace": "bob", "labels": labels},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"mlcluster.io/job-id": "j00ff"},
            },
        },
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "j00ff", "namespace": "bob", "labels": labels},
            "spec": {"minMember": 2, "minResources": {"cpu": "1"}, "queue": "research"},
        },
    ]
    assert built.resume == {"spec": {"suspend": False}}
    for obj in built.all():
        validate_manifest(obj)


def test_tfjob_with_kueue_is_created_suspended_for_kueue_to_admit():
    spec = spec_of(
        workers=2, cpus=1, memory="1G", framework="tensorflow", name="tf", queue="team-a"
    )
    built = build(
        spec,
        namespace="carol",
        image="tf:2",
        user="carol",
        engine="tfjob",
        gang="kueue",
        queue="ignored-default",
    )
    labels = labels_for("j1", "carol")
    assert built.job == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": job_metadata(
            "tf-j1", "carol", {**labels, "kueue.x-k8s.io/queue-name": "team-a"}, "carol", "tf"
        ),
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0, "suspend": True},
            "successPolicy": "AllWorkers",
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {
                                    "name": "tensorflow",
                                    "image": "tf:2",
                                    "command": WORKER_COMMAND,
                                    "env": rank_env(
                                        "j1",
                                        "metadata.labels['training.kubeflow.org/replica-index']",
                                        2,
                                        "tf-j1-worker-0",
                                    ),
                                    "resources": {
                                        "requests": {"cpu": "1", "memory": "1G"},
                                        "limits": {"cpu": "1", "memory": "1G"},
                                    },
                                    "volumeMounts": MOUNTS,
                                    "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                                }
                            ],
                            "volumes": volumes("tf-j1", 1),
                            **NO_SERVICE_ACCESS,
                        },
                    },
                }
            },
        },
    }
    assert [o["kind"] for o in built.dependents] == ["Secret"]
    assert built.resume is None  # Kueue lifts the suspension when the whole job is admitted
    validate_manifest(built.job)


def test_packed_pytorchjob_runs_torchrun_with_nproc_per_node():
    spec = spec_of(workers=4, gpus_per_worker=2, cpus=4, memory="16Gi", framework="jax", name="big")
    ranks_per_pod = choose_ranks_per_pod(spec, engine="pytorchjob", gpus_per_node=4)
    assert ranks_per_pod == 2
    built = build(spec, "j9", engine="pytorchjob", gang="volcano", ranks_per_pod=ranks_per_pod)
    job_spec = built.job["spec"]
    assert job_spec["nprocPerNode"] == "2"
    assert {k: v["replicas"] for k, v in job_spec["pytorchReplicaSpecs"].items()} == {
        "Master": 1,
        "Worker": 1,
    }
    assert job_spec["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    container = job_spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes=$(PET_NNODES)",
        "--nproc-per-node=$(PET_NPROC_PER_NODE)",
        "--node-rank=$(PET_NODE_RANK)",
        "--master-addr=$(PET_MASTER_ADDR)",
        "--master-port=$(PET_MASTER_PORT)",
        "--tee=3",
        "--module",
        "jupyterlab_mlcluster.runtime.worker",
    ]
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi"},
        "limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
    }
    assert container["env"][6:] == [
        {"name": "MLCLUSTER_GPUS_PER_RANK", "value": "2"},
        {"name": "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "value": "[${rank}]:"},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": "big-j9-master-0:6666"},
        {"name": "JAX_NUM_PROCESSES", "value": "4"},
    ]
    podgroup = built.dependents[-1]
    assert podgroup["spec"] == {
        "minMember": 2,
        "minResources": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"},
    }
    for obj in built.all():
        validate_manifest(obj)


@pytest.mark.parametrize(
    ("workers", "gpus", "gpus_per_node", "engine", "expected"),
    [
        (8, 1, 8, "pytorchjob", 8),
        (12, 1, 8, "pytorchjob", 6),  # the most that fit a node and divide the world
        (3, 2, 8, "pytorchjob", 3),
        (7, 1, 4, "pytorchjob", 1),  # prime: no packing but one rank per pod
        (8, 0, 8, "pytorchjob", 1),  # CPU jobs: one rank per pod
        (8, 1, None, "pytorchjob", 1),  # node size unknown
        (8, 1, 8, "indexed-job", 1),
    ],
)
def test_choose_ranks_per_pod(workers, gpus, gpus_per_node, engine, expected):
    spec = spec_of(workers=workers, gpus_per_worker=gpus)
    assert choose_ranks_per_pod(spec, engine=engine, gpus_per_node=gpus_per_node) == expected


# --- every object, every combination ----------------------------------------------------


@pytest.mark.slow
def test_every_combination_validates_against_the_schemas():
    count = 0
    for engine, gang, spec in all_combinations():
        built = build_job_objects(
            "j7c2e",
            spec,
            namespace="team",
            image="img:1",
            user="dana",
            payload_chunks=[b"a", b"b"],
            engine=engine,
            gang=gang,
            # a TrainJob's PriorityClass is its runtime's
            priority_class=None if engine == "trainjob" else "batch-low",
            runtime="torch-distributed" if engine == "trainjob" else None,
        )
        count += 1
        for obj in built.all():
            validate_manifest(obj)
        if built.job["kind"] == "TrainJob":
            continue  # no pod template in it (runtimePatches, checked by its own schema)
        if built.job["kind"] != "Job":  # a Job's template was just validated with the Job
            for template in pod_templates(built.job):
                validate_builtin(
                    {
                        "apiVersion": "v1",
                        "kind": "PodTemplate",
                        "metadata": {"name": "t"},
                        "template": template,
                    }
                )
    # x2 (GPUs or not): PyTorchJob 3 frameworks x 4 gangs, TFJob 1 x 4, Indexed Job 4 x 3,
    # TrainJob 2 (pytorch, jax) x 3.
    assert count == 68


def test_the_cached_builtin_validator_agrees_with_kubernetes_validate():
    """validate_builtin compiles each kind's schema once; what it accepts and what it refuses
    (with the same message) is what the library's own entry point does."""
    built = build(spec_of(workers=2), engine="indexed-job")
    good = [o for o in built.all() if o["kind"] in ("Job", "Service", "Secret")]
    assert {o["kind"] for o in good} == {"Job", "Service", "Secret"}
    broken = []
    for obj in good:
        misspelt = copy.deepcopy(obj)
        misspelt["metadata"]["lables"] = {}  # strict: an unknown field
        wrong_type = copy.deepcopy(obj)
        wrong_type["metadata"]["name"] = 7
        broken += [misspelt, wrong_type]
    for obj in good:
        validate_builtin(obj)
        kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)
    for obj in broken:
        with pytest.raises(kubernetes_validate.ValidationError) as ours:
            validate_builtin(obj)
        with pytest.raises(kubernetes_validate.ValidationError) as library:
            kubernetes_validate.validate(obj, desired_version=K8S_VERSION, strict=True)
        assert ours.value.message == library.value.message
        assert list(ours.value.absolute_path) == list(library.value.absolute_path)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_builtin({"apiVersion": "v1", "kind": "NoSuchKind", "metadata": {"name": "a"}})


@pytest.mark.parametrize(
    ("engine", "break_it"),
    [
        ("pytorchjob", lambda o: o["spec"]["runPolicy"].update(backofLimit=1)),
        ("pytorchjob", lambda o: o["spec"].update(nprocPerNode=2)),
        (
            "pytorchjob",
            lambda o: o["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][
                0
            ].update(ports=[{"containerPort": "23456"}]),
        ),
        ("pytorchjob", lambda o: o["spec"].pop("pytorchReplicaSpecs")),
        ("tfjob", lambda o: o["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2")),
        (
            "tfjob",
            lambda o: o["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"].update(
                restartPolicy=3
            ),
        ),
    ],
)
def test_crd_schemas_reject_broken_custom_resources(engine, break_it):
    framework = "tensorflow" if engine == "tfjob" else "pytorch"
    built = build(
        spec_of(workers=2, framework=framework),
        engine=engine,
    )
    validate_custom(built.job)
    broken = copy.deepcopy(built.job)
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        validate_custom(broken)


def test_podgroup_schema_rejects_broken_podgroups():
    built = build(
        spec_of(workers=2),
        engine="indexed-job",
        gang="volcano",
    )
    podgroup = built.dependents[-1]
    validate_custom(podgroup)
    for field, value in [("minMember", "2"), ("minMembers", 2), ("queue", 5), ("minMember", 2**31)]:
        broken = copy.deepcopy(podgroup)
        broken["spec"][field] = value
        with pytest.raises(jsonschema.ValidationError):
            validate_custom(broken)


def test_every_object_and_pod_carries_the_job_and_user_labels():
    for engine, gang, spec in all_combinations():
        built = build(spec, "j5", user="Erin O'Neil <erin@example.com>", engine=engine, gang=gang)
        expected_user = label_value("Erin O'Neil <erin@example.com>")
        for meta in [o["metadata"] for o in built.all()] + [
            t["metadata"] for t in pod_templates(built.job)
        ]:
            labels = meta["labels"]
            assert labels["mlcluster.io/job-id"] == "j5"
            assert labels["mlcluster.io/user"] == expected_user
            assert labels["app.kubernetes.io/managed-by"] == "jupyterlab-mlcluster"
            for key, value in labels.items():
                assert LABEL_KEY.match(key) and LABEL_VALUE.match(value) and len(value) <= 63, (
                    key,
                    value,
                )
        assert (
            built.job["metadata"]["annotations"]["mlcluster.io/user"]
            == "Erin O'Neil <erin@example.com>"
        )
        assert job_selector("j5") == "mlcluster.io/job-id=j5"


def test_fail_fast_policy_on_every_engine():
    for engine, gang, spec in all_combinations():
        built = build(
            spec,
            job_id="j5",
            engine=engine,
            gang=gang,
        )
        job_spec = built.job["spec"]
        if engine == "indexed-job":
            assert job_spec["backoffLimit"] == 0
            assert {
                "action": "FailJob",
                "onExitCodes": {"containerName": "worker", "operator": "NotIn", "values": [0]},
            } in job_spec["podFailurePolicy"]["rules"]
            assert job_spec["template"]["spec"]["restartPolicy"] == "Never"
            assert job_spec["template"]["spec"]["containers"][0]["name"] == "worker"
        elif engine == "trainjob":
            # Fail-fast is the runtime's (JobSet failurePolicy); the TrainJob has no knob.
            assert "runPolicy" not in job_spec
        else:
            assert job_spec["runPolicy"]["backoffLimit"] == 0
            assert job_spec["runPolicy"]["cleanPodPolicy"] == "Running"
            replicas = job_spec.get("pytorchReplicaSpecs") or job_spec["tfReplicaSpecs"]
            assert {r["restartPolicy"] for r in replicas.values()} == {"Never"}
        # Never a half-started job: nothing runs until the backend (or Kueue) resumes it.
        suspended = job_spec.get("suspend", job_spec.get("runPolicy", {}).get("suspend"))
        assert suspended is True


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_id", "name"),
    [
        ("j3fa9c21b0", None),
        ("j3fa9c21b0", "a" * 53),
        ("j3fa9c21b0", "x-" * 26 + "y"),
        ("0abc", None),
        ("0abc", "9lives"),
        ("j" + "0" * 62, None),
        ("j" + "0" * 62, "n" * 53),
        ("j-", None),
    ],
)
def test_names_are_dns_labels_within_the_limits(job_id, name):
    base = object_name(job_id, name)
    assert len(base) <= 50 and DNS_1035.match(base), base
    built = build(spec_of(workers=3, name=name), job_id, payload_chunks=[b"x"] * 3, gang="volcano")
    for obj in built.all():
        assert (
            DNS_1123_SUBDOMAIN.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
        )
    assert DNS_1035.match(built.dependents[-2]["metadata"]["name"])  # the Service
    # Names the controllers derive from ours: operator pods/Services, Indexed Job hostnames.
    for derived in (f"{base}-worker-99999", f"{base}-master-0", f"{base}-99999"):
        assert len(derived) <= 63 and DNS_1035.match(derived), derived


def test_truncated_names_stay_distinct_and_readable():
    a = object_name("j3fa9c21b0", "a" * 53)
    b = object_name("j3fa9c21b1", "a" * 53)
    assert a != b and a.endswith("-j3fa9c21b0") and a.startswith("aaaa")
    long_a = object_name("j" + "0" * 62)
    long_b = object_name("j" + "0" * 61 + "1")
    assert long_a != long_b


def test_label_values_are_valid_and_distinct():
    users = [
        "alice",
        "alice@example.com",
        "alice-example.com",
        "Bob Smith",
        "",
        "-x-",
        "ü" * 40,
        "a" * 64,
        "a" * 63,
    ]
    values = [label_value(u) for u in users]
    assert values[0] == "alice" and values[2] == "alice-example.com" and values[-1] == "a" * 63
    assert len(set(values)) == len(values)
    for value in values:
        assert LABEL_VALUE.match(value) and len(value) <= 63, value
    assert label_value("alice@example.com") == values[1]  # deterministic


# --- payload ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_payload() -> bytes:
    # Incompressible, the worst case (pickled float arrays barely compress either).
    return os.urandom(50 * 2**20)


def test_50_mib_payload_travels_in_secrets_and_comes_back_exactly(big_payload, tmp_path):
    chunks = split_payload(big_payload)
    assert len(chunks) > 60
    assert all(0 < len(c) <= CHUNK_SIZE for c in chunks)
    assert join_payload(chunks) == big_payload
    built = build(spec_of(workers=2), "jbig", payload_chunks=chunks)
    secrets = [o for o in built.dependents if o["kind"] == "Secret"]
    assert len(secrets) == len(chunks)
    for secret in secrets[:2] + secrets[-1:]:
        validate_builtin(secret)
    for secret in secrets:
        (value,) = secret["data"].values()
        assert len(base64.b64decode(value)) <= 1024 * 1024  # the API server's MaxSecretSize
        assert len(json.dumps(secret)) < 1536 * 1024  # etcd's default request limit
    # What the kubelet does: each projected source puts its key at its path in one directory.
    volume = built.job["spec"]["template"]["spec"]["volumes"][0]
    assert volume["name"] == "payload" and len(volume["projected"]["sources"]) == len(chunks)
    by_name = {s["metadata"]["name"]: s for s in secrets}
    for source in volume["projected"]["sources"]:
        secret = by_name[source["secret"]["name"]]
        (item,) = source["secret"]["items"]
        (tmp_path / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
    # What the runtime does with MLCLUSTER_PAYLOAD: concatenate the chunk files in name order.
    files = sorted(p for p in tmp_path.iterdir() if p.name.startswith("payload-"))
    assert zlib.decompress(b"".join(p.read_bytes() for p in files)) == big_payload


def test_small_and_empty_payloads_give_one_chunk():
    assert join_payload(split_payload(b"")) == b""
    code = b"import torch\nprint(torch.distributed.get_rank())\n" * 1000
    chunks = split_payload(code)
    assert len(chunks) == 1 and len(chunks[0]) < len(code) // 10
    assert join_payload(chunks) == code


@pytest.mark.slow
def test_too_large_payload_is_refused_with_a_clear_message():
    # 1 MiB of noise repeated: zlib only looks 32 KiB back, so it cannot compress this either.
    data = os.urandom(2**20) * (MAX_COMPRESSED_BYTES // 2**20 + 1)
    with pytest.raises(
        PayloadTooLarge, match=r"\(97.0 MiB\) are more than 96 MiB after compression"
    ):
        split_payload(data)


def test_builder_refuses_an_empty_chunk_list():
    with pytest.raises(ValueError, match="payload_chunks"):
        build(payload_chunks=[])


# --- bad requests -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "kwargs", "message"),
    [
        ({"framework": "pytorch"}, {"engine": "tfjob"}, "TFJob runs --framework tensorflow only"),
        ({"framework": "tensorflow"}, {"engine": "pytorchjob"}, "not a PyTorchJob"),
        ({}, {"engine": "mpijob"}, "engine must be one of"),
        ({}, {"engine": "indexed-job", "gang": "yunikorn"}, "gang scheduler must be one of"),
        ({}, {"engine": "indexed-job", "gang": "training-operator"}, "needs its CRDs"),
        ({}, {"engine": "indexed-job", "gang": "kueue"}, "Kueue needs a queue"),
        (
            {"queue": "Team A"},
            {"engine": "indexed-job", "gang": "kueue"},
            "queue must be a Kubernetes object name",
        ),
        (
            {"env": {"TORCHELASTIC_MAX_RESTARTS": "3"}},
            {"engine": "indexed-job"},
            "TORCHELASTIC_MAX_RESTARTS is set by mlcluster",
        ),
        ({"workers": 6}, {"engine": "pytorchjob", "ranks_per_pod": 4}, "must divide workers"),
        (
            {"workers": 4},
            {"engine": "indexed-job", "ranks_per_pod": 2},
            "needs a TrainJob or a PyTorchJob",
        ),
        ({"cpus": 0.0001}, {"engine": "indexed-job"}, "at least 0.001"),
    ],
)
def test_requests_the_builders_cannot_express_fail_clearly(options, kwargs, message):
    spec = spec_of(**options)
    with pytest.raises(SpecError, match=re.escape(message)):
        build(spec, **kwargs)


# --- owners, resume, ranks --------------------------------------------------------------


def test_with_owner_sets_a_blocking_controller_reference_on_a_copy():
    built = build(
        spec_of(workers=2),
        engine="indexed-job",
    )
    created = copy.deepcopy(built.job)
    created["metadata"]["uid"] = "6f1c-uid"
    secret = built.dependents[0]
    owned = with_owner(secret, created)
    assert owned["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "j1",
            "uid": "6f1c-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert "ownerReferences" not in secret["metadata"]
    validate_manifest(owned)
    validate_manifest(with_owner(built.dependents[1], created))  # the Service
    with pytest.raises(ValueError, match="uid"):
        with_owner(secret, built.job)  # not created yet: no uid


@pytest.mark.parametrize(
    ("engine", "labels", "annotations", "ranks_per_pod", "expected"),
    [
        ("indexed-job", {"batch.kubernetes.io/job-completion-index": "3"}, {}, 1, [3]),
        ("indexed-job", {}, {"batch.kubernetes.io/job-completion-index": "5"}, 1, [5]),
        (
            "pytorchjob",
            {
                "training.kubeflow.org/replica-type": "master",
                "training.kubeflow.org/replica-index": "0",
            },
            {},
            1,
            [0],
        ),
        (
            "pytorchjob",
            {
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "2",
            },
            {},
            1,
            [3],
        ),
        (
            "pytorchjob",
            {
                "training.kubeflow.org/replica-type": "Worker",
                "training.kubeflow.org/replica-index": "0",
            },
            {},
            4,
            [4, 5, 6, 7],
        ),
        (
            "tfjob",
            {
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "1",
            },
            {},
            1,
            [1],
        ),
        (
            "tfjob",
            {
                "training.kubeflow.org/replica-type": "ps",
                "training.kubeflow.org/replica-index": "0",
            },
            {},
            1,
            [],
        ),
        ("pytorchjob", {"app": "other"}, {}, 1, []),
        ("indexed-job", {"batch.kubernetes.io/job-completion-index": "x"}, {}, 1, []),
    ],
)
def test_pod_ranks(engine, labels, annotations, ranks_per_pod, expected):
    pod = {"metadata": {"labels": labels, "annotations": annotations}}
    assert pod_ranks(pod, engine, ranks_per_pod) == expected


def test_attempt_is_visible_to_the_ranks():
    spec = spec_of(workers=2, max_restarts=3)
    built = build(
        spec,
        engine="indexed-job",
        attempt=2,
    )
    env = built.job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TORCHELASTIC_RESTART_COUNT", "value": "2"} in env
    assert {"name": "TORCHELASTIC_MAX_RESTARTS", "value": "3"} in env
    assert built.job["metadata"]["annotations"]["mlcluster.io/attempt"] == "2"


# --- RBAC -------------------------------------------------------------------------------


def test_notebook_role_is_exactly_this():
    assert rbac.job_runner_role("team-a") == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": "mlcluster-jobs",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "jupyterlab-mlcluster"},
        },
        "rules": [
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainjobs"],
                "verbs": ["create", "get", "list", "watch", "patch", "delete"],
            },
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainjobs/finalizers"],
                "verbs": ["update"],
            },
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainingruntimes"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["pytorchjobs", "tfjobs"],
                "verbs": ["create", "get", "list", "watch", "patch", "delete"],
            },
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["pytorchjobs/finalizers", "tfjobs/finalizers"],
                "verbs": ["update"],
            },
            {
                "apiGroups": ["batch"],
                "resources": ["jobs"],
                "verbs": ["create", "get", "list", "watch", "patch", "delete"],
            },
            {"apiGroups": ["batch"], "resources": ["jobs/finalizers"], "verbs": ["update"]},
            {
                "apiGroups": [""],
                "resources": ["services"],
                "verbs": ["create", "get", "list", "watch", "patch", "delete"],
            },
            {
                "apiGroups": ["scheduling.volcano.sh"],
                "resources": ["podgroups"],
                "verbs": ["create", "get", "list", "watch", "patch", "delete"],
            },
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["events.k8s.io"],
                "resources": ["events"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["workloads", "localqueues"],
                "verbs": ["get", "list", "watch"],
            },
            {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
        ],
    }
    assert rbac.job_runner_role_binding("team-a", "default-editor") == {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": "mlcluster-jobs-default-editor",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "jupyterlab-mlcluster"},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "mlcluster-jobs",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "default-editor", "namespace": "team-a"}],
    }


def test_role_covers_every_kind_the_builders_make():
    """Each kind a job creates can be created and deleted; nothing cluster-wide, no wildcards."""
    allowed = {
        (group, resource): set(rule["verbs"])
        for rule in rbac.job_runner_role("n")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    plural = {
        "TrainJob": "trainjobs",
        "PyTorchJob": "pytorchjobs",
        "TFJob": "tfjobs",
        "Job": "jobs",
        "Service": "services",
        "Secret": "secrets",
        "PodGroup": "podgroups",
    }
    for engine, gang, spec in all_combinations():
        built = build(
            spec,
            engine=engine,
            gang=gang,
        )
        for obj in built.all():
            group = obj["apiVersion"].rpartition("/")[0]
            assert {"create", "delete"} <= allowed[(group, plural[obj["kind"]])], obj["kind"]
        job_group = built.job["apiVersion"].rpartition("/")[0]
        job_resource = plural[built.job["kind"]]
        assert {"get", "list", "watch", "patch"} <= allowed[(job_group, job_resource)]
        assert allowed[(job_group, f"{job_resource}/finalizers")] == {"update"}
    assert all("*" not in key and "*" not in verbs for key, verbs in allowed.items())
    assert allowed[("", "secrets")] == {"create", "delete"}  # never read back


def test_deploy_rbac_is_generated_from_the_builders(capsys):
    rbac.main([])
    generated = capsys.readouterr().out
    committed = (REPO / "deploy" / "notebook-rbac.yaml").read_text()
    assert committed == generated, "regenerate deploy/notebook-rbac.yaml (see deploy/README.md)"
    docs = [d for d in yaml.safe_load_all(committed) if d]
    assert [d["kind"] for d in docs] == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ]
    for doc in docs:
        validate_builtin(doc)


@pytest.mark.parametrize(
    ("framework", "served", "expected"),
    [
        ("pytorch", {"PyTorchJob", "TFJob"}, "pytorchjob"),
        ("jax", {"PyTorchJob"}, "pytorchjob"),
        ("none", set(), "indexed-job"),
        ("tensorflow", {"PyTorchJob", "TFJob"}, "tfjob"),
        ("tensorflow", {"PyTorchJob"}, "indexed-job"),
        ("pytorch", {"TFJob"}, "indexed-job"),
    ],
)
def test_choose_engine(framework, served, expected):
    assert choose_engine(framework, served) == expected


def test_split_packed_line():
    assert split_packed_line("[12]:loss 0.5") == (12, "loss 0.5")
    assert split_packed_line("[3]:") == (3, "")
    assert split_packed_line("W1122 torchrun warning") == (None, "W1122 torchrun warning")
    assert split_packed_line("[x]:no") == (None, "[x]:no")


def _expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion in command and args."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text
    )


@pytest.mark.slow
def test_packed_pod_command_gives_each_process_its_rank(tmp_path):
    """Run the packed pod's command as the kubelet would, with what the operator adds to
    the environment, and a stand-in for the runtime module that prints what it sees."""
    spec = spec_of(workers=4, gpus_per_worker=1, name="p")
    built = build(
        spec,
        job_id="j2",
        engine="pytorchjob",
        ranks_per_pod=2,
    )
    container = built.job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"
    ][0]
    port = reserve_port()  # held until torchrun's agent binds it (runtime/ports.py)
    env = {e["name"]: e["value"] for e in container["env"]}
    # What the operator sets for this pod if the job had one node (it is node 0 of 1 here).
    env.update(
        PET_NNODES="1",
        PET_NPROC_PER_NODE="2",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="127.0.0.1",
        PET_MASTER_PORT=str(port),
    )
    # One write per line: torchrun's --tee copies whatever a rank's file holds when it looks,
    # so a line written in pieces (print's arguments, unbuffered) can reach the log split,
    # each piece behind its own prefix ("[0]:0[0]: 0 2 2 1", seen in CI).
    (tmp_path / "standin.py").write_text(
        "import os, sys\n"
        "sys.stdout.write(' '.join(str(os.environ.get(k)) for k in ('RANK', 'LOCAL_RANK',"
        " 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MLCLUSTER_GPUS_PER_RANK')) + '\\n')\n"
    )
    command = [_expand(arg, env) for arg in container["command"]]
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert command[-1] == "jupyterlab_mlcluster.runtime.worker"
    command = [sys.executable, *command[1:-1], "standin"]
    result = subprocess.run(
        command,
        env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    seen = sorted(
        split_packed_line(line) for line in result.stdout.splitlines() if line.startswith("[")
    )
    assert seen == [(0, "0 0 2 2 1"), (1, "1 1 2 2 1")]


# --- Kubeflow Trainer v2 ----------------------------------------------------------------


def test_trainjob_is_exactly_this_and_fits_the_published_crd():
    spec = spec_of(workers=4, gpus_per_worker=1, cpus=2, timeout="90s", env={"A": "1"}, queue="q")
    built = build(
        spec,
        job_id="j9",
        engine="trainjob",
        gang="kueue",
        runtime="torch-distributed",
        ranks_per_pod=2,
        user="dana",
        namespace="team",
    )
    job = built.job
    validate_manifest(job)
    assert built.resume is None  # Kueue admits it
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert job["spec"]["suspend"] is True and job["spec"]["activeDeadlineSeconds"] == 90
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "4"},
        "limits": {"cpu": "4", "nvidia.com/gpu": "2"},
    }
    assert trainer["env"] == [{"name": "A", "value": "1"}]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    pod = node["template"]["spec"]["template"]
    assert pod["metadata"]["labels"] == {**labels_for("j9", "dana"), "mlcluster.io/attempt": "0"}
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["payload", "dshm"]
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node"
    # The Trainer refuses PET_* in trainer.env; the rendezvous comes from its PET_* variables.
    assert not any(e["name"].startswith("PET_") for e in container["env"] + trainer["env"])
    plain = build(spec_of(workers=3), engine="trainjob", runtime="torch-distributed")
    env = {
        e["name"]: e
        for e in plain.job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
            "replicatedJobs"
        ][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["MASTER_ADDR"]["value"] == "j1-node-0-0.j1"
    assert plain.resume == {"spec": {"suspend": False}}


def test_trainjob_schema_rejects_what_the_trainer_would_drop_or_refuse():
    job = build(spec_of(workers=2), engine="trainjob", runtime="torch-distributed").job
    broken = copy.deepcopy(job)
    broken["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(broken)
    broken = copy.deepcopy(job)
    pod = broken["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"
    ][0]["template"]["spec"]["template"]["spec"]
    pod["priorityClassName"] = "high"  # not a field runtimePatches allows
    with pytest.raises(jsonschema.ValidationError):
        validate_manifest(broken)


def test_trainjob_is_preferred_for_pytorch_and_jax_only():
    served = {"TrainJob", "PyTorchJob", "TFJob"}
    assert objects.choose_engine("pytorch", served) == "trainjob"
    assert objects.choose_engine("jax", served) == "trainjob"
    assert objects.choose_engine("tensorflow", served) == "tfjob"
    assert objects.choose_engine("pytorch", served, needs_priority_class=True) == "pytorchjob"
    assert objects.choose_engine("pytorch", {"PyTorchJob"}) == "pytorchjob"
    with pytest.raises(SpecError, match="TFJob or an Indexed Job"):
        check_request(spec_of(framework="tensorflow"), engine="trainjob")


def test_trainjob_pods_map_to_ranks_by_node_index():
    def pod(index, replicated="node"):
        return {
            "metadata": {
                "labels": {
                    "jobset.sigs.k8s.io/replicatedjob-name": replicated,
                    "batch.kubernetes.io/job-completion-index": str(index),
                }
            }
        }

    assert objects.pod_ranks(pod(3), "trainjob") == [3]
    assert objects.pod_ranks(pod(1), "trainjob", ranks_per_pod=4) == [4, 5, 6, 7]
    assert objects.pod_ranks(pod(0, "dataset-initializer"), "trainjob") == []


def test_tensorboard_dir_reaches_the_ranks_only_when_named():
    def rank_env(spec):
        container = build(spec).job["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    # No default on Kubernetes: the notebook's disk is not the pods' (README "TensorBoard").
    assert "MLCLUSTER_TENSORBOARD_DIR" not in rank_env(spec_of())
    spec = spec_of(tensorboard="s3://bucket/runs/j1")
    assert rank_env(spec)["MLCLUSTER_TENSORBOARD_DIR"] == "s3://bucket/runs/j1"


@pytest.mark.parametrize(
    ("engine", "ranks_per_pod"),
    [("indexed-job", 1), ("pytorchjob", 1), ("pytorchjob", 2), ("tfjob", 1)],
)
def test_package_sync_step_wraps_the_ranks_command_on_every_engine(engine, ranks_per_pod):
    """The notebook's packages (backends/kubernetes/packages.py): the pod's command installs
    first, then becomes the rank's command (torchrun for a packed pod); the wheel cache's
    claim is mounted read-only where the notebook has it; the objects stay schema-valid."""
    from jupyterlab_mlcluster.backends.kubernetes.packages import PackageSync

    framework = "tensorflow" if engine == "tfjob" else "pytorch"
    spec = spec_of(workers=4, gpus_per_worker=ranks_per_pod - 1, framework=framework)
    sync = PackageSync(
        requirements=("tinypkg==0.1", "numpy==2.2.0"),
        index=(("PIP_INDEX_URL", "https://pypi.corp.example/simple"),),
        cache_path="/home/jovyan/team/wheels",
        cache_claim="team-rwx",
        cache_mount="/home/jovyan/team",
        cache_sub_path="ml",
        cache_hashes=(("tinypkg==0.1", ("ab" * 32,)), ("numpy==2.2.0", ("cd" * 32,))),
        cache_files=(("tinypkg==0.1", (("tinypkg-0.1-py3-none-any.whl", 1600),)),),
    )
    common = {"namespace": "ns", "image": "img", "user": "u", "payload_chunks": [b"x"]}
    common["engine"] = engine
    built = build_job_objects("j7", spec, ranks_per_pod=ranks_per_pod, packages=sync, **common)
    plain = build_job_objects("j7", spec, ranks_per_pod=ranks_per_pod, **common)
    for obj in built.all():
        validate_manifest(obj)

    def pod_of(job):
        if job["kind"] == "Job":
            return job["spec"]["template"]["spec"]
        replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["tfReplicaSpecs"]
        return next(iter(replicas.values()))["template"]["spec"]

    pod, before = pod_of(built.job), pod_of(plain.job)
    (container,), (original,) = pod["containers"], before["containers"]
    assert container["command"] == [
        "python",
        "-m",
        "jupyterlab_mlcluster.runtime.sync_packages",
        *original["command"],
    ]
    assert container["env"][: len(original["env"])] == original["env"]
    assert container["env"][len(original["env"]) :] == [
        {"name": "MLCLUSTER_SYNC_PACKAGES", "value": '["tinypkg==0.1", "numpy==2.2.0"]'},
        {"name": "PIP_INDEX_URL", "value": "https://pypi.corp.example/simple"},
        {"name": "MLCLUSTER_WHEEL_CACHE", "value": "/home/jovyan/team/wheels"},
        {
            "name": "MLCLUSTER_WHEEL_HASHES",
            "value": json.dumps({"tinypkg==0.1": ["ab" * 32], "numpy==2.2.0": ["cd" * 32]}),
        },
        {
            "name": "MLCLUSTER_WHEEL_FILES",
            "value": json.dumps({"tinypkg==0.1": [["tinypkg-0.1-py3-none-any.whl", 1600]]}),
        },
    ]
    assert PackageSync.from_dict(sync.to_dict()) == sync
    assert container["volumeMounts"][-1] == {
        "name": "wheel-cache",
        "mountPath": "/home/jovyan/team",
        "readOnly": True,
        "subPath": "ml",
    }
    assert pod["volumes"][-1] == {
        "name": "wheel-cache",
        "persistentVolumeClaim": {"claimName": "team-rwx", "readOnly": True},
    }
    # No cache claim: the index only, nothing mounted.
    no_cache = build_job_objects(
        "j7", spec, ranks_per_pod=ranks_per_pod, packages=PackageSync(("tinypkg==0.1",)), **common
    )
    (container,) = pod_of(no_cache.job)["containers"]
    assert not {"MLCLUSTER_WHEEL_CACHE", "MLCLUSTER_WHEEL_HASHES", "MLCLUSTER_WHEEL_FILES"} & {
        e["name"] for e in container["env"]
    }
    assert len(pod_of(no_cache.job)["volumes"]) == len(before["volumes"])
    # A user --env cannot pose as the step's variables.
    with pytest.raises(SpecError, match="MLCLUSTER_SYNC_PACKAGES"):
        build_job_objects(
            "j7",
            spec_of(workers=4, env=['MLCLUSTER_SYNC_PACKAGES=["evil"]']),
            packages=sync,
            **{**common, "engine": "indexed-job"},
        )
