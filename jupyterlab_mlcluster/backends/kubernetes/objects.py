"""Kubernetes manifests for one job, as pure functions: dicts in, dicts out, no API calls.

The backend beside this module talks to the API server; everything it creates is built
here, so the shapes can be unit-tested against literal dicts and the Kubernetes schemas.

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

import base64
import copy
import dataclasses
import hashlib
import hmac
import math
import re
from collections.abc import Collection, Sequence
from typing import Any

from ...jobs.model import JobSpec, SpecError, format_memory
from ...runtime.protocol import KEY_FILE
from .labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_NAME,
    ANNOTATION_USER,
    COMPLETION_INDEX_KEY,
    KUEUE_QUEUE_LABEL,
    LABEL_JOB_ID,
    LABEL_MANAGED_BY,
    LABEL_USER,
    MANAGED_BY,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    VOLCANO_GROUP_ANNOTATION,
)
from .packages import PackageSync, cache_volume, sync_command, sync_env
from .payload import chunk_name

ENGINES = ("trainjob", "pytorchjob", "tfjob", "indexed-job")
GANGS = ("none", "volcano", "kueue", "training-operator")

VOLCANO_SCHEDULER = "volcano"
GPU_RESOURCE = "nvidia.com/gpu"
NVIDIA_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"

PAYLOAD_VOLUME = "payload"
PAYLOAD_DIR = "/var/run/mlcluster/payload"
WORKER_MODULE = "jupyterlab_mlcluster.runtime.worker"
WORKER_COMMAND = ["python", "-m", WORKER_MODULE]

# The operator looks the master port up by these names; the defaults of training-operator v1.
PYTORCH_CONTAINER, PYTORCH_PORT_NAME, PYTORCH_PORT = "pytorch", "pytorchjob-port", 23456
TF_CONTAINER, TF_PORT_NAME, TF_PORT = "tensorflow", "tfjob-port", 2222
INDEXED_CONTAINER = "worker"
TRAINJOB_CONTAINER = "node"  # the container of the upstream Trainer runtimes' `node` job
MASTER_PORT = 29500  # torch's default, where we choose it (Indexed Job, TFJob)
JAX_PORT = 6666  # coordinator, beside the torch store port (JAXJob's default)

# Pods and per-pod Services of the operator are named <job>-worker-<index> and must be
# DNS-1035 labels (63): 50 + len("-worker-") + 5 digits = 63. Indexed Job pod hostnames
# <job>-<index> fit as well.
MAX_NAME_LENGTH = 50
# Engines that can run torchrun inside a pod (several ranks per pod).
TORCHRUN_ENGINES = ("pytorchjob", "trainjob")
MAX_WORKERS = 100_000
# torchrun prefixes every line of a packed pod's log with the global rank (split_packed_line).
PACKED_LOG_PREFIX_TEMPLATE = "[${rank}]:"
_PACKED_LOG_PREFIX_RE = re.compile(r"^\[(\d+)\]:")

_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
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


@dataclasses.dataclass(frozen=True)
class JobObjects:
    """Everything one job needs, in creation order (see the module docstring)."""

    job: dict[str, Any]
    dependents: list[dict[str, Any]]
    resume: dict[str, Any] | None  # merge patch for the job object; None: Kueue resumes it

    def all(self) -> list[dict[str, Any]]:
        return [self.job, *self.dependents]


# --- names and labels -------------------------------------------------------------------


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def object_name(job_id: str, name: str | None = None) -> str:
    """The name of every object of a job: `<name>-<job id>`, a DNS-1035 label <= 50 chars.

    The job id keeps it unique; the user's name (truncated to fit) keeps it readable.
    """
    base = f"{name}-{job_id}" if name else job_id
    if len(base) > MAX_NAME_LENGTH and name and len(job_id) < MAX_NAME_LENGTH - 1:
        base = f"{name[: MAX_NAME_LENGTH - len(job_id) - 1].rstrip('-')}-{job_id}"
    if len(base) <= MAX_NAME_LENGTH and _DNS_1035_RE.match(base):
        return base
    # Too long, or no DNS-1035 label (Service names must start with a letter, no trailing
    # '-'): keep what fits, unique through a hash of the whole.
    stem = base[: MAX_NAME_LENGTH - 11].strip("-")
    return "-".join(part for part in ("j", stem, _short_hash(base)) if part)


def label_value(text: str) -> str:
    """`text` as a valid label value; changed text gets a hash so distinct texts stay distinct."""
    if _LABEL_VALUE_RE.match(text) and len(text) <= 63:
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:54].rstrip("-_.")
    return f"{cleaned}-{_short_hash(text)}" if cleaned else _short_hash(text)


def job_labels(job_id: str, user: str) -> dict[str, str]:
    """The labels on every object of a job (and its pods): who made it, which job."""
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_ID: label_value(job_id),
        LABEL_USER: label_value(user),
    }


def job_selector(job_id: str) -> str:
    """Label selector for everything of one job (objects and pods)."""
    return f"{LABEL_JOB_ID}={label_value(job_id)}"


def _metadata(
    name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def with_owner(obj: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` owned by `owner` (as returned by the API server: it has a uid).

    blockOwnerDeletion makes foreground deletion of the owner wait for this object.
    """
    meta = owner.get("metadata", {})
    if not meta.get("uid") or not meta.get("name"):
        raise ValueError("the owner has no metadata.uid/name yet: pass the object the API returned")
    owned = copy.deepcopy(obj)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return owned


