"""What a Kubernetes job may ask for, checked before anything is built, and the choices
made from what the cluster serves: which engine runs it, how many ranks share a pod."""

from __future__ import annotations

import re
from collections.abc import Collection

from ...jobs.model import JobSpec, SpecError

ENGINES = ("trainjob", "pytorchjob", "tfjob", "indexed-job")
GANGS = ("none", "volcano", "kueue", "training-operator")
# Engines that can run torchrun inside a pod (several ranks per pod).
TORCHRUN_ENGINES = ("pytorchjob", "trainjob")
MAX_WORKERS = 100_000

_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Variables the builders set; a user --env of the same name would be silently overridden.
ENGINE_ENV = frozenset(
    {
        "MLCLUSTER_JOB_ID",
        "MLCLUSTER_PAYLOAD",
        "MLCLUSTER_REPORT",
        "MLCLUSTER_TF_WORKERS",
        "MLCLUSTER_GPUS_PER_RANK",
        "PYTHONUNBUFFERED",
        "JAX_COORDINATOR_ADDRESS",
        "JAX_NUM_PROCESSES",
        "JAX_PROCESS_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        "MLCLUSTER_SYNC_PACKAGES",
        "MLCLUSTER_WHEEL_CACHE",
    }
)


def check_request(
    spec: JobSpec,
    *,
    engine: str,
    gang: str = "none",
    queue: str | None = None,
    ranks_per_pod: int = 1,
) -> None:
    """Raise SpecError for a job these builders cannot express; nothing is created then."""
    if engine not in ENGINES:
        raise SpecError(f"kubernetes engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if gang not in GANGS:
        raise SpecError(f"gang scheduler must be one of {', '.join(GANGS)}, got {gang!r}")
    if engine == "tfjob" and spec.framework != "tensorflow":
        raise SpecError(f"a TFJob runs --framework tensorflow only, not {spec.framework}")
    if engine == "trainjob" and spec.framework not in ("pytorch", "jax"):
        raise SpecError(
            f"--framework {spec.framework} has no Kubeflow Trainer runtime here; it runs as a "
            "TFJob or an Indexed Job"
        )
    if engine == "pytorchjob" and spec.framework == "tensorflow":
        raise SpecError(
            "--framework tensorflow runs as a TFJob or an Indexed Job, not a PyTorchJob"
        )
    if gang == "training-operator" and engine in ("indexed-job", "trainjob"):
        raise SpecError(
            "gang scheduling through the Training Operator needs its CRDs (PyTorchJob/TFJob); "
            "use volcano or kueue for plain Jobs and TrainJobs"
        )
    if spec.workers > MAX_WORKERS:
        raise SpecError(f"workers must be at most {MAX_WORKERS} on Kubernetes, got {spec.workers}")
    if ranks_per_pod < 1 or spec.workers % ranks_per_pod:
        raise SpecError(f"ranks per pod ({ranks_per_pod}) must divide workers ({spec.workers})")
    if ranks_per_pod > 1 and engine not in TORCHRUN_ENGINES:
        raise SpecError(
            "several ranks per pod needs a TrainJob or a PyTorchJob (torchrun inside the pod)"
        )
    if round(spec.cpus * 1000) < 1:
        raise SpecError(f"cpus must be at least 0.001 on Kubernetes, got {spec.cpus}")
    clashes = sorted(set(spec.env) & ENGINE_ENV)
    if clashes:
        raise SpecError(f"env {', '.join(clashes)} is set by mlcluster and cannot be overridden")
    if spec.queue and gang == "none":
        # Without a gang scheduler nothing reads a queue: running the job unqueued would
        # ignore the option the user gave.
        raise SpecError(
            f"--queue {spec.queue}: no gang scheduler is configured to queue jobs "
            "(MLClusterConfig.kubernetes_gang is 'none'; set it to volcano, kueue or "
            "training-operator, or drop --queue)"
        )
    chosen_queue = spec.queue or queue
    if gang == "kueue" and not chosen_queue:
        raise SpecError(
            "Kueue needs a queue: pass --queue (a LocalQueue name) or configure a default"
        )
    if (
        gang != "none"
        and chosen_queue
        and (len(chosen_queue) > 63 or not _DNS_SUBDOMAIN_RE.match(chosen_queue))
    ):
        raise SpecError(
            f"queue must be a Kubernetes object name (lowercase letters, digits, '-', '.'), "
            f"got {chosen_queue!r}"
        )


def choose_engine(
    framework: str, served_kinds: Collection[str], *, needs_priority_class: bool = False
) -> str:
    """The engine for a framework, given the kinds the cluster serves (from API discovery).

    Kubeflow Trainer v2 (TrainJob) first, for the frameworks it has runtimes for, unless the
    job needs a PriorityClass (a TrainJob cannot set one; its runtime does); then the
    Training Operator (it wires the rendezvous and reports replica statuses); else a plain
    Indexed Job.
    """
    if framework in ("pytorch", "jax") and "TrainJob" in served_kinds and not needs_priority_class:
        return "trainjob"
    if framework == "tensorflow":
        return "tfjob" if "TFJob" in served_kinds else "indexed-job"
    return "pytorchjob" if "PyTorchJob" in served_kinds else "indexed-job"


def choose_ranks_per_pod(spec: JobSpec, *, engine: str, gpus_per_node: int | None) -> int:
    """How many ranks share a pod: the most that fit one GPU node and divide the world size.

    Only when the admin declares the GPU node size, the job uses GPUs and runs torchrun
    inside the pod (a PyTorchJob, or a pytorch TrainJob); otherwise one rank per pod.
    """
    torchrun = engine == "pytorchjob" or (engine == "trainjob" and spec.framework == "pytorch")
    if not torchrun or not gpus_per_node or spec.gpus_per_worker < 1:
        return 1
    fit = min(gpus_per_node // spec.gpus_per_worker, spec.workers)
    return next((k for k in range(fit, 1, -1) if spec.workers % k == 0), 1)
