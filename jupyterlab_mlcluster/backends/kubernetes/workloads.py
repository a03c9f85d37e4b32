"""The objects around a job's pod template, one builder per kind: the job object
(PyTorchJob, TFJob or Indexed Job; a TrainJob is trainjob.py's), its payload Secrets, the
Indexed Job's headless Service, Volcano's PodGroup. Pure: dicts in, dicts out."""

from __future__ import annotations

import base64
import copy
import math
from collections.abc import Sequence
from typing import Any

from ...jobs.model import JobSpec
from ...runtime.protocol import KEY_FILE
from .labels import LABEL_JOB_ID
from .names import object_metadata
from .payload import chunk_name
from .pod import INDEXED_CONTAINER


def payload_secrets(
    prefix: str,
    namespace: str,
    chunks: Sequence[bytes],
    labels: dict[str, str],
    report_key: bytes | None = None,
) -> list[dict[str, Any]]:
    """One immutable Secret per chunk: `<prefix>-payload-000` with key `payload-000`; the
    first also holds the job's record key (`report-key`, runtime/protocol.py) when given.

    Immutable: the kubelet does not watch them, and nobody can swap the code under a job.
    """
    secrets = []
    for i, chunk in enumerate(chunks):
        data = {chunk_name(i): base64.b64encode(chunk).decode("ascii")}
        if report_key is not None and i == 0:
            data[KEY_FILE] = base64.b64encode(report_key).decode("ascii")
        secrets.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": object_metadata(f"{prefix}-{chunk_name(i)}", namespace, labels),
                "type": "Opaque",
                "immutable": True,
                "data": data,
            }
        )
    return secrets


def headless_service(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    """Stable DNS `<name>-<index>.<name>` for every Indexed Job pod (its hostname.subdomain).

    publishNotReadyAddresses: rank 0 must resolve as soon as it has an IP, before any
    readiness; clusterIP None: DNS answers with pod IPs, no proxying.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(name, namespace, labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB_ID: labels[LABEL_JOB_ID]},
        },
    }


def pod_group(
    name: str,
    namespace: str,
    labels: dict[str, str],
    *,
    pods: int,
    min_resources: dict[str, str],
    queue: str | None,
    priority_class: str | None,
) -> dict[str, Any]:
    """Volcano PodGroup: none of the pods is bound until all `pods` can be (minMember).

    Named like the job, as the Training Operator names its own, so an operator running with
    Volcano gang scheduling updates this one instead of making a second.
    """
    spec: dict[str, Any] = {"minMember": pods, "minResources": dict(min_resources)}
    if queue:
        spec["queue"] = queue
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": object_metadata(name, namespace, labels),
        "spec": spec,
    }


def run_policy(
    spec: JobSpec, *, gang: str, pods: int, queue: str | None, priority_class: str | None
) -> dict[str, Any]:
    """Training Operator runPolicy: fail fast, deadline, gang, created suspended."""
    policy: dict[str, Any] = {
        # Running: stop the other ranks when one fails; finished pods stay for their logs
        # until the job object is deleted.
        "cleanPodPolicy": "Running",
        "backoffLimit": 0,
        "suspend": True,
    }
    if spec.timeout:
        policy["activeDeadlineSeconds"] = math.ceil(spec.timeout)
    if gang in ("volcano", "training-operator"):
        scheduling: dict[str, Any] = {"minAvailable": pods}
        if queue:
            scheduling["queue"] = queue
        if priority_class:
            scheduling["priorityClass"] = priority_class
        policy["schedulingPolicy"] = scheduling
    return policy


def _replica(replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    return {"replicas": replicas, "restartPolicy": "Never", "template": copy.deepcopy(template)}


def pytorch_job(
    metadata: dict[str, Any],
    template: dict[str, Any],
    policy: dict[str, Any],
    *,
    pods: int,
    ranks_per_pod: int,
) -> dict[str, Any]:
    """Master (pod 0, rank 0) + Worker (the other pods); the operator wires the rendezvous."""
    replicas = {"Master": _replica(1, template)}
    if pods > 1:
        replicas["Worker"] = _replica(pods - 1, template)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            "nprocPerNode": str(ranks_per_pod),
            "runPolicy": policy,
            "pytorchReplicaSpecs": replicas,
        },
    }


def tf_job(
    metadata: dict[str, Any], template: dict[str, Any], policy: dict[str, Any], *, workers: int
) -> dict[str, Any]:
    """Worker-only TFJob: the same TF_CONFIG shape (workers only, worker 0 is the chief for
    MultiWorkerMirroredStrategy) as the local backend, so a cell behaves alike on both.
    AllWorkers: the job succeeds when every rank has, not when worker 0 has.
    """
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {
            "runPolicy": policy,
            "successPolicy": "AllWorkers",
            "tfReplicaSpecs": {"Worker": _replica(workers, template)},
        },
    }


def indexed_job(
    metadata: dict[str, Any], template: dict[str, Any], spec: JobSpec
) -> dict[str, Any]:
    """batch/v1 Job, one pod per rank (index = rank), failing as a whole when one rank fails."""
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.workers,
        "parallelism": spec.workers,
        "backoffLimit": 0,
        # Explicit so the Job's failure message names the failing pod and its exit code.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": INDEXED_CONTAINER,
                        "operator": "NotIn",
                        "values": [0],
                    },
                }
            ]
        },
        "suspend": True,
        "template": template,
    }
    if spec.timeout:
        job_spec["activeDeadlineSeconds"] = math.ceil(spec.timeout)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def resume_patch(engine: str) -> dict[str, Any]:
    """Merge patch that lets a suspended job object start its pods."""
    if engine in ("indexed-job", "trainjob"):
        return {"spec": {"suspend": False}}
    return {"spec": {"runPolicy": {"suspend": False}}}
