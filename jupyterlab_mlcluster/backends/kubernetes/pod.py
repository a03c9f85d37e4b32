"""The pod template every rank of a job runs, whatever the job object around it: its
container (command, environment, resources, mounts) and its volumes. Pure: dicts out.

One rank per pod, or `ranks_per_pod` ranks under torchrun in one pod (PyTorchJob and
TrainJob; see request.choose_ranks_per_pod). The payload (the pickled cell) arrives as one
projected volume of immutable Secrets (workloads.payload_secrets builds those).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any

from ...jobs.model import JobSpec, format_memory
from ...runtime.protocol import KEY_FILE
from .labels import COMPLETION_INDEX_KEY, REPLICA_INDEX_LABEL, VOLCANO_GROUP_ANNOTATION
from .packages import PackageSync, cache_volume, sync_command, sync_env
from .payload import chunk_name

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
# torchrun prefixes every line of a packed pod's log with the global rank (split_packed_line).
PACKED_LOG_PREFIX_TEMPLATE = "[${rank}]:"


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
