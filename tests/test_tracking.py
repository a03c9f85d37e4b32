"""--track mlflow (issue 35): jobs recorded as runs in a real `mlflow server` started here, and
a tracking server that cannot be reached costs the job nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port, run_cli, wait_for

pytest.importorskip("mlflow")

SERVER_START = 240.0  # seconds: its database is made on first start (slow on a loaded machine)

SCRIPT = textwrap.dedent(
    """
    import argparse
    import jupyterlab_mlcluster as mlc
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float)
    lr = parser.parse_args().lr
    mlc.log(step=0, **{"acc@1": 0.5})  # a name MLflow refuses as it is
    for step in range(10):
        mlc.log(step=step, loss=lr * (10 - step))
    print("trained with", lr)
    """
)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(root / "server.log", "wb")  # closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its job runner (a pool of huey consumers for server-side jobs) is not ours to test.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,  # the server and its workers are stopped together
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                return reply.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, timeout=SERVER_START, interval=1.0, message="mlflow server up")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def settings(config_dir: Path, **values) -> None:
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": values})
    )


def test_a_sweep_is_a_parent_run_with_a_child_run_per_trial(mlflow_server, store_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    settings(tmp_path / "jupyter-config", mlflow_tracking_uri=mlflow_server)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MLFLOW_EXPERIMENT_NAME": "issue35"}
    out = run_cli(
        "run",
        "--track",
        "mlflow",
        "--sweep",
        "lr=0.5,0.25",
        "--parallel",
        "1",
        "--env",
        "MLFLOW_EXPERIMENT_NAME=issue35",
        str(script),
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr

    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    jobs = sorted(JobStore(store_dir).list_jobs()[0], key=lambda r: r.created)
    assert len(jobs) == 2
    client = MlflowClient(tracking_uri=mlflow_server)

    def recorded() -> bool:  # each trial's supervisor ends its run after the job has ended
        return all(
            (JobStore(store_dir).get_job(j.id).tracking or {}).get("state") == "finished"
            for j in jobs
        )

    wait_for(recorded, timeout=120, interval=0.5, message="both runs ended")
    experiment = client.get_experiment_by_name("issue35")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    (parent,) = parents
    assert parent.data.tags["mlcluster.sweep_id"] == jobs[0].origin["sweep"]["id"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    wait_for(
        lambda: client.get_run(parent.info.run_id).info.status == "FINISHED",
        timeout=30,
        message="the last trial ends the sweep's run",
    )
    for job in jobs:
        tracking = JobStore(store_dir).get_job(job.id).tracking
        run = client.get_run(tracking["run_id"])
        assert tracking["url"] == (
            f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
        )
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlcluster.job_id"] == job.id
        lr = float(run.data.params["lr"])
        assert run.data.params["track"] == "mlflow" and run.data.params["workers"] == "1"
        assert run.data.params["env"] == "MLFLOW_EXPERIMENT_NAME", "names, never values"
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [(m.step, m.value) for m in history] == [(s, lr * (10 - s)) for s in range(10)]
        assert run.data.metrics["acc_1"] == 0.5, "renamed, and no later point was stopped"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "logs")}
        assert artifacts == {"logs/rank-0.log"}
        log_text = Path(
            client.download_artifacts(run.info.run_id, "logs/rank-0.log", str(tmp_path))
        )
        assert f"trained with {lr}" in log_text.read_text()


@pytest.fixture
def unreachable(store_dir, tmp_path):
    """Settings naming a tracking server nobody listens at (written before the service)."""
    uri = f"http://mlc-user:pass-{os.urandom(4).hex()}@127.0.0.1:{free_port()}/?token=tk-secret"
    settings(tmp_path / "jupyter-config", mlflow_tracking_uri=uri, tracking_grace=3)
    return uri


def test_an_unreachable_tracker_never_fails_the_job(unreachable, service):
    """Nothing listens at the tracking URI: the job succeeds, says once that MLflow cannot be
    reached, shows it in its record, and gives up after the grace (its supervisor ends)."""
    from jupyterlab_mlcluster.jobs.model import JobSpec, SpecError
    from jupyterlab_mlcluster.runtime.payload import Payload

    secret = unreachable.split(":")[2].split("@")[0]
    uri = "http://127.0.0.1:" + unreachable.split(":")[3].split("/")[0] + "/"  # (T4: shown bare)
    source = "import time, jupyterlab_mlcluster as mlc\nfor i in range(5):\n    mlc.log(x=i)\n    time.sleep(0.5)\n"
    spec = JobSpec.from_options({"workers": 1, "track": "mlflow"})
    job_id = service.submit(spec, Payload(source=source)).id
    record = service.wait(job_id, timeout=120)
    assert record.state == "succeeded", record.error
    wait_for(
        lambda: "gave up" in ((service.store.get_job(job_id).tracking or {}).get("message") or ""),
        timeout=60,
        interval=0.2,
        message="the tracker gives up after the grace",
    )
    tracking = service.store.get_job(job_id).tracking
    assert tracking["state"] == "unreachable" and tracking["uri"] == uri
    text = "\n".join(line["line"] for line in service.logs(job_id, 0)[0])
    assert text.count(f"MLflow at {uri} cannot be reached") == 1, text
    assert "retrying with backoff, the job runs on" in text
    assert f"gave up recording the job's end at {uri} after 3 s" in text
    listed = json.dumps([r.to_json() for r in service.store.list_jobs()[0]])
    for hidden in (secret, "tk-secret", "mlc-user"):
        assert hidden not in text and hidden not in listed, hidden
    # The series are the job's whatever the tracker did.
    assert len(run_cli("metrics", job_id, "--csv").stdout.splitlines()) == 6
    # Bad input: an unknown tracker is refused before anything is stored.
    with pytest.raises(SpecError, match="track"):
        JobSpec.from_options({"track": "wandb"})


LOOK = r"""
import json, os, sys
base, marker = sys.argv[1], sys.argv[2].encode()
read, refused = [], []
for folder, _, files in os.walk(base):
    for name in files:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                if marker in f.read():
                    read.append(os.path.join(folder, name))
        except OSError:
            refused.append(os.path.join(folder, name))
