"""Sweeps and schedules on the Kubernetes backend, against the API emulator.

Schedules: a real batch/v1 CronJob (validated against the 1.33 schemas, strict) plus its
Secret; the CronJob's pod command run for real submits the stored job, which the cluster
side (player) runs to the end. Sweeps: a trial beyond --parallel creates nothing in the
cluster until a slot frees."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
from helpers import run_cli

from jupyterlab_mlcluster.backends.kubernetes.schedules import (
    MOUNT_PATH,
    new_secret_name,
    schedule_cronjob,
    schedule_secret,
)
from jupyterlab_mlcluster.jobs.experiments.store import ExperimentStore
from jupyterlab_mlcluster.jobs.model import SpecError
from tests.kube.jobs_fixtures import log_text

ROW = {
    "name": "nightly",
    "owner": "alice@example.com",
    "cron": "0 2 * * *",
    "timezone": "Europe/Paris",
    "concurrency": "Forbid",
    "starting_deadline": 600.0,
    "successful_history": 3,
    "failed_history": 1,
    "suspended": False,
    "spec": {"workers": 2, "framework": "none", "backend": "kubernetes"},
}


def test_the_cronjob_and_its_secret_validate_strictly():
    secret = schedule_secret(ROW, b"payload", namespace="team-a", name=new_secret_name("nightly"))
    cronjob = schedule_cronjob(
        ROW, namespace="team-a", image="img:1", secret=secret, service_account="runner"
    )
    assert secret["metadata"]["name"] != new_secret_name("nightly")  # unguessable, fresh
    for obj in (cronjob, secret):
        kubernetes_validate.validate(obj, desired_version="1.33", strict=True)
    spec = cronjob["spec"]
    assert (spec["schedule"], spec["timeZone"], spec["concurrencyPolicy"]) == (
        "0 2 * * *",
        "Europe/Paris",
        "Forbid",
    )
    assert spec["startingDeadlineSeconds"] == 600
    assert (spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (3, 1)
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "runner" and pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["command"][:3] == ["mlcluster", "schedule", "submit"]
    with pytest.raises(SpecError, match="at most"):
        schedule_secret(ROW, b"x" * (1024 * 1024), namespace="team-a", name="s")


def mounted(secret: dict, directory: Path) -> Path:
    """What the kubelet does with the Secret volume: one file per key."""
    directory.mkdir()
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


def test_schedule_add_creates_a_cronjob_whose_pod_really_submits_the_job(
    k8s, player, kube, kube_namespace, tmp_path
):
    service = k8s()
    planted = {"payload.pkl": base64.b64encode(b"attacker's pickle").decode()}
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "mlcluster-nightly", "namespace": kube_namespace},
            "data": planted,
        }
    )
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('scheduled run, rank', os.environ['RANK'])\n")
    added = run_cli(
        "schedule",
        "add",
        "--backend",
        "kubernetes",
        "--workers",
        "2",
        "--framework",
        "none",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Paris",
        "--concurrency",
        "Forbid",
        "--name",
        "nightly",
        str(script),
    )
    assert added.returncode == 0, added.stderr
    cronjob = kube.get("batch/v1", "CronJob", "mlcluster-nightly", kube_namespace)
    secret_name = cronjob["metadata"]["annotations"]["mlcluster.io/schedule-secret"]
    secret = kube.get("v1", "Secret", secret_name, kube_namespace)
    assert (
        secret["metadata"]["uid"]
        == cronjob["metadata"]["annotations"]["mlcluster.io/schedule-secret-uid"]
    )
    # Attack: user B's Secret pre-created under the old, guessable name is never used.
    assert kube.get("v1", "Secret", "mlcluster-nightly", kube_namespace)["data"] == planted
    kubernetes_validate.validate(
        {k: v for k, v in cronjob.items() if k != "status"}, desired_version="1.33", strict=False
    )
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    # local schedulers leave it to the cluster
    from jupyterlab_mlcluster.jobs.experiments.scheduler import Scheduler

    assert Scheduler(service).fire_due(now=4_000_000_000.0) == []

    # The CronJob controller's part: a pod from the job template, the Secret mounted.
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    mount = mounted(secret, tmp_path / "mount")
    command = [c.replace(MOUNT_PATH, str(mount)) for c in container["command"]]
    env = dict(os.environ, **{e["name"]: e["value"] for e in container["env"]})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    pod = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        first = pod.stdout.readline()
        assert "submitted job" in first, (
            first,
            pod.stderr.read() if pod.poll() is not None else "",
        )
        job_id = first.split("submitted job ")[1].split()[0]
        player.play(job_id)
        out, err = pod.communicate(timeout=120)
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait()
    assert pod.returncode == 0, err
    record = service.wait(job_id, timeout=60)
    assert record.state == "succeeded" and record.spec.workers == 2
    assert record.name.startswith("nightly-20") and record.backend == "kubernetes"
    assert record.origin["schedule"] == "nightly"
    assert sorted(log_text(service, job_id)) == [
        "0:scheduled run, rank 0",
        "1:scheduled run, rank 1",
    ]
    assert "[rank 0] scheduled run, rank 0" in out  # the pod's log is the run's output

    assert run_cli("schedule", "pause", "nightly").returncode == 0
    assert kube.get("batch/v1", "CronJob", "mlcluster-nightly", kube_namespace)["spec"]["suspend"]
    assert run_cli("schedule", "resume", "nightly").returncode == 0
    assert not kube.get("batch/v1", "CronJob", "mlcluster-nightly", kube_namespace)["spec"][
        "suspend"
    ]
    assert run_cli("schedule", "delete", "nightly").returncode == 0
    kube.wait_for(
        lambda: (
            kube.find("batch/v1", "CronJob", "mlcluster-nightly", kube_namespace) is None
            and kube.find("v1", "Secret", secret_name, kube_namespace) is None
        ),
        message="CronJob and Secret deleted",
    )
    # ... nor deleted as ours.
    assert kube.get("v1", "Secret", "mlcluster-nightly", kube_namespace)["data"] == planted
    assert ExperimentStore.for_jobs(service.store).list_schedules() == []


def test_a_refused_cronjob_leaves_nothing_behind(k8s, kube, kube_namespace, tmp_path):
    service = k8s()
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    path = f"/apis/batch/v1/namespaces/{kube_namespace}/cronjobs"
    kube.on_emulator(lambda e: e["post", path] << 403)
    added = run_cli(
        "schedule",
        "add",
        "--backend",
        "kubernetes",
        "--cron",
        "0 2 * * *",
        "--name",
        "nightly",
        str(script),
    )
    assert added.returncode == 2 and "could not create the schedule" in added.stderr
    assert kube.list("v1", "Secret", kube_namespace) == []
    assert ExperimentStore.for_jobs(service.store).list_schedules() == []
    assert json.loads(run_cli("schedule", "list", "--json").stdout) == []


def test_a_sweep_on_kubernetes_creates_a_trial_only_when_a_slot_is_free(
    k8s, player, kube, kube_namespace
):
    from helpers import wait_for

    from jupyterlab_mlcluster.jobs.experiments.sweep import submit_sweep
    from jupyterlab_mlcluster.jobs.experiments.sweeps import parse_sweep
    from tests.kube.jobs_fixtures import code, spec_of
    from tests.kube.player import objects_of

    service = k8s()
    sweep = submit_sweep(
        service,
        spec_of(workers=2, framework="none"),
        code("x * 10\n"),
        parse_sweep(["x=1,2"], parallel=1),
        origin={"kind": "test"},
    )
    first, second = sweep.job_ids
    player.resumed(first)
    waiting = wait_for(
        lambda: (r := service.store.get_job(second)).reason and "sweep slot" in r.reason and r,
        timeout=30,
        message="the second trial waiting for a slot",
    )
    assert waiting.state == "queued"
    assert objects_of(kube, kube_namespace, second) == {}  # nothing of it in the cluster yet
    player.play(first)
    assert service.wait(first, timeout=60).state == "succeeded"
    player.play(second)
    assert service.wait(second, timeout=60).state == "succeeded"
    assert [t.value for t in sweep.trials] == [10, 20]
