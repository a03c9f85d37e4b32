"""Pure builders and parsers of the Slurm backend: no subprocess, no file, no clock.

- `sbatch_arguments` / `batch_script`: one allocation of N tasks, started in one `srun` step
  (the whole gang starts, or none does), each task's output in files of its own on the
  filesystem the notebook shares with the nodes;
- `rank_environment`: inside a task, the torchrun variables from Slurm's (`SLURM_TO_RANK`);
- `parse_jobs` / `parse_sinfo` / `job_outcome`: what squeue and sinfo print, and what a
  Slurm job state means for the attempt.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from typing import Any

from ...jobs.model import JobSpec, SpecError

# Rank variable <- the Slurm variable it comes from (README "On Slurm"), inside each task.
SLURM_TO_RANK = (
    ("RANK", "SLURM_PROCID"),
    ("WORLD_SIZE", "SLURM_NTASKS"),
    ("LOCAL_RANK", "SLURM_LOCALID"),
    ("LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE (this node's count)"),
    ("GROUP_RANK", "SLURM_NODEID"),
    ("GROUP_WORLD_SIZE", "SLURM_STEP_NUM_NODES"),
    ("MASTER_ADDR", "first host of SLURM_JOB_NODELIST"),
    ("MASTER_PORT", "a port of that host held by the batch script"),
    ("TORCHELASTIC_RUN_ID", "the mlcluster job id (SLURM_JOB_ID is in the log)"),
)

# The comment every allocation of ours carries: the reaper finds a dead supervisor's
# allocation by it even when the supervisor died before it could record the Slurm job id.
COMMENT_PREFIX = "mlcluster:"

# Where one attempt's files live, inside the job's directory (the shared filesystem).
RANK_STREAMS = {"o": "out", "e": "err", "c": "control"}
# In a task's job variables: arm the rank's own stack helper (rank.py, forensics.py).
STACKS_HELPER_VARIABLE = "MLCLUSTER_SLURM_STACKS_HELPER"

# Slurm job states -> what the attempt became. Pending/running ones are not final.
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}
_ENDED_REASONS = {
    "TIMEOUT": ("timeout", "Slurm ended the job at its time limit (TIMEOUT)"),
    "NODE_FAIL": ("failed", "a node of the allocation failed (Slurm: NODE_FAIL)"),
    "PREEMPTED": ("failed", "Slurm preempted the job (PREEMPTED)"),
    "BOOT_FAIL": ("failed", "a node of the allocation failed to boot (Slurm: BOOT_FAIL)"),
    "DEADLINE": ("timeout", "Slurm ended the job at its deadline (DEADLINE)"),
    "OUT_OF_MEMORY": ("failed", "out of memory (Slurm: OUT_OF_MEMORY)"),
    "CANCELLED": ("cancelled", "cancelled in Slurm (scancel, or an administrator)"),
    "REVOKED": ("cancelled", "Slurm revoked the job (REVOKED)"),
    "SPECIAL_EXIT": ("failed", "Slurm held the job (SPECIAL_EXIT)"),
}


# Final states in which Slurm itself took the allocation away: the ranks' exits (on its
# SIGTERM) are no cause, the state is (backend.py `_slurm_verdict`).
SLURM_ENDED = {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "DEADLINE", "OUT_OF_MEMORY"}


def attempt_files(attempt_dir: str) -> dict[str, str]:
    """The file names (with Slurm's %t = task id) of one attempt's batch script and output."""
    return {
        "script": f"{attempt_dir}/job.sh",
        "batch_output": f"{attempt_dir}/batch.out",
        "out": f"{attempt_dir}/rank-%t.out",
        "err": f"{attempt_dir}/rank-%t.err",
    }


def variables_file(attempt_dir: str) -> str:
    """The job's own variables (its `env`, the rank variables of the attempt): JSON the
    supervisor writes and each task adds to its environment (backends/slurm/rank.py), so that
    none of them is ever in the environment of sbatch on the submitter's host."""
    return f"{attempt_dir}/variables.json"


# Variables the interpreter reads as it starts: a task re-executes itself when the job's
# variables change one of them, as if they had been there from the start.
STARTUP_PREFIXES = ("PYTHON", "LD_")


def rank_file(attempt_dir: str, rank: int, kind: str) -> str:
    """A rank's own file of the attempt: out, err, control (its signed reports), exit."""
    return f"{attempt_dir}/rank-{int(rank)}.{kind}"


def time_limit(seconds: float | None) -> str | None:
    """sbatch --time of a --timeout: whole minutes, rounded up (Slurm counts minutes; the
    supervisor ends the job at the exact time itself, Slurm's limit is the backstop)."""
    if seconds is None:
        return None
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def priority_arguments(priority: int, qos_by_priority: dict[str, str]) -> list[str]:
    """--qos from MLClusterConfig.slurm_priority_qos, else a nice value (0: nothing)."""
    qos = qos_by_priority.get(str(priority))
    if qos:
        return [f"--qos={qos}"]
    if priority == 0:
        return []
    # A higher mlcluster priority is a lower nice value; Slurm bounds nice at +-2147483645.
    return [f"--nice={max(-2147483645, min(2147483645, -priority))}"]


def memory_per_cpu_mib(memory: int | None, cpus_per_task: int) -> int | None:
    if memory is None:
        return None
    return max(1, math.ceil(memory / cpus_per_task / (1 << 20)))


def cpus_per_task(spec: JobSpec) -> int:
    """Slurm allocates whole CPUs: a fraction of one is one."""
    return max(1, math.ceil(spec.cpus))


def sbatch_arguments(
    spec: JobSpec,
    *,
    job_id: str,
    attempt_dir: str,
    partition: str = "",
    account: str = "",
    qos_by_priority: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    grace: float = 0,
) -> list[str]:
    """sbatch's options for one attempt of `spec` (the script itself: `batch_script`).
    `grace`: the job's (kill_grace_period), given to its tasks before Slurm's time limit."""
    if spec.image:
        raise SpecError(
            "--image only applies to the kubernetes backend; Slurm tasks run this environment"
        )
    if spec.framework == "tensorflow":
        # TF_CONFIG names every worker's host and port before any starts; Slurm places the
        # tasks itself. Refused rather than started without it.
        raise SpecError(
            "--framework tensorflow is not supported on the slurm backend yet (TF_CONFIG); "
            "use the local or kubernetes backend"
        )
    files = attempt_files(attempt_dir)
    cpus = cpus_per_task(spec)
    args = [
        "--parsable",
        f"--job-name={spec.name or 'mlcluster'}",
        f"--comment={COMMENT_PREFIX}{job_id}",
        f"--ntasks={spec.workers}",
        f"--cpus-per-task={cpus}",
        f"--output={files['batch_output']}",
        f"--chdir={attempt_dir}",
        # The job is restarted by its supervisor (max_restarts), never requeued by Slurm
        # behind its back.
        "--no-requeue",
        # The tasks get the environment the supervisor gives sbatch (the submitter's, less
        # launcher and Slurm variables), then add the job's own from its variables file
        # (rank.py): as a local rank gets them, without sbatch ever seeing the job's.
        "--export=ALL",
    ]
    if spec.gpus_per_worker:
        args.append(f"--gpus-per-task={spec.gpus_per_worker}")
    mem = memory_per_cpu_mib(spec.memory, cpus)
    if mem is not None:
        args.append(f"--mem-per-cpu={mem}M")
    limit = time_limit(spec.timeout)
    if limit:
        args.append(f"--time={limit}")
    elif grace > 0:
        # No --timeout of ours (which the supervisor enforces to the second, the minutes
        # of --time after it): the partition's time limit ends the job. Its tasks get
        # SIGTERM the job's grace before it, to save their work (examples/dcp_resume.py).
        args.append(f"--signal=TERM@{max(1, math.ceil(grace))}")
    queue = spec.queue or partition
    if queue:
        args.append(f"--partition={queue}")
    if account:
        args.append(f"--account={account}")
    args += priority_arguments(spec.priority, qos_by_priority or {})
    args += list(extra_args)
    return args


def batch_script(*, python: str, attempt_dir: str, spec: JobSpec) -> str:
    """The batch script: pick MASTER_PORT on the first node (where the batch script runs,
    and rank 0 with it), then start every task in one srun step; a task that fails ends the
    step (--kill-on-bad-exit), as torchrun stops the others. The step asks for the task's
    CPUs (and GPUs) again: since Slurm 22.05 srun does not inherit sbatch's --cpus-per-task,
    and --gpus-per-task binds each task to its own GPUs (gpu-bind per_task)."""
    files = attempt_files(attempt_dir)
    q = shlex.quote
    # Held for rank 0 on its node, not merely found free (runtime/ports.py says why).
    choose_port = " ".join(q(a) for a in (python, "-m", "jupyterlab_mlcluster.runtime.ports"))
    srun = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--cpus-per-task={cpus_per_task(spec)}",
        *([f"--gpus-per-task={spec.gpus_per_worker}"] if spec.gpus_per_worker else []),
        f"--output={files['out']}",
        f"--error={files['err']}",
        "--input=none",
        python,
        "-m",
        "jupyterlab_mlcluster.backends.slurm.rank",
    ]
    return "\n".join(
        [
            "#!/bin/sh",
            "# Written by jupyterlab-mlcluster: one attempt of one job (see rank-*.out/err).",
            f"MASTER_PORT=$({choose_port}) || exit 1",
            "export MASTER_PORT",
            *(
                [
                    f"MLCLUSTER_SLURM_JAX_PORT=$({choose_port}) || exit 1",
                    "export MLCLUSTER_SLURM_JAX_PORT",
                ]
                if spec.framework == "jax"
                else []
            ),
            f"MLCLUSTER_SLURM_ATTEMPT_DIR={q(attempt_dir)}",
            "export MLCLUSTER_SLURM_ATTEMPT_DIR",
            "exec " + " ".join(q(a) for a in srun),
            "",
        ]
    )


