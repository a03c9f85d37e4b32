"""What `mlcluster export` writes, built from what the store kept of a job: pure (no process,
no clock; the one file read is a module of this package's own), so each target's files can be
judged as they are.

Every target writes the cell as a script (`<name>.py`; its pushed variables in
`variables.pkl` beside it, loaded at its top), `requirements.txt` (pinned from the
environment the job was submitted from: its packages.json) and the target's launch file:

- `script`: `run.sh`, torchrun on this machine with the job's worker count and variables;
- `sbatch`: `<name>.sbatch`, the job's sbatch options as the Slurm backend builds them
  (backends/slurm/script.py `sbatch_arguments`), one srun task per rank, and `mlcluster_port.py`
  (runtime/ports.py as it is: it imports nothing of ours), which chooses MASTER_PORT;
- `pytorchjob` / `trainjob`: `<name>.yaml`, a ConfigMap holding the script (and its
  variables) and the job object the Kubernetes backend builds for that engine
  (backends/kubernetes/objects.py `pod_template`, `pytorch_job`, trainjob.py `train_job`),
  its command the script instead of mlcluster's runtime.

The script needs nothing of jupyterlab-mlcluster: the rank variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, LOCAL_RANK) come from whatever launches it.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import shlex
from typing import Any

import yaml

from ..backends.kubernetes import objects as k8s
from ..backends.kubernetes.trainjob import train_job
from ..backends.slurm.script import cpus_per_task, sbatch_arguments
from ..jobs.grouping import slug
from ..jobs.model import JobSpec, SpecError
from ..jobs.record import JobRecord
from ..runtime import ports

TARGETS = ("script", "sbatch", "trainjob", "pytorchjob")
VARIABLES_FILE = "variables.pkl"
REQUIREMENTS_FILE = "requirements.txt"
# Where the ConfigMap holding the script is mounted in a pod.
CODE_DIR = "/opt/mlcluster-export"
CODE_VOLUME = "code"
# A ConfigMap holds at most 1 MiB (the API server refuses more).
CONFIGMAP_LIMIT = 1 << 20
PORTS_FILE = "mlcluster_port.py"  # shipped with an sbatch export, run on rank 0's node
# What of the Slurm backend's sbatch options belongs to its own bookkeeping (its attempt
# directory, its comment, machine-readable output), not to the job.
_SBATCH_OWN = ("--parsable", "--comment=", "--output=", "--chdir=", "--export=")
# The container variables that only mlcluster's runtime reads.
_RUNTIME_ENV_PREFIXES = ("MLCLUSTER_", "TORCHELASTIC_")


class ExportError(ValueError):
    """A job that cannot be exported as asked; nothing is written."""


@dataclasses.dataclass
class JobMaterial:
    """What the store kept of a job, read by export/__init__.py."""

    record: JobRecord
    source: str  # the cell's code, or the script's
    # The job's stored payload (its pushed variables among its objects); None: none pushed.
    variables: bytes | None
    pushed: list[str]  # the names of the pushed variables
    requirements: list[str]  # pinned, from packages.json ([] when the job kept none)
    python: str  # the interpreter the job ran on ('python3' when unknown)
    config: dict[str, Any]  # the submitter's settings as the job kept them (launch.json)
    label: str  # where it came from, in words ("train.ipynb, cell [7]")
    # A session's cell: the session's cells that succeeded before it, oldest first (their
    # state was the ranks' when it ran); each runs ahead of it in the script.
    earlier: list[JobMaterial] = dataclasses.field(default_factory=list)


def variables_file(material: JobMaterial, main: JobMaterial) -> str:
    """`variables.pkl` for the job exported, `variables-<id>.pkl` for an earlier cell's."""
    return VARIABLES_FILE if material is main else f"variables-{material.record.id}.pkl"


def script_name(record: JobRecord) -> str:
    return (slug(record.name, 40) or "job").replace("-", "_")