# --- validation -------------------------------------------------------------------------


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


# --- pieces of a pod --------------------------------------------------------------------


def format_cpu(cpus: float) -> str:
    """1.0 -> '1', 0.5 -> '500m', 2.25 -> '2250m'."""
    millis = round(cpus * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def pod_resources(spec: JobSpec, ranks: int = 1) -> dict[str, dict[str, str]]:
    """Resources for `ranks` ranks.

    Requests = limits: Guaranteed QoS, so a training pod is the last to be evicted under
    node pressure and gets the CPUs it asked for, no more, no less.
    """
    amounts = {"cpu": format_cpu(spec.cpus * ranks)}
    if spec.memory:
        amounts["memory"] = format_memory(spec.memory * ranks)
    resources = {"requests": dict(amounts), "limits": dict(amounts)}
    if spec.gpus_per_worker:
        # Extended resources are set as limits; the API server copies them to requests.
        resources["limits"][GPU_RESOURCE] = str(spec.gpus_per_worker * ranks)
    return resources


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _gang_env(rank_field: str, world: int, master: str) -> list[dict[str, Any]]:
    """RANK from a field of the pod (its index), and where the gang meets."""
    return [
        _env_from_field("RANK", rank_field),
        _env("WORLD_SIZE", str(world)),
        _env("MASTER_ADDR", master),
        _env("MASTER_PORT", str(MASTER_PORT)),
    ]


def _env_from_field(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def rank_environment(
    spec: JobSpec, *, engine: str, name: str, ranks_per_pod: int = 1
) -> list[dict[str, Any]]:
    """The torchrun-style rank variables, in the shape each engine needs.

    The Training Operator sets MASTER_ADDR/PORT, RANK and WORLD_SIZE itself (PyTorchJob) and
    TF_CONFIG (TFJob): those are left to it. Everything else the runtime reads is here.
    """
    world = spec.workers
    env: list[dict[str, Any]] = []
    if engine == "indexed-job":
        master = f"{name}-0.{name}"  # pod hostname . headless Service (the pod's subdomain)
        env += _gang_env(f"metadata.annotations['{COMPLETION_INDEX_KEY}']", world, master)
    elif engine == "tfjob":
        # Worker-only TFJob: the worker index is the rank (TF_CONFIG comes from the operator).
        master = f"{name}-worker-0"
        env += _gang_env(f"metadata.labels['{REPLICA_INDEX_LABEL}']", world, master)
    elif engine == "trainjob":
        # JobSet pod `<name>-node-0-<index>` (index = node = rank) behind the headless
        # Service `<name>`; the Trainer points PET_MASTER_ADDR at the same pod and port.
        master = f"{name}-{TRAINJOB_CONTAINER}-0-0.{name}"
        if ranks_per_pod == 1:
            env += _gang_env(f"metadata.annotations['{COMPLETION_INDEX_KEY}']", world, master)
    else:
        master = f"{name}-master-0"
    if ranks_per_pod == 1:
        env += [_env("LOCAL_RANK", "0"), _env("LOCAL_WORLD_SIZE", "1")]
        if spec.gpus_per_worker:
            gpus = ",".join(str(i) for i in range(spec.gpus_per_worker))
            env.append(_env("CUDA_VISIBLE_DEVICES", gpus))
        elif NVIDIA_DEVICES_ENV not in spec.env:
            # No CUDA_VISIBLE_DEVICES="" (torchrun sets none): a CUDA image sets
            # NVIDIA_VISIBLE_DEVICES=all, which would hand a pod without a GPU request its
            # node's GPUs; "void" tells the NVIDIA container runtime to give it none.
            env.append(_env(NVIDIA_DEVICES_ENV, "void"))
    else:
        # torchrun sets RANK/LOCAL_RANK/... per process; the runtime picks its own GPUs.
        env += [
            _env("MLCLUSTER_GPUS_PER_RANK", str(spec.gpus_per_worker)),
            _env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", PACKED_LOG_PREFIX_TEMPLATE),
        ]
    if spec.framework == "jax":
        env += [
            _env("JAX_COORDINATOR_ADDRESS", f"{master}:{JAX_PORT}"),
            _env("JAX_NUM_PROCESSES", str(world)),
        ]
    if spec.framework == "tensorflow" and engine == "indexed-job":
        hosts = ",".join(f"{name}-{i}.{name}:{TF_PORT}" for i in range(world))
        env.append(_env("MLCLUSTER_TF_WORKERS", hosts))
    return env


def container_name(engine: str) -> str:
    """The rank container's name (the operator finds its port through it; logs come from it)."""
    names = {"pytorchjob": PYTORCH_CONTAINER, "tfjob": TF_CONTAINER, "trainjob": TRAINJOB_CONTAINER}
    return names.get(engine, INDEXED_CONTAINER)


def _command(ranks_per_pod: int) -> list[str]:
    if ranks_per_pod == 1:
        return list(WORKER_COMMAND)
    # The operator gives every pod its node rank and the rendezvous in PET_* variables.
    rendezvous = ("nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port")
    flags = [f"--{flag}=$(PET_{flag.upper().replace('-', '_')})" for flag in rendezvous]
    # --tee: each rank's output reaches the pod log, prefixed with its rank.
    return ["python", "-m", "torch.distributed.run", *flags, "--tee=3", "--module", WORKER_MODULE]


def payload_secret_prefix(name: str, key: bytes, attempt: int) -> str:
    """`<name>-<token>`: the payload Secrets' names of one attempt, unguessable without the
    job's key (nobody can create them before the supervisor does), the same for a supervisor
    that takes the job over (it has the key)."""
    token = hmac.new(key, f"payload-secrets/{attempt}".encode(), hashlib.sha256).hexdigest()
    return f"{name}-{token[:20]}"


def payload_volume(prefix: str, chunk_count: int, with_key: bool = False) -> dict[str, Any]:
    """ONE projected volume gathering every chunk Secret as files payload-000, payload-001...
    (and the job's record key, from the first Secret, as `report-key`)."""
    sources = [
        {
            "secret": {
                "name": f"{prefix}-{chunk_name(i)}",
                "items": [{"key": chunk_name(i), "path": chunk_name(i)}]
                + ([{"key": KEY_FILE, "path": KEY_FILE}] if with_key and i == 0 else []),
            }
        }
        for i in range(chunk_count)
    ]
    return {"name": PAYLOAD_VOLUME, "projected": {"sources": sources, "defaultMode": 0o444}}


def pod_template(
    job_id: str,
    spec: JobSpec,
    *,
    engine: str,
    name: str,
    image: str,
    labels: dict[str, str],
    chunk_count: int,
    gang: str = "none",
    priority_class: str | None = None,
    service_account: str | None = None,
    ranks_per_pod: int = 1,
    attempt: int = 0,
    payload_prefix: str | None = None,
    with_key: bool = False,
    packages: PackageSync | None = None,
    grace: float | None = None,
) -> dict[str, Any]:
    """The pod template every rank of the job runs (`payload_prefix`: the payload Secrets'
    names, `name` by default; `with_key`: the first one holds the job's record key;
    `packages`: what the notebook added to the image, installed before the rank runs;
    `grace`: the job's kill_grace_period, between SIGTERM and SIGKILL when a pod is evicted
    or deleted, as when mlcluster stops the job: Kubernetes' 30 s otherwise)."""
    env = [_env(k, v) for k, v in spec.env.items()]
    env += [
        _env("MLCLUSTER_JOB_ID", job_id),
        _env("MLCLUSTER_PAYLOAD", PAYLOAD_DIR),
        _env("MLCLUSTER_REPORT", "stdout"),
        _env("PYTHONUNBUFFERED", "1"),
        _env("TORCHELASTIC_RESTART_COUNT", str(attempt)),
        _env("TORCHELASTIC_MAX_RESTARTS", str(spec.max_restarts)),
    ]
    if spec.tensorboard:  # no default on Kubernetes: only a directory the user named
        env.append(_env("MLCLUSTER_TENSORBOARD_DIR", spec.tensorboard))
    env += rank_environment(spec, engine=engine, name=name, ranks_per_pod=ranks_per_pod)
    command = _command(ranks_per_pod)
    if packages is not None and packages.requirements:
        command = sync_command(command)
        env += sync_env(packages)
    container: dict[str, Any] = {
        "name": container_name(engine),
        "image": image,
        "command": command,
        "env": env,
        "resources": pod_resources(spec, ranks_per_pod),
        "volumeMounts": [
            {"name": PAYLOAD_VOLUME, "mountPath": PAYLOAD_DIR, "readOnly": True},
            # NCCL and DataLoader workers need more than the runtime's 64 MiB /dev/shm.
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    cache = cache_volume(packages) if packages is not None and packages.requirements else None
    if cache is not None:
        container["volumeMounts"].append(cache[1])
    if engine == "pytorchjob":
        container["ports"] = [{"name": PYTORCH_PORT_NAME, "containerPort": PYTORCH_PORT}]
    elif engine == "tfjob":
        container["ports"] = [{"name": TF_PORT_NAME, "containerPort": TF_PORT}]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            payload_volume(payload_prefix or name, chunk_count, with_key),
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            *([cache[0]] if cache is not None else []),
        ],
        # Ranks do not talk to the API server, and service-link variables could clash
        # with ours (a Service named "master" gives MASTER_PORT).
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = max(0, math.ceil(grace))
    if engine == "indexed-job":
        pod_spec["restartPolicy"] = "Never"  # the operators take it from the replica spec
        pod_spec["subdomain"] = name
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    metadata: dict[str, Any] = {"labels": dict(labels)}
    if gang == "volcano":
        pod_spec["schedulerName"] = VOLCANO_SCHEDULER
        metadata["annotations"] = {VOLCANO_GROUP_ANNOTATION: name}
    return {"metadata": metadata, "spec": pod_spec}


# --- the objects ------------------------------------------------------------------------


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
                "metadata": _metadata(f"{prefix}-{chunk_name(i)}", namespace, labels),
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
        "metadata": _metadata(name, namespace, labels),
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
        "metadata": _metadata(name, namespace, labels),
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
    metadata = _metadata(name, namespace, job_labels_, annotations)

    if engine == "trainjob":
        from .trainjob import train_job

        if priority_class:
            raise SpecError("a TrainJob cannot set a PriorityClass (its runtime does)")
        if not runtime:
            raise ValueError("a TrainJob needs the name of its runtime")
        job = train_job(
            spec,
            metadata=_metadata(name, namespace, labels, annotations),
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