for path in sys.argv[3:]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        read.append(path)
    except OSError:
        refused.append(path)
print(json.dumps({"read": read, "refused": refused}))
"""


@pytest.fixture
def intruder():
    """Another Unix user, made for this test and removed after it."""
    import secrets
    import shutil

    if os.geteuid() != 0:
        pytest.skip("making another Unix user (useradd) needs root")
    if shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs useradd and /usr/bin/python3")
    name = f"mlc-intruder-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def test_attack_another_unix_user_reads_no_local_mlflow_run(intruder, monkeypatch):
    """T3: with the default tracking URI the run went to <submit cwd>/mlflow.db (0644) and
    its artifacts (the job's logs) to the supervisor's ./mlruns (0755), where another user of
    the machine read them, and a purge left them. Now the local store is in the job store, a
    0700 directory with a 0600 database and its artifacts, and a purge takes the run's."""
    import shutil
    import tempfile

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.runtime.payload import Payload

    base = Path(tempfile.mkdtemp(prefix="mlc-track-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)  # the place others may look: a shared /tmp, a home directory
        work, store = base / "work", base / "store"
        work.mkdir(mode=0o755)
        monkeypatch.setenv("MLCLUSTER_STORE_DIR", str(store))
        monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(base / "config"))
        monkeypatch.chdir(work)
        service = JobService()
        os.chmod(store, 0o711)  # passable: the mlflow directory's own mode is what is tested
        marker = "secret-" + os.urandom(4).hex()
        source = f"print({marker!r})\n"
        spec = JobSpec.from_options({"workers": 1, "track": "mlflow", "name": marker})
        job_id = service.submit(spec, Payload(source=source)).id
        assert service.wait(job_id, timeout=120).state == "succeeded"
        wait_for(
            lambda: (service.store.get_job(job_id).tracking or {}).get("state") == "finished",
            timeout=120,
            interval=0.2,
            message="the run is recorded",
        )
        tracking = service.store.get_job(job_id).tracking
        folder = store / "mlflow"
        run_dir = folder / "artifacts" / tracking["run_id"]
        named = [str(folder / "mlflow.db"), str(run_dir / "artifacts" / "logs" / "rank-0.log")]
        look = subprocess.run(
            ["runuser", "-u", intruder, "--", "/usr/bin/python3", "-c", LOOK, str(base), marker]
            + named,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert look.returncode == 0, look.stderr
        seen = json.loads(look.stdout)
        assert seen["read"] == [], seen
        assert set(named) <= set(seen["refused"])
        assert not (work / "mlflow.db").exists() and not (work / "mlruns").exists()
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert os.stat(folder / "mlflow.db").st_mode & 0o777 == 0o600
        assert marker in (run_dir / "artifacts" / "logs").joinpath("rank-0.log").read_text()
        service.cancel(job_id, purge=True)
        assert not run_dir.exists(), "a purge takes the run's artifacts"
    finally:
        shutil.rmtree(base, ignore_errors=True)


# Slow: two jobs' supervisors record into MLflow (about 5 s), past the fast tier's limit.
@pytest.mark.slow
def test_a_shared_servers_job_logs_only_into_its_owners_experiments(store_dir, tmp_path):
    """T4b: the supervisor records with the server's MLflow credentials, and the experiment
    came from the job's env: on a shared server (its origin says so) the experiment is under
    the owner's name, whatever the env names; elsewhere the name is the env's."""
    from mlflow.tracking import MlflowClient

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.runtime.payload import Payload

    uri = f"sqlite:///{tmp_path / 'team.db'}"
    settings(tmp_path / "jupyter-config", mlflow_tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # the database made here, before the supervisors use it
    service = JobService()
    jobs = []
    for origin in ({"kind": "rest", "user": "mallory", "shared": True}, None):
        env = {"MLFLOW_EXPERIMENT_NAME": "alice/private"}
        spec = JobSpec.from_options({"workers": 1, "track": "mlflow", "env": env})
        job_id = service.submit(spec, Payload(source="1\n"), origin=origin).id
        jobs.append(job_id)
        assert service.wait(job_id, timeout=120).state == "succeeded"
        wait_for(
            lambda job_id=job_id: (
                (service.store.get_job(job_id).tracking or {}).get("state") == "finished"
            ),
            timeout=120,
            interval=0.2,
            message="the run is recorded",
        )
    shared_run = client.get_run(service.store.get_job(jobs[0]).tracking["run_id"])
    own_run = client.get_run(service.store.get_job(jobs[1]).tracking["run_id"])
    assert client.get_experiment(shared_run.info.experiment_id).name == "mallory/alice/private"
    assert client.get_experiment(own_run.info.experiment_id).name == "alice/private"


RANKS = """
import os, jupyterlab_mlcluster as mlc
rank = int(os.environ["RANK"])
for step in range(5):
    mlc.log(step=step, loss=10 * rank + step)
"""


def test_every_ranks_series_goes_to_a_child_run_tagged_with_its_rank(
    mlflow_server, store_dir, tmp_path
):
    """mlflow_ranks "all": rank 0's series stay the job's run's metrics, and each other rank's
    go to a child run of it tagged mlcluster.rank (only rank 0's reached MLflow)."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.jobs.tracking.mlflow_run import all_ranks
    from jupyterlab_mlcluster.runtime.payload import Payload

    settings(tmp_path / "jupyter-config", mlflow_tracking_uri=mlflow_server, mlflow_ranks="all")
    service = JobService()
    env = {"MLFLOW_EXPERIMENT_NAME": "issue35-ranks"}
    spec = JobSpec.from_options({"workers": 2, "track": "mlflow", "env": env})
    job_id = service.submit(spec, Payload(source=RANKS)).id
    assert service.wait(job_id, timeout=180).state == "succeeded"
    wait_for(
        lambda: (service.store.get_job(job_id).tracking or {}).get("state") == "finished",
        timeout=120,
        interval=0.2,
        message="the run is recorded",
    )
    client = MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(service.store.get_job(job_id).tracking["run_id"])
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, s) for s in range(5)], "rank 0's"
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'"
    )
    assert [c.data.tags["mlcluster.rank"] for c in children] == ["1"]
    (child,) = children
    assert child.info.status == "FINISHED" and child.data.tags["mlcluster.job_id"] == job_id
    history = client.get_metric_history(child.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 10 + s) for s in range(5)]
    # A job's own env says otherwise than the setting, either way.
    config = SimpleNamespace(mlflow_ranks="all")
    job = SimpleNamespace(spec=SimpleNamespace(env={"MLCLUSTER_MLFLOW_RANKS": "0"}))
    assert not all_ranks(job, config) and all_ranks(job, SimpleNamespace(mlflow_ranks="0")) is False
    job.spec.env["MLCLUSTER_MLFLOW_RANKS"] = "all"
    assert all_ranks(job, SimpleNamespace(mlflow_ranks="0"))


@pytest.mark.parametrize("shared", [True, False])
def test_a_shared_servers_scheduled_run_records_under_its_owners_name(service, tmp_path, shared):
    """T4b for what a shared server submits itself: the runs of its users' schedules (its
    scheduler fires them) record under the owner's name as a job posted by the owner does;
    a server not shared keeps the env's name."""
    from types import SimpleNamespace

    from jupyterlab_mlcluster.jobs.experiments.scheduler import create_schedule
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.tracking.mlflow_run import experiment_name
    from jupyterlab_mlcluster.runtime.payload import Payload
    from jupyterlab_mlcluster.server.scheduling import ServerScheduler

    path = tmp_path / "job.py"
    path.write_text("print('tick')\n")
    env = {"MLFLOW_EXPERIMENT_NAME": "bob/private"}
    create_schedule(
        service,
        spec=JobSpec.from_options({"framework": "none", "env": env}),
        payload=Payload(kind="script", filename=str(path)),
        options={"name": "nightly", "cron": "0 * * * *"},
        owner="alice",
        origin={"kind": "kernel"},
        now=1_000_000_000.0,
    )
    server = SimpleNamespace(service=service, trust_identity_header=shared)
    (fired,) = ServerScheduler(server, 60).scheduler.fire_due(now=1_000_000_000.0 + 3600)
    record = service.wait(fired["job_id"], timeout=120)
    assert record.state == "succeeded" and record.owner == "alice"
    assert experiment_name(record) == ("alice/bob/private" if shared else "bob/private")
