"""Attacks on Kubernetes jobs (issue 13), against the API emulator with real supervisors and
real rank processes (`ClusterPlayer`). Each test names one attack and shows it refused.

User B (the attacker) may create and delete Secrets in the namespace A's job runs in (a shared
namespace, or a careless RoleBinding), and may print anything in a rank's output (a dataset
echoing text). A's job must neither run B's code nor load B's result.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from jupyterlab_mlcluster.backends.kubernetes.payload import split_payload
from tests.attacks import FORGING_CELL, assert_forgeries_refused, evil_result
from tests.kube.emulator import RealisticKubernetes
from tests.kube.helpers import Kube
from tests.kube.jobs_fixtures import code, spec_of
from tests.kube.player import objects_of

HOLD_LIMIT = 60.0  # the most the emulator holds A's request back while B acts


def test_attack_forged_result_records_in_the_pod_log(k8s, player, kube, kube_namespace, tmp_path):
    """Both ranks print result and progress records into their pod logs, where the real ones
    travel too (mid-line, made-up MAC, another job's key, genuine but mid-line, rank 1
    posing as rank 0 with the job's key): the result is rank 0's own and nothing forged is
    ever unpickled."""
    mark = tmp_path / "unpickled"
    service = k8s()
    record = service.submit(spec_of(workers=2), code(FORGING_CELL, evil=evil_result(mark)))
    runs = player.play(record.id)
    final = service.wait(record.id, timeout=60)
    assert final.state == "succeeded", (final.error, runs[0].text, runs[1].text)
    assert_forgeries_refused(service, final, mark)
    assert objects_of(kube, kube_namespace, record.id) == {}


def _attacker_payload(mark: Path) -> str:
    """B's code, as one payload chunk: running it anywhere creates `mark`."""
    (chunk,) = split_payload(code(f"import os\nos.mkdir({str(mark)!r})").dumps())
    return base64.b64encode(chunk).decode()


def _hold_back(kube: Kube, *criteria: Any) -> Callable[[], None]:
    """The emulator holds A's first such request back until the returned function is called
    (B wins the race, however slow the machine); then it is served as usual."""
    released = asyncio.Event()

    async def late(request: Any) -> None:
        await asyncio.wait_for(released.wait(), HOLD_LIMIT)
        RealisticKubernetes._serve_realistically(request)

    kube.on_emulator(lambda e: e[criteria][:1] << late)
    return lambda: kube.on_emulator(lambda e: released.set())


def _assert_b_lost(service, kube: Kube, namespace: str, job_id: str, error: str, b_secret, mark):
    """A's job fails with `error` before anything runs; B's Secret is left as B made it, B's
    code never ran, and A's objects are gone."""
    final = service.wait(job_id, timeout=60)
    assert final.state == "failed"
    assert error in final.error
    assert _resumes(kube, namespace) == 0
    left = kube.get("v1", "Secret", b_secret["metadata"]["name"], namespace)
    assert left["metadata"]["uid"] == b_secret["metadata"]["uid"]  # untouched
    assert kube.list("v1", "Pod", namespace) == [] and not mark.exists()
    assert objects_of(kube, namespace, job_id) == {}


def _resumes(kube: Kube, namespace: str) -> int:
    jobs = re.compile(rf"/apis/batch/v1/namespaces/{namespace}/jobs/[^/]+")
    return kube.on_emulator(lambda e: len(list(e["patch", jobs])))


def _secret(name: str, namespace: str, data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {"payload-000": data},
    }


def test_attack_squatting_the_payload_secret_name(k8s, kube, kube_namespace, tmp_path):
    """B reads the payload Secret's name from A's (still suspended) job object and creates it
    first, holding B's code. A's supervisor gets 409 AlreadyExists and does not take it as its
    own: the job fails before it is resumed, B's Secret is left as it was, no pod ever runs."""
    mark = tmp_path / "b-code-ran"
    release = _hold_back(kube, "post", f"/api/v1/namespaces/{kube_namespace}/secrets")
    service = k8s()
    record = service.submit(spec_of(workers=1), code("6 * 7"))

    def job_object() -> dict[str, Any] | None:
        items = kube.list("batch/v1", "Job", kube_namespace)
        return items[0] if items else None

    job = wait_for(job_object, timeout=30, message="A's job object")
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "payload"]
    name = volume["projected"]["sources"][0]["secret"]["name"]
    assert name.startswith(f"{job['metadata']['name']}-") and len(name) > 40  # unguessable
    squatter = kube.create(_secret(name, kube_namespace, _attacker_payload(mark)))
    release()

    error = f"Secret {name} already exists and was not created by this job"
    _assert_b_lost(service, kube, kube_namespace, record.id, error, squatter, mark)