# -- inside a task -------------------------------------------------------------------------

_HOSTLIST_RE = re.compile(r"([^,\[]+)(\[([^\]]*)\])?")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: 'vm' -> 'vm', 'gpu[07-09,12],cpu1' -> 'gpu07'."""
    match = _HOSTLIST_RE.match(nodelist.strip())
    if not match or not match.group(1):
        raise ValueError(f"not a Slurm hostlist: {nodelist!r}")
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """This node's task count from SLURM_STEP_TASKS_PER_NODE: '2(x3),1', node 3 -> 1."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(f"not a Slurm tasks-per-node list: {tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_id]


def rank_environment(env: dict[str, str], attempt_dir: str) -> dict[str, str]:
    """The torchrun-compatible variables of this task, from Slurm's (`SLURM_TO_RANK`), and
    its own files (error report, result for rank 0). Only what is added is returned."""
    rank = int(env["SLURM_PROCID"])
    world = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS") or "1"
    node_id = int(env.get("SLURM_NODEID", "0"))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or world
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or "1"
    out = {
        "RANK": str(rank),
        "WORLD_SIZE": world,
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": str(tasks_on_node(per_node, node_id)),
        "GROUP_RANK": str(node_id),
        "GROUP_WORLD_SIZE": nodes,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world,
        "MASTER_ADDR": first_host(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"]),
        "MLCLUSTER_ERROR_FILE": env["MLCLUSTER_SLURM_ERROR_FILES"].replace("{rank}", str(rank)),
    }
    out["TORCHELASTIC_ERROR_FILE"] = out["MLCLUSTER_ERROR_FILE"]
    if env.get("MLCLUSTER_SLURM_JAX_PORT"):
        # --framework jax: rank 0's host runs the coordinator (the worker adds the rest).
        out["JAX_COORDINATOR_ADDRESS"] = f"{out['MASTER_ADDR']}:{env['MLCLUSTER_SLURM_JAX_PORT']}"
        out["JAX_PROCESS_ID"] = str(rank)
        out["JAX_NUM_PROCESSES"] = world
    if rank == 0 and env.get("MLCLUSTER_SLURM_RESULT_PATH"):
        out["MLCLUSTER_RESULT_PATH"] = env["MLCLUSTER_SLURM_RESULT_PATH"]
    return out


# -- what Slurm says -----------------------------------------------------------------------

SQUEUE_FORMAT = "%i|%T|%r|%N|%k"
SQUEUE_FIELDS = ("id", "state", "reason", "nodes", "comment")


# The watcher's (watch.py): also each job's partition(s) and user; the comment, which may
# hold anything, stays last.
WATCH_FORMAT = "%i|%T|%r|%N|%P|%u|%k"
WATCH_FIELDS = ("id", "state", "reason", "nodes", "partition", "user", "comment")
SACCT_FORMAT = "JobIDRaw,State,NodeList,Partition,User"


def parse_jobs(text: str, fields: tuple[str, ...] = SQUEUE_FIELDS) -> list[dict[str, str]]:
    """Rows of `squeue --noheader --format=SQUEUE_FORMAT` (or WATCH_FORMAT: its `fields`)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(fields) - 1)
        if len(parts) != len(fields):
            continue
        row = dict(zip(fields, (p.strip() for p in parts), strict=True))
        # Extended states ("CANCELLED by 0", "RUNNING+...") name their base state first.
        row["state"] = re.split(r"[\s+]", row["state"], maxsplit=1)[0]
        rows.append(row)
    return rows


def parse_accounting(text: str) -> list[dict[str, str]]:
    """Rows of `sacct --noheader --parsable2 --format=SACCT_FORMAT`, in squeue's shape."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        job_id, state, nodes, partition, user = parts
        rows.append(
            {
                "id": job_id,
                # "CANCELLED by 0": the base state first, as squeue's extended states.
                "state": re.split(r"[\s+]", state, maxsplit=1)[0],
                "reason": "",
                "nodes": nodes,
                "partition": partition,
                "user": user,
                "comment": "",
            }
        )
    return rows


def ours(rows: list[dict[str, str]], job_id: str) -> list[dict[str, str]]:
    """The rows of allocations made for mlcluster job `job_id` (by their comment)."""
    return [r for r in rows if r.get("comment") == f"{COMMENT_PREFIX}{job_id}"]


def pending_reason(reason: str) -> str:
    """A pending job's reason, readable: Slurm's own word kept (users search for it)."""
    reason = reason.strip().strip("()")
    hints = {
        "Resources": "the cluster has no free resources for it yet",
        "Priority": "jobs of higher priority are ahead of it",
        "Dependency": "it waits for another job",
        "QOSMaxGRESPerUser": "your QOS's GPU limit is reached",
        "QOSMaxCpuPerUserLimit": "your QOS's CPU limit is reached",
        "AssocMaxJobsLimit": "your account's job limit is reached",
        "ReqNodeNotAvail": "a node it needs is not available",
        "PartitionDown": "the partition is down",
        "BeginTime": "its start time has not come",
        "None": "Slurm has not looked at it yet",
    }
    hint = hints.get(reason)
    return f"waiting in Slurm: {reason}" + (f" ({hint})" if hint else "")


_SRUN_TASK_RE = re.compile(r"^srun: error: [^:]+: tasks? (\d+)(?:-\d+)?: (.+)$", re.MULTILINE)


def srun_task_failure(batch_output: str) -> tuple[int, str] | None:
    """The first task srun said ended badly, and how ('Killed', 'Exited with exit code 3'),
    from the batch script's output: the culprit when no rank left its exit status (a rank
    killed by a signal, e.g. the kernel's OOM killer, writes none)."""
    match = _SRUN_TASK_RE.search(batch_output)
    return (int(match.group(1)), match.group(2).strip()) if match else None


def job_outcome(state: str) -> tuple[str, str] | None:
    """(kind, message) for a final Slurm job state other than COMPLETED/FAILED (whose ranks
    tell what happened); None while the job is active."""
    if state in ACTIVE_STATES:
        return None
    return _ENDED_REASONS.get(state)


SINFO_FORMAT = (
    "NodeHost:0|,Partition:0|,CPUsState:0|,Gres:0|,GresUsed:0|,Memory:0|,StateLong:0|,AllocMem:0|"
)
_UNUSABLE = ("down", "drain", "fail", "maint", "unknown", "not_responding", "future", "power")


def _gpu_count(gres: str) -> int:
    """GPUs in a sinfo Gres/GresUsed field: 'gpu:a100:4(S:0-1),gpu:2' -> 6."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def parse_sinfo(text: str) -> dict[str, dict[str, Any]]:
    """Per partition: CPUs and GPUs total and idle, memory (MB) total and free, nodes; from
    `sinfo --noheader --Node --Format=SINFO_FORMAT` (a node in several partitions counts
    in each). A default partition is marked `default`."""
    partitions: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 7:
            continue
        _host, name, cpus, gres, gres_used, memory, state = (p.strip() for p in parts[:7])
        allocated_memory = parts[7].strip() if len(parts) > 7 else ""
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = partitions.setdefault(
            name,
            {
                "default": default,
                "nodes": 0,
                "cpus_total": 0,
                "cpus_idle": 0,
                "gpus_total": 0,
                "gpus_idle": 0,
                "memory_mb": 0,
                "memory_free_mb": 0,
            },
        )
        try:
            _alloc, idle, _other, total = (int(x) for x in cpus.split("/"))
        except ValueError:
            continue
        usable = not any(word in state.lower() for word in _UNUSABLE)
        gpus = _gpu_count(gres)
        entry["nodes"] += 1
        entry["cpus_total"] += total
        entry["gpus_total"] += gpus
        node_memory = int(memory) if memory.isdigit() else 0
        entry["memory_mb"] += node_memory
        if usable:
            entry["cpus_idle"] += idle
            entry["gpus_idle"] += max(0, gpus - _gpu_count(gres_used))
            used = int(allocated_memory) if allocated_memory.isdigit() else 0
            entry["memory_free_mb"] += max(0, node_memory - used)
    return partitions


def slurm_error(stderr: str) -> str:
    """Slurm's own words from a command's stderr: its error lines, else all of it."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failure" in line.lower()]
    return "; ".join(errors or lines)
