"""`--track mlflow`: the job as one MLflow run, recorded from its supervisor.

The run is made when the job starts, in the experiment named by the job's
$MLFLOW_EXPERIMENT_NAME (else "mlcluster"), with the job's options and pushed scalars as
params (params.py); rank 0's logged series (jobs/storage/series.py) go to it as metrics as
they come, and with MLClusterConfig.mlflow_ranks "all" (or the job's
$MLCLUSTER_MLFLOW_RANKS) every other rank's to a child run of it tagged mlcluster.rank (MLflow's
metrics have no tags; a run a rank keeps the job's run comparable with other jobs'); when the
job ends, its logs, cell and result as artifacts, and its end as the
run's status. A sweep's trials are children of one parent run (made by the first trial to
start, ended by the last to end). Where the run is (run id, a link on a tracking server) is
the job's `tracking` field.

The tracker is a thread of the supervisor: the job never waits for it and never fails
because of it. A tracking server that cannot be reached is retried with a capped backoff
(said once in the job's log, and in `tracking.state`); after the job ends, what is left is
pushed for at most MLClusterConfig.tracking_grace seconds, then given up, saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ...runtime.atomic import write_whole
from ..backoff import Backoff
from ..storage.series import SERIES_FILE
from .params import job_params

if TYPE_CHECKING:
    from ..running.supervisor import JobContext

PUSH_INTERVAL = 2.0  # seconds between pushes of new points
RETRY = Backoff(first=1.0, cap=30.0)
BATCH = 1000  # metrics in one log_batch (MLflow's own limit)
EXPERIMENT = "mlcluster"
# MLflow's client retries a request for minutes by default: the backoff here is ours.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
JOIN_SLACK = 120.0  # seconds a supervisor waits for its tracker beyond the grace
OFFSET_FILE = "mlflow-offset"  # how far into series.jsonl the run has its points
RANK_RUNS_FILE = "mlflow-ranks.json"  # {rank: run id}: ranks past 0's child runs (mlflow_ranks)
RANKS_ENV = "MLCLUSTER_MLFLOW_RANKS"  # a job's own choice of MLClusterConfig.mlflow_ranks
_MLFLOW_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ :]")  # what MLflow refuses in a metric's name
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


LOCAL_STORE = "mlflow"  # the default local store's directory in the job store (0700)


def tracking_uri(setting: str, store_root: Path) -> str:
    """The setting, else MLflow's local store (its default since file stores were retired)
    inside the job store: a directory of its owner's only, the database 0600 (a store in the
    submit directory was world-readable, its artifacts in the supervisor's ./mlruns)."""
    if setting:
        return setting
    folder = Path(store_root) / LOCAL_STORE
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    db = folder / "mlflow.db"
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))  # sqlite's journals take its mode
    os.chmod(db, 0o600)
    return f"sqlite:///{db}"


def local_artifacts(store_root: Path, uri: str) -> Path | None:
    """Where the default local store keeps runs' artifacts; None for another store."""
    folder = Path(store_root) / LOCAL_STORE
    return folder / "artifacts" if uri == f"sqlite:///{folder / 'mlflow.db'}" else None


def purge_local_run(store_root: Path, tracking: dict[str, Any] | None) -> None:
    """`cancel --purge`: the job's run's artifacts (its logs, cell, result) in the default
    local store go with the job (the run's row, params and metrics stay in the 0600 db)."""
    tracking = tracking or {}
    folder = local_artifacts(store_root, str(tracking.get("uri") or ""))
    run = str(tracking.get("run_id") or "")
    if folder is not None and re.fullmatch(r"[0-9a-f]{32}", run):  # an experiment's runs
        shutil.rmtree(folder / run, ignore_errors=True)  # are <its artifact_location>/<run id>


