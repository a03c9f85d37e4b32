"""Where and how one job runs on Kubernetes, decided once at submit: the `JobPlan`.

Made in the submitting process (`KubernetesBackend.prepare`), stored with the job
(`backend_state`), read by the job's supervisor, which builds the objects from it. Pure:
the facts it needs from the cluster (served kinds, the notebook's image) are arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...jobs.model import JobSpec, SpecError
from .objects import (
    JobObjects,
    build_job_objects,
    check_request,
    choose_engine,
    choose_ranks_per_pod,
)
from .packages import PackageSync

# engine -> (apiVersion, kind) of the job object
JOB_KINDS = {
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
    "tfjob": ("kubeflow.org/v1", "TFJob"),
    "indexed-job": ("batch/v1", "Job"),
}


@dataclasses.dataclass(frozen=True)
class JobPlan:
    namespace: str
    image: str
    engine: str
    gang: str
    queue: str | None = None
    priority_class: str | None = None
    service_account: str | None = None
    ranks_per_pod: int = 1
    runtime: str | None = None  # the Trainer runtime of a TrainJob
    # What the notebook added to its image, installed in each pod first (packages.py)
    packages: dict[str, Any] | None = None

    @property
    def api_version(self) -> str:
        return JOB_KINDS[self.engine][0]

    @property
    def kind(self) -> str:
        return JOB_KINDS[self.engine][1]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobPlan:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def make_plan(
    spec: JobSpec,
    *,
    namespace: str,
    served_kinds: Collection[str],
    notebook_image: str | None,
    engine_setting: str = "auto",
    gang: str = "none",
    default_image: str = "",
    default_queue: str = "",
    priority_classes: Mapping[str, str] | None = None,
    service_account: str = "",
    gpus_per_node: int = 0,
    trainer_runtimes: Mapping[str, str] | None = None,
) -> JobPlan:
    """Decide engine, image, gang, queue, priority class and packing; SpecError (with the
    setting to change) for anything that cannot work."""
    priority_class = None
    if spec.priority:
        priority_class = (priority_classes or {}).get(str(spec.priority))
        if not priority_class:
            raise SpecError(
                f"--priority {spec.priority}: no PriorityClass is configured for it "
                "(MLClusterConfig.kubernetes_priority_classes maps priorities to PriorityClass "
                "names)"
            )
    engine = (
        choose_engine(spec.framework, served_kinds, needs_priority_class=bool(priority_class))
        if engine_setting == "auto"
        else engine_setting
    )
    if engine == "trainjob" and "TrainJob" not in served_kinds:
        raise SpecError(
            "MLClusterConfig.kubernetes_engine is 'trainjob', but this cluster does not serve "
            "TrainJob (trainer.kubeflow.org): is Kubeflow Trainer v2 installed?"
        )
    if engine == "trainjob" and priority_class:
        raise SpecError(
            f"--priority {spec.priority}: a TrainJob cannot set a PriorityClass (its runtime "
            "does); set MLClusterConfig.kubernetes_engine to 'pytorchjob' or 'indexed-job'"
        )
    runtime = None
    if engine == "trainjob":
        runtime = (trainer_runtimes or {}).get(spec.framework)
        if not runtime:
            raise SpecError(
                f"no Kubeflow Trainer runtime is configured for --framework {spec.framework} "
                "(MLClusterConfig.kubernetes_trainer_runtimes)"
            )
    if engine not in ("indexed-job", "trainjob") and JOB_KINDS[engine][1] not in served_kinds:
        raise SpecError(
            f"MLClusterConfig.kubernetes_engine is {engine!r}, but this cluster does not serve "
            f"{JOB_KINDS[engine][1]} (is the Kubeflow Training Operator installed?)"
        )
    image = spec.image or default_image or notebook_image
    if not image:
        raise SpecError(
            "no container image for the ranks: pass --image, or set "
            "MLClusterConfig.kubernetes_image (inside a notebook pod, the pod's own image is used)"
        )
    if gang == "volcano" and "PodGroup" not in served_kinds:
        raise SpecError(
            "MLClusterConfig.kubernetes_gang is 'volcano', but this cluster does not serve "
            "PodGroup (scheduling.volcano.sh): is Volcano installed?"
        )
    ranks_per_pod = choose_ranks_per_pod(spec, engine=engine, gpus_per_node=gpus_per_node or None)
    queue = default_queue or None
    check_request(spec, engine=engine, gang=gang, queue=queue, ranks_per_pod=ranks_per_pod)
    return JobPlan(
        namespace=namespace,
        image=image,
        engine=engine,
        gang=gang,
        queue=(spec.queue or queue) if gang != "none" else None,
        priority_class=priority_class,
        service_account=service_account or None,
        ranks_per_pod=ranks_per_pod,
        runtime=runtime,
    )


def plan_objects(
    plan: JobPlan,
    job_id: str,
    spec: JobSpec,
    *,
    user: str,
    payload_chunks: Sequence[bytes],
    attempt: int,
    report_key: bytes | None = None,
    grace: float | None = None,
) -> JobObjects:
    """The objects of one attempt of a planned job (see objects.build_job_objects)."""
    return build_job_objects(
        job_id,
        spec,
        namespace=plan.namespace,
        image=plan.image,
        user=user,
        payload_chunks=payload_chunks,
        engine=plan.engine,
        gang=plan.gang,
        queue=plan.queue,
        priority_class=plan.priority_class,
        service_account=plan.service_account,
        ranks_per_pod=plan.ranks_per_pod,
        attempt=attempt,
        report_key=report_key,
        runtime=plan.runtime,
        packages=PackageSync.from_dict(plan.packages),
        grace=grace,
    )