def build(material: JobMaterial, target: str, *, image: str | None = None) -> dict[str, bytes]:
    """File name -> content of the export of `material` as `target`. ExportError when the
    job cannot be expressed so (an unknown target, a framework or image it needs)."""
    if target not in TARGETS:
        raise ExportError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    spec = material.record.spec
    if spec.framework in ("tensorflow", "jax"):
        raise ExportError(
            f"--framework {spec.framework}: an export sets up torch's rank variables only "
            "(pytorch or none); TF_CONFIG and JAX's coordinator are set by mlcluster's runtime"
        )
    name = script_name(material.record)
    files = {
        f"{name}.py": script_text(material, name).encode(),
        REQUIREMENTS_FILE: requirements_text(material).encode(),
    }
    for part in (*material.earlier, material):
        if part.variables is not None:
            files[variables_file(part, material)] = part.variables
    if target == "script":
        files["run.sh"] = run_sh(material, name).encode()
    elif target == "sbatch":
        files[f"{name}.sbatch"] = sbatch_text(material, name).encode()
        files[PORTS_FILE] = inspect.getsource(ports).encode()
    else:
        documents = kubernetes_objects(material, name, target, files, image=image)
        files[f"{name}.yaml"] = yaml.safe_dump_all(documents, sort_keys=False).encode()
    return files


def script_text(material: JobMaterial, name: str) -> str:
    record = material.record
    lines = [
        "#!/usr/bin/env python",
        f'"""{name}: job {record.id} ({record.name}) of jupyterlab-mlcluster, exported from '
        f"{material.label}.",
        "",
        f"It ran on {record.spec.workers} rank(s); torch.distributed reads RANK, WORLD_SIZE,",
        "MASTER_ADDR and MASTER_PORT from the launcher (run.sh, srun, a PyTorchJob, a TrainJob).",
        '"""',
    ]
    if material.earlier:
        lines += [
            f"# A cell of session {record.origin.get('session')!r}: the {len(material.earlier)}"
            " cell(s) that succeeded in it before run first, as they did on its ranks.",
        ]
    parts = (*material.earlier, material)
    if any(part.variables is not None for part in parts):
        lines += ["", "import os as _os", "", "import cloudpickle as _cloudpickle"]
    for part in parts:
        lines += ["", f"# --- {part.label} (job {part.record.id}) ---"]
        if part.variables is not None:
            lines += [
                f"# The variables it was given (--push {','.join(part.pushed)}), saved beside",
                "# this script as the job stored them: its objects are (function, args, kwargs,",
                "# pushed variables), cloudpickled.",
                f"with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "
                f"{variables_file(part, material)!r}), 'rb') as _file:",
                '    globals().update(_cloudpickle.loads(_cloudpickle.load(_file)["objects"])[3])',
            ]
        lines.append(part.source.rstrip("\n"))
    lines.append("")
    return "\n".join(lines)


def requirements_text(material: JobMaterial) -> str:
    head = f"# Pinned from the environment job {material.record.id} was submitted from"
    if not material.requirements:
        return head + ": it kept no list (submitted by an older version).\n"
    return "\n".join([head + ".", *material.requirements, ""])


def _exports(env: dict[str, str]) -> list[str]:
    return [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]


def run_sh(material: JobMaterial, name: str) -> str:
    spec = material.record.spec
    q = shlex.quote
    return "\n".join(
        [
            "#!/bin/sh",
            f"# Job {material.record.id} again, outside the notebook: {spec.workers} ranks on"
            " this machine (torchrun).",
            'cd "$(dirname "$0")" || exit 1',
            *_exports(spec.env),
            f"PYTHON=${{PYTHON:-{q(material.python)}}}",
            f'exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node {spec.workers}'
            f' {q(name + ".py")} "$@"',
            "",
        ]
    )


def sbatch_text(material: JobMaterial, name: str) -> str:
    record, config = material.record, material.config
    spec = dataclasses.replace(record.spec, name=record.name)  # the job's name, given or not
    try:
        arguments = sbatch_arguments(
            spec,
            job_id=record.id,
            attempt_dir=".",
            partition=str(config.get("slurm_partition") or ""),
            account=str(config.get("slurm_account") or ""),
            qos_by_priority=dict(config.get("slurm_priority_qos") or {}),
            extra_args=list(config.get("slurm_extra_args") or []),
        )
    except SpecError as exc:
        raise ExportError(f"cannot export job {record.id} for Slurm: {exc}") from None
    options = [a for a in arguments if not a.startswith(_SBATCH_OWN)]
    q = shlex.quote
    # Each task is one rank: torch's variables from Slurm's (as backends/slurm/rank.py sets
    # them for mlcluster's own runtime).
    rank = (
        "RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
        'exec "$PYTHON" ' + q(name + ".py")
    )
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--cpus-per-task={cpus_per_task(spec)}",
        *([f"--gpus-per-task={spec.gpus_per_worker}"] if spec.gpus_per_worker else []),
    ]
    return "\n".join(
        [
            "#!/bin/sh",
            *(f"#SBATCH {option}" for option in options),
            f"#SBATCH --output={name}-%j.out",
            f"# Job {record.id} again as a Slurm batch job: sbatch {name}.sbatch (from this",
            "# directory, on the filesystem the nodes share).",
            *_exports(spec.env),
            f"PYTHON=${{PYTHON:-{q(material.python)}}}",
            "export PYTHON",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            # A port held for rank 0 on its node (PORTS_FILE: why not merely a free one).
            f'MASTER_PORT=$("$PYTHON" {PORTS_FILE}) || exit 1',
            "export MASTER_ADDR MASTER_PORT",
            " ".join(srun) + " sh -c " + q(rank),
            "",
        ]
    )


