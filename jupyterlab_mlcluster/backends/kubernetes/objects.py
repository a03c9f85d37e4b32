"""Kubernetes manifests for one job, as pure functions: dicts in, dicts out, no API calls.

The backend beside this module talks to the API server; everything it creates is built
here (`build_job_objects`) from the builders beside it, so the shapes can be unit-tested
against literal dicts and the Kubernetes schemas: request.py checks what a job asks for,
names.py names and labels its objects, pod.py builds the pod template every rank runs,
workloads.py the objects around it (trainjob.py a TrainJob). Their names are re-exported
here, where the backend's readers import them.

How a job is created (`build_job_objects` returns a `JobObjects`):
1. the job object (PyTorchJob, TFJob or Indexed Job), always *suspended*, so no pod exists
   before everything it mounts or resolves exists;
2. its dependents (payload Secrets, headless Service, Volcano PodGroup), each passed through
   `with_owner(obj, created_job)` first, so deleting the job object (foreground propagation)
   removes every one of them and a crash half-way leaves one root to delete, never orphans;
3. the `resume` merge patch on the job object, unless Kueue is the gang scheduler (then
   Kueue lifts the suspension when it admits the whole job; should that happen before the
   Secrets exist, the kubelet retries the volume mount until they do).

Rules worth knowing:
- One rank per pod by default, so pod states, logs and exit codes are per-rank. A rank owns
  `gpus_per_worker` GPUs on every backend; `--workers` is always the world size.
  `ranks_per_pod` > 1 (PyTorchJob only; see `choose_ranks_per_pod`) packs several ranks into
  one pod that runs torchrun with `nprocPerNode` = ranks_per_pod: fewer, whole-node pods,
  NCCL over NVLink inside a node, one image pull per node.
- Fail fast: a failing rank fails the job and the others are stopped (restartPolicy Never,
  backoffLimit 0, podFailurePolicy FailJob; cleanPodPolicy Running for the operator).
  `max_restarts` means whole-job restarts, as on the local backend: one rank cannot rejoin a
  static process group, so per-pod retries would only wait for collective timeouts. The
  backend re-creates the objects with `attempt` + 1 instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from ...jobs.model import JobSpec, SpecError
from .labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_NAME,
    ANNOTATION_USER,
    COMPLETION_INDEX_KEY,
    KUEUE_QUEUE_LABEL,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
)
from .names import job_labels, job_selector, label_value, object_metadata, object_name, with_owner
from .packages import PackageSync
from .pod import (
    PAYLOAD_VOLUME,
    TRAINJOB_CONTAINER,
    container_name,
    payload_secret_prefix,
    pod_resources,
    pod_template,
)
from .request import ENGINES, GANGS, check_request, choose_engine, choose_ranks_per_pod
from .workloads import (
    headless_service,
    indexed_job,
    payload_secrets,
    pod_group,
    pytorch_job,
    resume_patch,
    run_policy,
    tf_job,
)

__all__ = [  # what the backend's readers, the export and the tests import from here
    "ANNOTATION_ATTEMPT",
    "ENGINES",
    "GANGS",
    "LABEL_MANAGED_BY",
    "MANAGED_BY",
    "PAYLOAD_VOLUME",
    "TRAINJOB_CONTAINER",
    "JobObjects",
    "build_job_objects",
    "check_request",
    "choose_engine",
    "choose_ranks_per_pod",
    "container_name",
    "job_selector",
    "label_value",
    "object_name",
    "pod_group",
    "pod_ranks",
    "pod_template",
    "pytorch_job",
    "run_policy",
    "split_packed_line",
    "with_owner",
]

# torchrun prefixes every line of a packed pod's log with the global rank (pod.py sets the
# template).
_PACKED_LOG_PREFIX_RE = re.compile(r"^\[(\d+)\]:")


@dataclasses.dataclass(frozen=True)
class JobObjects:
    """Everything one job needs, in creation order (see the module docstring)."""

    job: dict[str, Any]
    dependents: list[dict[str, Any]]
    resume: dict[str, Any] | None  # merge patch for the job object; None: Kueue resumes it

    def all(self) -> list[dict[str, Any]]:
        return [self.job, *self.dependents]


def build_job_objects(
    job_id: str,
    spec: JobSpec,
    *,
    namespace: str,
    image: str,
    user: str,
    payload_chunks: Sequence[bytes],
    engine: str,
    gang: str = "none",
    queue: str | None = None,
    priority_class: str | None = None,
    service_account: str | None = None,
    ranks_per_pod: int = 1,
    attempt: int = 0,
    report_key: bytes | None = None,
    runtime: str | None = None,
    packages: PackageSync | None = None,
    grace: float | None = None,
) -> JobObjects:
    """All objects of one job. `queue` is the default when the spec names none;
    `priority_class` a PriorityClass name the backend chose for `spec.priority`;
    `report_key` the job's record key: it travels in the first payload Secret, and the
    Secrets get names derived from it (`payload_secret_prefix`).
    `runtime` the Trainer runtime of a TrainJob; `packages` what the pods install first.
    """
    check_request(spec, engine=engine, gang=gang, queue=queue, ranks_per_pod=ranks_per_pod)
    if not payload_chunks:
        raise ValueError("payload_chunks is empty: use split_payload(), which always gives one")
    chosen_queue = (spec.queue or queue) if gang != "none" else None
    name = object_name(job_id, spec.name)
    labels = job_labels(job_id, user)
    pods = spec.workers // ranks_per_pod
    prefix = name if report_key is None else payload_secret_prefix(name, report_key, attempt)
    template = pod_template(
        job_id,
        spec,
        engine=engine,
        name=name,
        image=image,
        labels=labels,
        chunk_count=len(payload_chunks),
        gang=gang,
        priority_class=priority_class,
        service_account=service_account,
        ranks_per_pod=ranks_per_pod,
        attempt=attempt,
        payload_prefix=prefix,
        with_key=report_key is not None,
        packages=packages,
        grace=grace,
    )
    job_labels_ = dict(labels)
    if gang == "kueue" and chosen_queue:  # always named: check_request refused no queue
        job_labels_[KUEUE_QUEUE_LABEL] = chosen_queue
    annotations = {ANNOTATION_USER: user, ANNOTATION_ATTEMPT: str(attempt)}
    if spec.name:
        annotations[ANNOTATION_NAME] = spec.name
    metadata = object_metadata(name, namespace, job_labels_, annotations)

    if engine == "trainjob":
        from .trainjob import train_job

        if priority_class:
            raise SpecError("a TrainJob cannot set a PriorityClass (its runtime does)")
        if not runtime:
            raise ValueError("a TrainJob needs the name of its runtime")
        job = train_job(
            spec,
            metadata=object_metadata(name, namespace, labels, annotations),
            template=template,
            runtime=runtime,
            gang=gang,
            queue=chosen_queue,
            ranks_per_pod=ranks_per_pod,
            attempt=attempt,
        )
        dependents = payload_secrets(prefix, namespace, payload_chunks, labels, report_key)
        # Volcano: the runtime's podGroupPolicy makes the PodGroup; Kueue resumes it.
        return JobObjects(
            job=job, dependents=dependents, resume=None if gang == "kueue" else resume_patch(engine)
        )
    if engine == "indexed-job":
        job = indexed_job(metadata, template, spec)
    else:
        policy = run_policy(
            spec, gang=gang, pods=pods, queue=chosen_queue, priority_class=priority_class
        )
        if engine == "pytorchjob":
            job = pytorch_job(metadata, template, policy, pods=pods, ranks_per_pod=ranks_per_pod)
        else:
            job = tf_job(metadata, template, policy, workers=spec.workers)

    dependents = payload_secrets(prefix, namespace, payload_chunks, labels, report_key)
    if engine == "indexed-job":
        dependents.append(headless_service(name, namespace, labels))
    if gang == "volcano":
        dependents.append(
            pod_group(
                name,
                namespace,
                labels,
                pods=pods,
                # What all ranks together hold, so Volcano enqueues only a job that fits.
                min_resources=pod_resources(spec, spec.workers)["limits"],
                queue=chosen_queue,
                priority_class=priority_class,
            )
        )
    resume = None if gang == "kueue" else resume_patch(engine)
    return JobObjects(job=job, dependents=dependents, resume=resume)


# --- reading back -----------------------------------------------------------------------


def pod_ranks(pod: dict[str, Any], engine: str, ranks_per_pod: int = 1) -> list[int]:
    """The ranks a pod of this job runs (from the labels its controller set); [] if unknown."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if engine == "trainjob":
        from .trainjob import pod_node

        node = pod_node(pod)
        return [] if node is None else list(range(node * ranks_per_pod, (node + 1) * ranks_per_pod))
    try:
        if engine == "indexed-job":
            index = (
                labels.get(COMPLETION_INDEX_KEY)
                or (meta.get("annotations") or {})[COMPLETION_INDEX_KEY]
            )
            return [int(index)]
        replica_type = labels[REPLICA_TYPE_LABEL].lower()
        index = int(labels[REPLICA_INDEX_LABEL])
    except (KeyError, ValueError):
        return []
    if engine == "tfjob":
        return [index] if replica_type == "worker" else []
    node = {"master": 0, "worker": index + 1}.get(replica_type)
    if node is None:
        return []
    return list(range(node * ranks_per_pod, (node + 1) * ranks_per_pod))


def split_packed_line(line: str) -> tuple[int | None, str]:
    """A log line of a packed pod -> (rank, text); (None, line) for torchrun's own lines."""
    match = _PACKED_LOG_PREFIX_RE.match(line)
    if not match:
        return None, line
    return int(match.group(1)), line[match.end() :]