def shown_uri(uri: str) -> str:
    """`uri` as the job's record (GET /jobs) and log show it: without a user and password
    (`user:token@`), a query string or a fragment, where tokens are put."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else f"{host}{parts.path}"


def experiment_name(job: Any) -> str:
    """The job's experiment: $MLFLOW_EXPERIMENT_NAME, else EXPERIMENT; on a server shared by
    many users (its origin says so), under its owner's name (`alice/...`): the server's
    MLflow credentials record every user's runs, and one must not log into another's."""
    name = str(job.spec.env.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT)
    origin = job.origin or {}
    owner = str(origin.get("user") or "") if origin.get("shared") else ""
    if owner and not name.startswith(f"{owner}/"):
        name = f"{owner}/{name}"
    return name


def all_ranks(job: Any, config: Any) -> bool:
    """Whether every rank's series go to MLflow (else rank 0's): the job's $RANKS_ENV, else
    MLClusterConfig.mlflow_ranks."""
    choice = str(job.spec.env.get(RANKS_ENV) or getattr(config, "mlflow_ranks", "0"))
    return choice.strip().lower() == "all"


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page on a tracking server (a local store has none: `mlflow ui` serves it)."""
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return None


def mlflow_name(name: str) -> str:
    """A series' name as MLflow takes a metric's (letters, digits, _ - . / space :): a name
    it would refuse must not stop every later point of the run."""
    return _MLFLOW_UNSAFE.sub("_", name)[:250] or "_"


