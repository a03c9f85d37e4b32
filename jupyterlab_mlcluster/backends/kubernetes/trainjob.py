"""Kubeflow Trainer v2 `TrainJob` (`trainer.kubeflow.org/v1alpha1`): a pure builder.

A TrainJob names a runtime (a `ClusterTrainingRuntime` such as `torch-distributed`) that
holds the JobSet template; the Trainer turns the two into a JobSet whose `node` replicated
job runs one pod per training node. What we add to the runtime's pod goes through
`spec.runtimePatches` (the v2.3 CRD's mechanism; there is no pod template in a TrainJob):
the payload volume and its mount, /dev/shm, the rank variables, the job's labels.

How it maps onto mlcluster's model:
- ranks = numNodes x numProcPerNode: one rank per pod unless `ranks_per_pod` > 1 (GPUs
  per node declared), then torchrun in each pod with the `PET_*` variables the Trainer's
  torch plugin sets, as for a packed PyTorchJob;
- pod `<trainjob>-node-0-<index>` runs node `index` (`batch.kubernetes.io/job-completion-index`);
  rank 0's pod is `<trainjob>-node-0-0.<trainjob>` (JobSet's headless Service), port 29500:
  where the Trainer points `PET_MASTER_ADDR`/`PET_MASTER_PORT` too (objects.rank_environment);
- created suspended (`spec.suspend`), resumed once its owned Secrets exist, unless Kueue
  admits it (label `kueue.x-k8s.io/queue-name`);
- `--timeout` -> `spec.activeDeadlineSeconds`.

The Trainer's own pod-level knobs that runtimePatches cannot set (priorityClassName,
schedulerName) belong to the runtime: a job that needs a PriorityClass runs on another
engine (`choose_engine`).
"""

from __future__ import annotations

import math
from typing import Any

from ...jobs.model import JobSpec
from .labels import ANNOTATION_ATTEMPT, COMPLETION_INDEX_KEY, KUEUE_QUEUE_LABEL

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
# The replicated job and container every upstream runtime (torch-, jax-distributed) names.
NODE = "node"
PATCH_MANAGER = "mlcluster.io/jupyterlab-mlcluster"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"

# Labels JobSet and the Job controller put on every pod of a TrainJob.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
# Ours, on each pod (through runtimePatches): which attempt made it. A TrainJob's pods are
# owned by a Job owned by a JobSet, not by the TrainJob, so ownership cannot tell.
ATTEMPT_LABEL = ANNOTATION_ATTEMPT


def train_job(
    spec: JobSpec,
    *,
    metadata: dict[str, Any],
    template: dict[str, Any],
    runtime: str,
    gang: str = "none",
    queue: str | None = None,
    ranks_per_pod: int = 1,
    attempt: int = 0,
) -> dict[str, Any]:
    """The TrainJob of one attempt (always created suspended; see the module docstring).

    `template` is the pod template every other engine runs (objects.pod_template, engine
    'trainjob'): its image, command and resources become `trainer`; the user's --env
    `trainer.env`; what else its container and pod carry (our variables, the payload volume
    and mounts, service account, labels) goes in through `runtimePatches`. Pod-spec fields
    runtimePatches does not allow (automountServiceAccountToken, enableServiceLinks) are the
    runtime's."""
    (container,) = template["spec"]["containers"]
    user_env = set(spec.env)
    trainer: dict[str, Any] = {
        "image": container["image"],
        "command": container["command"],
        "numNodes": spec.workers // ranks_per_pod,
        "numProcPerNode": ranks_per_pod,
        "resourcesPerNode": container["resources"],
    }
    # The Trainer merges these into the runtime's container (and refuses PET_* here).
    trainer_env = [e for e in container["env"] if e["name"] in user_env]
    if trainer_env:
        trainer["env"] = trainer_env
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": NODE,
                "env": [e for e in container["env"] if e["name"] not in user_env],
                "volumeMounts": container["volumeMounts"],
            }
        ],
        "volumes": template["spec"]["volumes"],
    }
    if template["spec"].get("serviceAccountName"):
        pod_spec["serviceAccountName"] = template["spec"]["serviceAccountName"]
    pod_meta = {
        **template["metadata"],
        "labels": {**template["metadata"]["labels"], ATTEMPT_LABEL: str(attempt)},
    }
    pod_patch = {"metadata": pod_meta, "spec": pod_spec}
    job_spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": runtime,
        },
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {"name": NODE, "template": {"spec": {"template": pod_patch}}}
                            ]
                        }
                    }
                },
            }
        ],
        "suspend": True,
    }
    if spec.timeout:
        job_spec["activeDeadlineSeconds"] = math.ceil(spec.timeout)
    meta = {**metadata, "labels": dict(metadata.get("labels") or {})}
    if gang == "kueue" and queue:
        meta["labels"][KUEUE_QUEUE_LABEL] = queue
    if gang == "volcano" and queue:
        meta["annotations"] = {**meta.get("annotations", {}), VOLCANO_QUEUE_ANNOTATION: queue}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": job_spec}


def resume_patch() -> dict[str, Any]:
    return {"spec": {"suspend": False}}


def pod_node(pod: dict[str, Any]) -> int | None:
    """The training node a TrainJob pod runs (its completion index in the `node` job)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(REPLICATED_JOB_LABEL) != NODE:
        return None  # an initializer's pod, or not a JobSet pod at all
    index = labels.get(COMPLETION_INDEX_KEY) or (meta.get("annotations") or {}).get(
        COMPLETION_INDEX_KEY
    )
    if index is None:
        return None
    try:
        return int(index)
    except (TypeError, ValueError):
        return None


def runtime_missing_message(runtime: str, available: list[str], framework: str) -> str:
    have = ", ".join(sorted(available)) if available else "none"
    return (
        f"the Kubeflow Trainer runtime {runtime!r} (ClusterTrainingRuntime) for --framework "
        f"{framework} does not exist in this cluster; it has: {have}. Set "
        "MLClusterConfig.kubernetes_trainer_runtimes to one of them, or "
        "MLClusterConfig.kubernetes_engine to another engine"
    )
