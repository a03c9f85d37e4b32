"""Settings shared by every front end (kernel, CLI, server, supervisors).

All of them are traitlets with help strings. They are read from `jupyter_mlcluster_config.py`
/ `.json` on the Jupyter config path (so `c.MLClusterConfig.cpu_slots = 16` in that file
reaches kernels, the CLI and the server alike); a few also have environment variables,
which win, because a job's supervisor and ranks inherit the submitter's environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Config, Configurable

from .patterns import tensorboard_dir_problem

CONFIG_FILE_BASENAME = "jupyter_mlcluster_config"


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


class MLClusterConfig(Configurable):
    store_dir = Unicode(
        help="Directory of the job store (SQLite database, payloads, logs, results). Every "
        "process that should see the same jobs must use the same directory. "
        "Env: MLCLUSTER_STORE_DIR. Default: <jupyter data dir>/mlcluster.",
    ).tag(config=True)

    @default("store_dir")
    def _default_store_dir(self) -> str:
        env = _env("MLCLUSTER_STORE_DIR")
        if env:
            return env
        from jupyter_core.paths import jupyter_data_dir

        return str(Path(jupyter_data_dir()) / "mlcluster")

    store_journal_mode = Enum(
        ["auto", "wal", "delete"],
        help="SQLite journal mode of the job store. auto: WAL (readers never wait for "
        "writers), unless the store directory is on a network filesystem (NFS, CIFS/SMB, "
        "sshfs, Lustre, GPFS, BeeGFS, CephFS, ...; judged from /proc/self/mountinfo), where "
        "WAL's shared-memory index is unsafe and the rollback journal (delete) is used, said "
        "once in the log. Every process using one store must agree: a store left in WAL "
        "mode cannot leave it while another process has it open. "
        "Env: MLCLUSTER_STORE_JOURNAL_MODE.",
    ).tag(config=True)

    @default("store_journal_mode")
    def _default_store_journal_mode(self) -> str:
        return _env("MLCLUSTER_STORE_JOURNAL_MODE") or "auto"

    default_backend = Enum(
        ["local", "kubernetes", "slurm"],
        help="Backend used when a job does not name one. Env: MLCLUSTER_BACKEND.",
    ).tag(config=True)

    @default("default_backend")
    def _default_backend(self) -> str:
        return _env("MLCLUSTER_BACKEND") or "local"

    cpu_slots = Int(
        help="CPU slots of the local pool; each rank takes --cpus of them (default 1). Ranks "
        "mostly wait on each other or on GPUs, so the default oversubscribes the cores 4x. "
        "Env: MLCLUSTER_CPU_SLOTS.",
    ).tag(config=True)

    @default("cpu_slots")
    def _default_cpu_slots(self) -> int:
        env = _env("MLCLUSTER_CPU_SLOTS")
        if env:
            return int(env)
        return max(4, 4 * (os.cpu_count() or 1))

    gpus = Unicode(
        "auto",
        help="GPUs of the local pool: 'auto' (every GPU NVML reports), 'none', or a comma "
        "separated list of device indices such as '0,1'. Env: MLCLUSTER_GPUS.",
    ).tag(config=True)

    @default("gpus")
    def _default_gpus(self) -> str:
        return _env("MLCLUSTER_GPUS") or "auto"

    memory_limit = Int(
        0,
        help="Bytes of memory the local pool hands out to jobs that ask for --memory "
        "(0 = the machine's total memory).",
    ).tag(config=True)

    max_workers = Int(
        256,
        help="Largest number of ranks one job may ask for, on any backend.",
    ).tag(config=True)

    max_result_mib = Int(
        1024,
        help="Most MiB (pickled) a job's rank 0 may return as its result (the cell's value, "
        "the function's return, --pull); a bigger one fails the job saying so (save it to a "
        "file instead). It is written to the job store, whose disk all jobs share. 0: no cap.",
    ).tag(config=True)

    max_result_json_mib = Int(
        16,
        help="Most MiB of a result's JSON form (what servers serve: GET /jobs/{id}/result, "
        "sweep listings) that is received and served. A Kubernetes job's supervisor drops a "
        "bigger JSON form as it comes (the job still succeeds, its pickled result kept for its "
        "owner's kernel); a server answers 409 for a stored one over it, saying so, without "
        "reading it. Kept separate from, and much smaller than, max_result_mib: a server shared "
        "by many users serves it. 0: no cap.",
    ).tag(config=True)

    max_log_mib = Int(
        1024,
        help="Most MiB of output (stdout and stderr, all ranks) the job store keeps per job; "
        "past it one line says 'log truncated after N MiB' and further output is dropped "
        "while the job goes on. Protects the store's disk, which all jobs share. 0: no cap.",
    ).tag(config=True)

    max_series_mib = Int(
        256,
        help="Most MiB of logged series (mlc.log, Trainer and Lightning callbacks, TensorBoard "
        "scalars: the job's series.jsonl) the job store keeps per job; past it one line in the "
        "job's log says so and further points are dropped while the job goes on. Protects the "
        "store's disk, which all jobs share. 0: no cap.",
    ).tag(config=True)

    kill_grace_period = Float(
        30.0,
        help="Seconds ranks get between SIGTERM and SIGKILL when a job is stopped "
        "(cancel, a failing rank, a timeout): torchrun's 30 s by default, so a rank's SIGTERM "
        "handler can save a checkpoint (preemption). A job's --grace overrides it.",
    ).tag(config=True)

    session_idle_timeout = Float(
        1800.0,
        help="Seconds a `--session` may stay without running a cell before it ends on its "
        "own, releasing its ranks' CPU slots and GPUs (0: never).",
    ).tag(config=True)

    session_interrupt_grace = Float(
        10.0,
        help="Seconds every rank of a `--session` gets to return from an interrupted cell "
        "(KeyboardInterrupt, or another rank's failure) before the session is restarted and "
        "its state lost (a rank stuck in a collective never returns).",
    ).tag(config=True)

    rank_cgroup = Bool(
        help="Contain each local job's ranks in a cgroup v2 of their own, where this "
        "process's cgroup is writable, so that everything they start is killed with the job "
        "(else process groups and the supervisor as child subreaper do it). "
        "Env: MLCLUSTER_RANK_CGROUP=0 to turn off.",
    ).tag(config=True)

    @default("rank_cgroup")
    def _default_rank_cgroup(self) -> bool:
        return (_env("MLCLUSTER_RANK_CGROUP") or "1").lower() not in ("0", "false", "no", "off")

    metrics_interval = Float(
        1.0,
        help="Seconds between CPU/memory/GPU samples of each running rank.",
    ).tag(config=True)

    idle_gpu_after = Float(
        600.0,
        help="Seconds a running job's GPUs must all stay under `idle_gpu_percent` "
        "utilisation before the job is flagged as holding idle GPUs (its `gpu_idle_since`, "
        "shown in the cell monitor and the sidebar, and counted in the server's "
        "mlcluster_idle_gpu_jobs). 0 turns the flag off.",
    ).tag(config=True)

    idle_gpu_percent = Float(
        5.0,
        help="GPU utilisation (percent, mean over a rank's GPUs) under which a rank's GPUs "
        "count as idle for `idle_gpu_after`.",
    ).tag(config=True)

    stall_after = Float(
        300.0,
        min=0.0,
        help="Seconds a running rank may go without printing, reporting progress or using CPU "
        "before its job is flagged stalled (the ranks, since when, and their folded stacks "
        "taken then: in the job's record, the monitor, `mlcluster jobs`, /metrics). A job's "
        "--stall-after overrides it; 0 turns the watch off. The local and Slurm backends watch.",
    ).tag(config=True)

    straggler_after = Float(
        30.0,
        min=0.0,
        help="Seconds over which a running rank's step rate (from its `mlc.progress`/tqdm "
        "reports) must stay 1.5x under the median of its peers' before it is named a "
        "straggler (in the job's record, the monitor, `mlcluster jobs`, /metrics), on every "
        "backend. 0 turns it off.",
    ).tag(config=True)

    stacks_reader = Enum(
        ["auto", "py-spy", "helper"],
        default_value="auto",
        help="How a local job's ranks' stacks are read: auto (py-spy, else the rank's own "
        "faulthandler helper where ptrace is refused or py-spy is missing), py-spy only, or "
        "the helper only.",
    ).tag(config=True)

    py_spy = Unicode(
        "",
        help="The py-spy executable that reads ranks' stacks (default: the one installed with "
        "this package, beside its Python, else $PATH's).",
    ).tag(config=True)

    stacks_helper = Bool(
        True,
        help="Arm each local rank's own stack helper (faulthandler on SIGUSR2, only while the "
        "signal has its default action): the stacks' reader where ptrace is refused.",
    ).tag(config=True)

    tensorboard_dir = Unicode(
        "",
        help="Where jobs write TensorBoard data unless `--tensorboard DIR` says otherwise: an "
        "absolute path (a shared volume on Kubernetes) or a URI TensorBoard reads such as "
        "'s3://bucket/runs/{job}'; `{job}` becomes the job id. Empty: local jobs use a "
        "directory in the job store, Kubernetes jobs get no MLCLUSTER_TENSORBOARD_DIR.",
    ).tag(config=True)

    @validate("tensorboard_dir")
    def _check_tensorboard_dir(self, proposal):
        value = proposal["value"]
        if not value:
            return ""
        problem = tensorboard_dir_problem(value, option="MLClusterConfig.tensorboard_dir")
        if problem:
            raise TraitError(problem)
        return value.strip()

    track = Enum(
        ["none", "mlflow"],
        default_value="none",
        help="Record every job in this experiment tracker unless its `--track` says otherwise: "
        "none, or mlflow (one MLflow run a job, at mlflow_tracking_uri).",
    ).tag(config=True)

    mlflow_tracking_uri = Unicode(
        "",
        help="Where `--track mlflow` records runs: a tracking server's URL "
        "(http://mlflow.example:5000) or any URI MLflow takes. Empty: MLflow's local store in "
        "the job store, sqlite:///<store>/mlflow/mlflow.db (a 0700 directory with the runs' "
        "artifacts; nothing to start). A server shared by many users refuses --track mlflow "
        "while it is empty.",
    ).tag(config=True)

    mlflow_ranks = Enum(
        ["0", "all"],
        default_value="0",
        help="Whose logged series a tracked job's MLflow run gets as metrics: 0, rank 0's; "
        "all, every rank's too, each rank past 0 in a child run of the job's run tagged "
        "mlcluster.rank. A job's own --env MLCLUSTER_MLFLOW_RANKS=0|all says otherwise.",
    ).tag(config=True)

    tracking_grace = Float(
        60.0,
        help="Seconds a tracked job's supervisor spends, after the job has ended, recording "
        "the rest (metrics, logs, its end) in a tracker it cannot reach, before giving up "
        "(saying so in the job's log; the job's own state never depends on it).",
    ).tag(config=True)

    supervise_together = Bool(
        True,
        help="Supervise the jobs of backends that allow it (Kubernetes, except sessions) in "
        "one process per store and cluster, a fleet, instead of a process per job: a job "
        "then costs memory, not a process. False: a supervisor process per job, as before.",
    ).tag(config=True)

    warm_pool = Bool(
        help="Start ranks from a warm, CUDA-clean zygote process that has already imported "
        "the heavy modules (much faster starts). Env: MLCLUSTER_WARM_POOL=0 to turn off.",
    ).tag(config=True)

    @default("warm_pool")
    def _default_warm_pool(self) -> bool:
        return (_env("MLCLUSTER_WARM_POOL") or "1").lower() not in ("0", "false", "no", "off")

    warm_pool_modules = List(
        Unicode(),
        ["torch", "numpy"],
        help="Modules every warm-pool generation imports ahead of time: the pinned list "
        "(those not installed are skipped), e.g. add 'transformers' so even a kernel's first "
        "cell starts warm. A module that initialises CUDA or starts a thread on import is "
        "refused by the pool's own check.",
    ).tag(config=True)

    warm_pool_learn = Bool(
        True,
        help="Let the warm pool learn what to preload: a %%distributed cell sends the "
        "installed packages its kernel has imported, `mlcluster run` those its script imports "
        "at its top; the pool builds a generation that has them in the background and the "
        "next job starts from it. False: only warm_pool_modules.",
    ).tag(config=True)

    warm_pool_max_memory = Int(
        4 * 1024**3,
        help="Bytes of memory (PSS) the idle warm pool may use over all its generations; "
        "over it the oldest generations retire and the pool learns no more modules until "
        "there is room. 0: no bound.",
    ).tag(config=True)

    warm_pool_max_env_generations = Int(
        4,
        help="Generations of the warm pool keyed by a job's own values of variables the "
        "preloaded modules read at import or the interpreter reads at start (HF_HOME, "
        "PYTHONHASHSEED, ...) that may run at once. A job no generation fits starts cold "
        "while one with its values is prepared for the next such job; at this many, none "
        "is (a variable that changes with every job never multiplies the pool). 0: none.",
    ).tag(config=True)

    warm_pool_idle_timeout = Float(
        1800.0,
        help="Seconds an unused warm-pool generation stays up before it exits on its own "
        "(a generation superseded by one that preloads more retires at once).",
    ).tag(config=True)

    warm_pool_size = Int(
        0,
        help="Ranks kept pre-forked and waiting in the warm pool (0 = fork on demand, which "
        "already takes milliseconds).",
    ).tag(config=True)

    # -- kubernetes ---------------------------------------------------------------------

    kubernetes_namespace = Unicode(
        "",
        help="Namespace for Kubernetes jobs. Default: the pod's own namespace in a cluster, "
        "else the kubeconfig context's namespace, else 'default'.",
    ).tag(config=True)

    kubernetes_image = Unicode(
        "",
        help="Image for Kubernetes ranks when --image is not given. Default: the image of the "
        "notebook pod this runs in (so the environment matches).",
    ).tag(config=True)

    kubernetes_wheel_cache = Unicode(
        "",
        help="A directory on a PersistentVolumeClaim the notebook pod mounts (ReadWriteMany) "
        "that serves as the wheel cache of jobs running the notebook's own image: at submit, "
        "the notebook puts wheels of the packages installed since its pod started there, and "
        "the job's pods mount the same claim (read-only, same path) and install from it "
        "without the package index. Empty, or not on a claim: the pods install from the "
        "index the notebook's pip uses.",
    ).tag(config=True)

    kubernetes_engine = Enum(
        ["auto", "trainjob", "pytorchjob", "tfjob", "indexed-job"],
        "auto",
        help="How Kubernetes jobs run: 'auto' uses Kubeflow Trainer v2 (TrainJob, for pytorch "
        "and jax) when the cluster serves it, else the Kubeflow Training Operator (PyTorchJob/"
        "TFJob) when its CRDs exist, else an Indexed Job plus a headless Service.",
    ).tag(config=True)

    kubernetes_trainer_runtimes = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        default_value={"pytorch": "torch-distributed", "jax": "jax-distributed"},
        help="The Kubeflow Trainer v2 ClusterTrainingRuntime each --framework's TrainJobs run "
        "on. A submit naming a runtime the cluster does not have fails at once, listing the "
        "runtimes it has.",
    ).tag(config=True)

    kubernetes_gang = Enum(
        ["none", "volcano", "kueue", "training-operator"],
        "none",
        help="Gang scheduling on Kubernetes: Volcano PodGroups, Kueue queues, the Training "
        "Operator's schedulingPolicy, or none.",
    ).tag(config=True)

    kubernetes_service_account = Unicode(
        "",
        help="Service account of rank pods ('' = the namespace default).",
    ).tag(config=True)

    kubernetes_schedule_service_account = Unicode(
        "",
        help="Service account of the pods a schedule's CronJob starts. They submit jobs, so it "
        "needs what the notebook pods' account has (mlcluster manifests --user-namespace). "
        "'' = the service account of the pod that registers the schedule, else the default.",
    ).tag(config=True)

    kubernetes_queue = Unicode(
        "",
        help="Default Volcano queue or Kueue LocalQueue for jobs that pass no --queue "
        "('' = none; Kueue needs one).",
    ).tag(config=True)

    kubernetes_priority_classes = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="PriorityClass name for each --priority value used on Kubernetes, e.g. "
        "{'10': 'training-high', '-10': 'training-low'}. Priority 0 needs no entry (the "
        "cluster's default); any other priority without an entry is refused at submit.",
    ).tag(config=True)

    kubernetes_gpus_per_node = Int(
        0,
        help="GPUs of one GPU node. When set, a PyTorchJob or pytorch TrainJob packs as many "
        "ranks into each pod "
        "as fit one node (torchrun inside the pod, NCCL over NVLink) instead of one rank per "
        "pod. 0 = one rank per pod.",
    ).tag(config=True)

    kubernetes_delete_timeout = Float(
        120.0,
        help="Seconds the job supervisor waits for a finished or cancelled job's objects and "
        "pods to be gone from the cluster (foreground deletion) before it stops waiting.",
    ).tag(config=True)

    kubernetes_session_channel_timeout = Float(
        60.0,
        help="Seconds a Kubernetes `--session`'s supervisor keeps trying to reach a rank's pod "
        "over the session channel (reconnecting with backoff after a drop) before the session "
        "ends, failed, saying which rank could not be reached.",
    ).tag(config=True)

    kubernetes_request_timeout = Float(
        10.0,
        help="Seconds a single Kubernetes API request (not a watch or log stream) may take.",
    ).tag(config=True)

    slurm_partition = Unicode(
        "",
        help="Slurm partition of jobs that pass no --queue ('' = the cluster's default partition).",
    ).tag(config=True)

    slurm_account = Unicode(
        "",
        help="Slurm account jobs are charged to (sbatch --account; '' = the user's default).",
    ).tag(config=True)

    slurm_extra_args = List(
        Unicode(),
        help="More sbatch options for every Slurm job, e.g. ['--constraint=a100', "
        "'--exclusive']. Checked with the rest by `sbatch --test-only` at submit.",
    ).tag(config=True)

    slurm_bin_dir = Unicode(
        "",
        help="Directory holding sbatch, squeue, scancel, scontrol and sinfo ('' = found on "
        "PATH). The notebook must reach the cluster's controller with them (a login node, "
        "or a notebook started by batchspawner/Open OnDemand on a compute node).",
    ).tag(config=True)

    slurm_python = Unicode(
        "",
        help="Python interpreter the ranks run on the compute nodes ('' = the notebook's "
        "own, sys.executable: it must be on the filesystem the nodes share).",
    ).tag(config=True)

    slurm_priority_qos = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="Slurm QOS for each --priority value, e.g. {'10': 'high', '-10': 'low'}. A "
        "priority without an entry is a nice value instead: negative --priority = sbatch "
        "--nice=<-priority> (lower); positive needs Slurm operator rights (Slurm refuses "
        "it at submit otherwise).",
    ).tag(config=True)

    slurm_poll_interval = Float(
        1.0,
        help="Seconds between the Slurm watcher's looks at the user's jobs: one squeue call "
        "(and sacct for jobs that left squeue) per interval per user and host, whatever "
        "the number of jobs.",
    ).tag(config=True)

    slurm_command_timeout = Float(
        30.0,
        help="Seconds one sbatch/squeue/scancel/scontrol/sinfo call may take before it is "
        "killed and retried (with jittered backoff, a few times at most).",
    ).tag(config=True)


def load_config(extra: Config | None = None) -> Config:
    """Read jupyter_mlcluster_config.{py,json} from the Jupyter config path, like a
    Jupyter application would, for processes that are not Jupyter applications."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.application import Application

    merged = Config()
    paths = jupyter_config_path()
    for config, _filename in Application._load_config_files(CONFIG_FILE_BASENAME, path=paths):
        merged.merge(config)
    if extra is not None:
        merged.merge(extra)
    return merged


def get_config(extra: Config | None = None) -> MLClusterConfig:
    return MLClusterConfig(config=load_config(extra))