def test_attack_swapping_the_payload_secret(k8s, kube, kube_namespace, tmp_path):
    """B waits until A's payload Secret exists, deletes it and creates one of the same name
    holding B's code (immutable Secrets cannot be edited, only replaced). A's supervisor
    checks every Secret's uid before resuming the job: the job fails, nothing runs."""
    mark = tmp_path / "b-code-ran"
    release = _hold_back(  # A's uid check (a dry-run delete), not B's own delete
        kube,
        "delete",
        re.compile(rf"/api/v1/namespaces/{kube_namespace}/secrets/.+"),
        lambda request: isinstance(request.data, dict) and "dryRun" in request.data,
    )
    service = k8s()
    record = service.submit(spec_of(workers=1), code("6 * 7"))
    selector = f"mlcluster.io/job-id={record.id}"

    def payload_secret() -> dict[str, Any] | None:
        items = kube.list("v1", "Secret", kube_namespace, label_selector=selector)
        return items[0] if items else None

    original = wait_for(payload_secret, timeout=30, message="A's payload Secret")
    name = original["metadata"]["name"]
    kube.delete("v1", "Secret", name, kube_namespace)
    wait_for(lambda: kube.find("v1", "Secret", name, kube_namespace) is None, timeout=10)
    swapped = kube.create(_secret(name, kube_namespace, _attacker_payload(mark)))
    release()

    error = f"Secret {name} is no longer the one this job created"
    _assert_b_lost(service, kube, kube_namespace, record.id, error, swapped, mark)


def test_attack_kubernetes_job_keeps_no_copy_of_the_servers_environment(
    k8s, kube, kube_namespace, monkeypatch
):
    """A shared server's environment holds its credentials (cloud keys, tokens). Its
    Kubernetes jobs' launch.json in the store (readable by whoever reads the job directory,
    copied into backups) keeps none of it: the pods get only what the spec names."""
    import json

    monkeypatch.setenv("MLCLUSTER_TEST_SERVER_SECRET", "s3cr3t-of-the-server")
    service = k8s()
    record = service.submit(spec_of(workers=1, env={"WANTED": "1"}), code("6 * 7"))
    launch_file = service.store.job_dir(record.id) / "launch.json"
    launch = json.loads(launch_file.read_text())
    assert launch["env"] == {}
    assert "s3cr3t-of-the-server" not in launch_file.read_text()
    assert launch["config"]  # what the supervisor needs is still there
    job = wait_for(
        lambda: (items := kube.list("batch/v1", "Job", kube_namespace)) and items[0],
        timeout=30,
        message="the job object",
    )
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "WANTED", "value": "1"} in env
    assert not any(e["name"] == "MLCLUSTER_TEST_SERVER_SECRET" for e in env)
    service.cancel(record.id)


PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void attacker(void) {
    FILE *f = fopen(MARK, "a");
    if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
}
"""


def test_attack_a_kubernetes_jobs_env_starts_no_process_on_the_server(
    k8s, kube, kube_namespace, monkeypatch, tmp_path
):
    """Bob's Kubernetes job names LD_PRELOAD (a library he got onto the server's disk) in its
    env. His pods get it; the server must start nothing with it. The warm pool used to
    prepare a generation keyed by the job's variables for every backend, a zygote started
    here with Bob's LD_PRELOAD: his constructor ran as the server (found by a red team)."""
    import shutil
    import subprocess

    from jupyterlab_mlcluster.jobs import warm

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the attacker's preload library")
    mark = tmp_path / "ran-as-the-server"
    library = tmp_path / "libattacker.so"
    source = tmp_path / "attacker.c"
    source.write_text(PRELOAD_C)
    subprocess.run(
        [compiler, "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", str(library), str(source)],
        check=True,
    )
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "1")
    service = k8s()
    record = service.submit(spec_of(workers=1, env={"LD_PRELOAD": str(library)}), code("6 * 7"))
    job = wait_for(
        lambda: (items := kube.list("batch/v1", "Job", kube_namespace)) and items[0],
        timeout=60,
        message="the job object (its supervisor runs)",
    )
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "LD_PRELOAD", "value": str(library)} in env  # the pods get what he named
    # A keyed generation is started within the submit: give a vulnerable pool time to show.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and not mark.exists():
        time.sleep(0.1)
    assert not mark.exists(), f"the attacker's library ran in process {mark.read_text()}"
    keyed = [
        g
        for g in warm.pool_status(service.config)["generations"]
        if "LD_PRELOAD" in str(g.get("keyed_by") or g.get("overlay") or "")
    ]
    assert keyed == []
    service.cancel(record.id)