class MLflowTracker:
    def __init__(self, ctx: JobContext, uri: str):
        self.ctx = ctx
        self.store = ctx.store
        self.job = ctx.job
        self.uri = uri
        self.shown = shown_uri(uri)  # what the job's record and log say: no secrets
        self.grace = float(getattr(ctx.config, "tracking_grace", 60.0))
        self.job_dir = self.store.job_dir(self.job.id)
        saved = self.job.tracking or {}
        # An adopted job (a new supervisor) goes on with its run.
        self.run_id: str | None = saved.get("run_id") if saved.get("uri") == self.shown else None
        self.experiment_id: str | None = saved.get("experiment_id")
        self.params_done = self.run_id is not None
        self.offset = self._saved_offset() if self.run_id else 0
        self.all_ranks = all_ranks(self.job, ctx.config)
        self.rank_runs: dict[int, str] = self._saved_rank_runs() if self.run_id else {}
        self.failures = 0
        self.stop = threading.Event()
        self._client: Any = None
        self.thread = threading.Thread(target=self._main, name="mlflow", daemon=True)
        self._record("pending", None)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """The job has ended: push the rest, end the run (at most FINAL_DEADLINE)."""
        self.stop.set()
        # The grace counts from when the thread sees the end; before that it may be importing
        # mlflow or in a request (each at most MLFLOW_HTTP_REQUEST_TIMEOUT).
        self.thread.join(self.grace + JOIN_SLACK)

    # -- the thread ----------------------------------------------------------------------

    def _main(self) -> None:
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        delay, deadline = 0.0, None
        while True:
            if deadline is None:
                if self.stop.wait(delay):
                    deadline = time.monotonic() + self.grace
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._say(
                        f"[mlcluster] MLflow: gave up recording the job's end at {self.shown} "
                        f"after {self.grace:g} s (the job's own state is unchanged)"
                    )
                    self._record("unreachable", "gave up after the job ended")
                    return
                time.sleep(min(delay, left))
            final = deadline is not None
            try:
                self._push(final)
            except Exception as exc:  # noqa: BLE001 - tracking never fails the job
                self.failures += 1
                message = f"{type(exc).__name__}: {self._hide(str(exc))[:300]}"
                if self.failures == 1:
                    self._say(
                        f"[mlcluster] MLflow at {self.shown} cannot be reached ({message}); "
                        "retrying with backoff, the job runs on"
                    )
                self._record("unreachable", message)
                delay = RETRY.delay(self.failures - 1)
                continue
            if self.failures:
                self._say(f"[mlcluster] MLflow at {self.shown} reached again")
                self.failures = 0
            if final:
                return
            delay = PUSH_INTERVAL

    def _push(self, final: bool) -> None:
        client = self._mlflow_client()
        if self.run_id is None:
            self._create_run(client)
        if not self.params_done:
            from mlflow.entities import Param

            values = {**job_params(self.job_dir, self.spec()), **self._trial_params()}
            params = [Param(k, v) for k, v in values.items()]
            for i in range(0, len(params), 100):
                client.log_batch(self.run_id, params=params[i : i + 100])
            self.params_done = True
            self._record("active", None)
        self._push_points(client)
        if final:
            self._push_artifacts(client)
            state = str(self.store.get_job(self.job.id).state)
            for run_id in [*self.rank_runs.values(), self.run_id]:
                client.set_terminated(run_id, STATUS.get(state, "FINISHED"))
            self._record("finished", None)
            self._end_parent(client)

    def _trial_params(self) -> dict[str, str]:
        """A sweep trial's parameters (a script's come as arguments, not pushed)."""
        sweep = (self.job.origin or {}).get("sweep")
        if not sweep:
            return {}
        from ..experiments.store import ExperimentStore

        for trial in ExperimentStore.for_jobs(self.store).trials(str(sweep["id"])):
            if trial.get("job_id") == self.job.id:
                return {k: str(v)[:500] for k, v in (trial.get("params") or {}).items()}
        return {}

    def spec(self) -> dict[str, Any]:
        return self.job.spec.to_dict()

    def _mlflow_client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            artifacts = local_artifacts(self.store.root, self.uri)
            if artifacts is None:
                self._client = MlflowClient(tracking_uri=self.uri)
            else:
                # Two supervisors meeting a new local database both run MLflow's schema
                # migrations (the client does, when made), and one fails midway ("table
                # _alembic_tmp_metrics already exists"): it is made under a lock.
                with open(artifacts.parent / "init.lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _experiment(self, client: Any) -> str:
        name = experiment_name(self.job)
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        artifacts = local_artifacts(self.store.root, self.uri)
        try:  # (MLflow's default artifact root is ./mlruns of the process)
            location = artifacts.as_uri() if artifacts else None
            return str(client.create_experiment(name, artifact_location=location))
        except Exception:  # another job made it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def _create_run(self, client: Any) -> None:
        self.experiment_id = self._experiment(client)
        tags = {
            "mlcluster.job_id": self.job.id,
            "mlcluster.job_name": self.job.name,
            "mlcluster.backend": self.job.spec.backend,
        }
        sweep = (self.job.origin or {}).get("sweep")
        if sweep:
            tags["mlcluster.sweep_id"] = str(sweep.get("id"))
            tags["mlflow.parentRunId"] = self._parent_run(client, sweep)
        run = client.create_run(self.experiment_id, tags=tags, run_name=self.job.name)
        self.run_id = run.info.run_id
        self._record("active", None)

    def _push_points(self, client: Any) -> None:
        from mlflow.entities import Metric

        path = self.job_dir / SERIES_FILE
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read(16 << 20)
        except OSError:
            return
        pos = 0
        metrics: dict[str, list[Any]] = {}  # by run
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break  # being written: next time
            pos += len(raw)
            try:
                batch = json.loads(raw)
            except ValueError:
                continue
            run_id = self._run_of(client, batch.get("r"))
            if run_id is None:
                continue
            into = metrics.setdefault(run_id, [])
            for step, at, values in batch.get("p", []):
                for name, value in values.items():
                    into.append(Metric(mlflow_name(name), value, int(at * 1000), int(step)))
            if sum(map(len, metrics.values())) >= BATCH:
                self._log_metrics(client, metrics, self.offset + pos)
                metrics = {}
        self._log_metrics(client, metrics, self.offset + pos)

    def _run_of(self, client: Any, rank: Any) -> str | None:
        """The run a rank's points go to: rank 0's the job's; another's its own child run
        (made on its first point) when every rank's are recorded, else none."""
        if rank == 0:
            return self.run_id
        if not (self.all_ranks and isinstance(rank, int) and rank > 0):
            return None
        if rank not in self.rank_runs:
            tags = {
                "mlflow.parentRunId": str(self.run_id),
                "mlcluster.rank": str(rank),
                "mlcluster.job_id": self.job.id,
            }
            run = client.create_run(
                self.experiment_id, tags=tags, run_name=f"{self.job.name} rank {rank}"
            )
            self.rank_runs[rank] = str(run.info.run_id)
            with contextlib.suppress(OSError):  # (lost: an adopted job makes the run again)
                write_whole(self.job_dir / RANK_RUNS_FILE, json.dumps(self.rank_runs))
        return self.rank_runs[rank]

    def _saved_rank_runs(self) -> dict[int, str]:
        try:
            saved = json.loads((self.job_dir / RANK_RUNS_FILE).read_text())
            return {int(rank): str(run) for rank, run in saved.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _log_metrics(self, client: Any, metrics: dict[str, list[Any]], offset: int) -> None:
        for run_id, points in metrics.items():
            for i in range(0, len(points), BATCH):
                client.log_batch(run_id, metrics=points[i : i + BATCH])
        if offset != self.offset:
            self.offset = offset
            with contextlib.suppress(OSError):  # (lost: an adopted job's points go twice)
                (self.job_dir / OFFSET_FILE).write_text(str(offset))

    def _saved_offset(self) -> int:
        try:
            return int((self.job_dir / OFFSET_FILE).read_text())
        except (OSError, ValueError):
            return 0

    def _push_artifacts(self, client: Any) -> None:
        logs = self.store.log_dir(self.job.id)
        if logs.is_dir() and any(logs.iterdir()):
            client.log_artifacts(self.run_id, str(logs), "logs")
        for path, where in (
            (self.store.result_json_path(self.job.id), "result"),
            (self.job_dir / "cell.py", "code"),
        ):
            if path.is_file():
                client.log_artifact(self.run_id, str(path), where)

    # -- a sweep's parent run ------------------------------------------------------------

    def _parent_file(self, sweep_id: str) -> Path:
        folder = self.store.root / "tracking"
        folder.mkdir(exist_ok=True)
        return folder / f"{sweep_id}.json"

    def _parent_run(self, client: Any, sweep: dict[str, Any]) -> str:
        """The sweep's parent run: made by the first trial here (an exclusive lock file),
        read by the others."""
        path = self._parent_file(str(sweep["id"]))
        lock = path.with_suffix(".lock")
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    return str(json.loads(path.read_text())["run_id"])
                time.sleep(0.2)
            raise RuntimeError("the sweep's parent run is not made yet") from None
        try:
            name = sweep.get("name") or str(sweep["id"])
            run = client.create_run(
                self.experiment_id,
                tags={"mlcluster.sweep_id": str(sweep["id"])},
                run_name=str(name),
            )
        except BaseException:
            lock.unlink(missing_ok=True)  # the next trial tries again
            raise
        write_whole(path, json.dumps({"run_id": run.info.run_id}))
        return str(run.info.run_id)

    def _end_parent(self, client: Any) -> None:
        """The last trial to end ends the sweep's run."""
        sweep = (self.job.origin or {}).get("sweep")
        if not sweep:
            return
        from ..experiments.store import ExperimentStore

        ids = ExperimentStore.for_jobs(self.store).jobs_of_sweep(str(sweep["id"]))
        if all(self.store.get_job(i).final for i in ids if i != self.job.id):
            parent = json.loads(self._parent_file(str(sweep["id"])).read_text())["run_id"]
            client.set_terminated(parent, "FINISHED")

    # -- what the job shows --------------------------------------------------------------

    def _record(self, state: str | None, message: str | None) -> None:
        current = dict(self.job.tracking or {})
        fresh = {
            "kind": "mlflow",
            "uri": self.shown,
            "run_id": self.run_id,
            "experiment_id": self.experiment_id,
            "url": run_url(self.shown, self.experiment_id, self.run_id)
            if self.run_id and self.experiment_id
            else None,
            "state": state or current.get("state", "pending"),
            "message": message if state is not None else current.get("message"),
        }
        if fresh != current:
            self.job.tracking = fresh
            with contextlib.suppress(Exception):  # a store hiccup costs a field, not the job
                self.store.update_job(self.job.id, tracking=fresh)

    def _hide(self, text: str) -> str:
        """An error's text without the URI's secrets (a client may quote the whole URI)."""
        text = text.replace(self.uri, self.shown)
        parts = urlsplit(self.uri)
        for secret in (parts.password, parts.query):
            if secret:
                text = text.replace(secret, "***")
        return text

    def _say(self, text: str) -> None:
        with contextlib.suppress(Exception):
            self.ctx.logs.system(text)