def kubernetes_objects(
    material: JobMaterial,
    name: str,
    target: str,
    files: dict[str, bytes],
    *,
    image: str | None,
) -> list[dict[str, Any]]:
    record = material.record
    spec = JobSpec.from_dict(record.spec.to_dict())
    chosen = image or spec.image or str(material.config.get("kubernetes_image") or "")
    if not chosen:
        raise ExportError(
            f"job {record.id} names no image (it ran on {spec.backend}): give one with --image"
        )
    try:
        k8s.check_request(spec, engine=target)
    except SpecError as exc:
        raise ExportError(f"cannot export job {record.id} as a {target}: {exc}") from None
    object_name = k8s.object_name(record.id + "x", record.name)
    labels = {
        "app.kubernetes.io/name": object_name,
        "app.kubernetes.io/created-by": "jupyterlab-mlcluster-export",
    }
    template = k8s.pod_template(
        record.id,
        spec,
        engine=target,
        name=object_name,
        image=chosen,
        labels=labels,
        chunk_count=1,
    )
    (container,) = template["spec"]["containers"]
    container["command"] = ["python", f"{CODE_DIR}/{name}.py"]
    container["env"] = [
        e for e in container["env"] if not e["name"].startswith(_RUNTIME_ENV_PREFIXES)
    ]
    container["volumeMounts"] = [
        {"name": CODE_VOLUME, "mountPath": CODE_DIR, "readOnly": True},
        *(m for m in container["volumeMounts"] if m["name"] != k8s.PAYLOAD_VOLUME),
    ]
    template["spec"]["volumes"] = [
        {"name": CODE_VOLUME, "configMap": {"name": f"{object_name}-code"}},
        *(v for v in template["spec"]["volumes"] if v["name"] != k8s.PAYLOAD_VOLUME),
    ]
    metadata = {
        "name": object_name,
        "labels": dict(labels),
        "annotations": {"mlcluster.io/exported-from": record.id},
    }
    if target == "pytorchjob":
        policy = k8s.run_policy(
            spec, gang="none", pods=spec.workers, queue=None, priority_class=None
        )
        policy.pop("suspend")  # mlcluster resumes its own; an export starts when applied
        job = k8s.pytorch_job(metadata, template, policy, pods=spec.workers, ranks_per_pod=1)
    else:
        runtimes = material.config.get("kubernetes_trainer_runtimes") or {}
        runtime = str(runtimes.get(spec.framework) or "torch-distributed")
        job = train_job(spec, metadata=metadata, template=template, runtime=runtime)
        job["spec"].pop("suspend")
    return [configmap(f"{object_name}-code", labels, files), job]


def configmap(name: str, labels: dict[str, str], files: dict[str, bytes]) -> dict[str, Any]:
    """The script (and its variables, as binary data) for the pods to mount."""
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    for file, content in files.items():
        if file.endswith(".pkl"):
            binary[file] = base64.b64encode(content).decode("ascii")
        else:
            data[file] = content.decode()
    size = len(json.dumps(data)) + len(json.dumps(binary))
    if size > CONFIGMAP_LIMIT:
        raise ExportError(
            f"the script and its variables are {size / (1 << 20):.1f} MiB, more than a "
            "ConfigMap holds (1 MiB): export it --as script and put it in the image"
        )
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": dict(labels)},
        "data": data,
    }
    if binary:
        obj["binaryData"] = binary
    return obj
