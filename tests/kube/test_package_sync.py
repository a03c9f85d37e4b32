"""The notebook's environment in job pods: what the user pip-installed in the notebook after
its pod started is installed in each job pod before the rank runs.

Played for real, against the API emulator with Kubeflow Trainer v2 served: the notebook
pod's image is a venv that sees the test environment's packages (`image_env`); "pod start"
records its baseline (what the server extension does); then `pip install` of a tiny wheel
built here (no network). `mlcluster run` in that environment submits (a TrainJob running the
notebook pod's own image); each job pod's real command runs in a FRESH venv built the same
way: it installs exactly that package (from the wheel cache on the claim the notebook mounts)
and the rank imports it. Also: a package that cannot be installed fails the job with pip's
error before the rank runs (while pip waits on the index, the job's reason in `mlcluster jobs`
says it installs), and --no-sync-packages builds a pod without the step.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.server
import json
import os
import site
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import jsonschema
import pytest
from helpers import wait_for

from jupyterlab_mlcluster.cli import format_jobs_table
from jupyterlab_mlcluster.runtime.sync_packages import (
    CACHE_ENV,
    FILES_ENV,
    HASHES_ENV,
    REQUIREMENTS_ENV,
)
from tests.kube.crds import trainer_schema
from tests.kube.jobs_fixtures import IMAGE, log_text
from tests.kube.test_trainer_v2 import as_built

REPO = Path(__file__).resolve().parents[2]
SCRIPT = 'import tinypkg\nprint("rank imports", tinypkg.__name__, tinypkg.VALUE)\n'


def build_wheel(directory: Path, name: str, version: str, value: str) -> Path:
    """A pure-Python wheel (PEP 427: a zip of the module, METADATA, WHEEL and RECORD)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def image_env(path: Path) -> Path:
    """A Python environment played as the image's: a venv without pip of its own that sees
    this environment's packages (pip, torch, our dependencies) through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (site_packages(path) / "image.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return path


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def own_distributions(env: Path) -> set[str]:
    return {p.name for p in site_packages(env).glob("*.dist-info")}


def run_in(env: Path, *args: str, extra: dict[str, str] | None = None) -> str:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(extra or {})}
    done = subprocess.run(
        [str(env / "bin" / "python"), *args],
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def notebook_pod(kube, namespace: str, shared: Path) -> None:
    """The notebook's own pod: its image, and the claim holding the wheel cache."""
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nb-0", "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "notebook",
                        "image": IMAGE,
                        "volumeMounts": [{"name": "shared", "mountPath": str(shared)}],
                    }
                ],
                "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": "team-rwx"}}],
            },
        }
    )


@pytest.fixture
def held_index():
    """A package index (PEP 503, over HTTP) with nothing on it that answers only once
    released: a pod's pip waits on it meanwhile. Yields (its URL, the release Event)."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            release.wait(120)
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple", release
    release.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


def submit(notebook: Path, workdir: Path, *options: str, index: str | None = None) -> str:
    """`mlcluster run --no-wait` in the notebook's environment; the job id."""
    script = workdir / "train.py"
    if not script.exists():
        script.write_text(SCRIPT)
    extra = {"POD_NAME": "nb-0", "MLCLUSTER_WARM_POOL": "0"}
    if index is not None:  # the index this notebook's pip uses
        extra["PIP_INDEX_URL"] = index
    out = run_in(
        notebook,
        "-m",
        "jupyterlab_mlcluster.cli",
        "run",
        "--backend",
        "kubernetes",
        "--no-wait",
        *options,
        str(script),
        extra=extra,
    )
    return out.strip().splitlines()[-1]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_packages_installed_in_the_notebook_reach_the_job_pods(
    trainer, k8s, player, kube, kube_namespace, store_dir, tmp_path, held_index
):
    shared = tmp_path / "shared"  # the ReadWriteMany claim, mounted at the same path
    cache = shared / "wheels"
    service = k8s(kubernetes_image="", kubernetes_wheel_cache=str(cache))
    notebook_pod(kube, kube_namespace, shared)
    wheel = build_wheel(tmp_path, "tinypkg", "0.1", "synced-42")
    notebook = image_env(tmp_path / "notebook")

    # The pod starts: its environment is recorded; later the user installs a package.
    run_in(
        notebook,
        "-c",
        "import os; from jupyterlab_mlcluster import environment as e; "
        "e.record_baseline(os.environ['MLCLUSTER_STORE_DIR'])",
    )
    started = time.monotonic()
    run_in(
        notebook, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", str(wheel)
    )
    print(f"pip install in the notebook: {time.monotonic() - started:.2f} s")

    # A teammate plants a link where the wheel will go in the shared cache: it is replaced,
    # never written through.
    cache.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (cache / wheel.name).symlink_to(victim)

    started = time.monotonic()
    job_id = submit(notebook, tmp_path)
    print(f"mlcluster run --no-wait (cache filled): {time.monotonic() - started:.2f} s")
    job = player.job_object(job_id)
    jsonschema.Draft202012Validator(trainer_schema()).validate(as_built(job))
    assert job["spec"]["trainer"]["image"] == IMAGE  # the notebook's own image
    assert job["spec"]["trainer"]["command"][:3] == [
        "python",
        "-m",
        "jupyterlab_mlcluster.runtime.sync_packages",
    ]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod_spec = node["template"]["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert json.loads(env_of(container)[REQUIREMENTS_ENV]) == ["tinypkg==0.1"]  # exactly it
    assert env_of(container)[CACHE_ENV] == str(cache)
    # The cache is on a volume others may write: the pods install only the wheel the
    # notebook checked (its files are the notebook's installed ones), pinned by its hash.
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert json.loads(env_of(container)[HASHES_ENV]) == {"tinypkg==0.1": [digest]}
    size = wheel.stat().st_size  # the pods read that file alone, at that size
    assert json.loads(env_of(container)[FILES_ENV]) == {"tinypkg==0.1": [[wheel.name, size]]}
    assert {"name": "wheel-cache", "mountPath": str(shared), "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {
        "name": "wheel-cache",
        "persistentVolumeClaim": {"claimName": "team-rwx", "readOnly": True},
    } in pod_spec["volumes"]
    assert [p.name for p in cache.iterdir()] == [wheel.name]  # the notebook filled the cache
    assert (cache / wheel.name).read_bytes() == wheel.read_bytes() and not (
        cache / wheel.name
    ).is_symlink()
    assert victim.read_text() == "mine"

    # The job's pod: the image's environment, fresh; its real command installs, then runs.
    pod_env = image_env(tmp_path / "pod")
    image_has = own_distributions(pod_env)
    resumed = player.resumed(job_id)
    (pod,) = player.create_pods(resumed).values()
    player.schedule(pod)
    started = time.monotonic()
    run = player.run_rank(pod, python_env=pod_env)
    assert player.end_rank(run) == 0, run.text
    print(f"pod: install + rank: {time.monotonic() - started:.2f} s")
    player.finish_job(resumed, succeeded=True)
    assert own_distributions(pod_env) - image_has == {"tinypkg-0.1.dist-info"}
    assert "rank imports tinypkg synced-42" in run.text
    record = wait_for(lambda: (r := service.store.get_job(job_id)).final and r, message="job final")
    assert record.state == "succeeded", record.error
    lines = log_text(service, job_id)
    installed = [line for line in lines if "[mlcluster] installed" in line]
    assert installed and installed[0].startswith(
        "0:[mlcluster] installed 1 package (tinypkg==0.1) from the wheel cache in "
    ), lines
    print(installed[0])
    system = [item["line"] for item in service.logs(job_id)[0] if item["stream"] == "system"]
    assert any("each pod first installs 1 package (tinypkg==0.1)" in s for s in system), system

    # Two more submits at once: --no-sync-packages (the pod runs the image as built), and
    # one whose package the pods cannot get: someone swaps the checked wheel in the cache
    # for their own (never installed), and the notebook's index has none: that job fails
    # with pip's error, and the rank never ran.
    index, release = held_index
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plain_id = pool.submit(submit, notebook, tmp_path, "--no-sync-packages")
        failing_id = pool.submit(submit, notebook, tmp_path, index=index).result()
        plain_id = plain_id.result()
    plain = player.job_object(plain_id)
    assert plain["spec"]["trainer"]["command"][2] == "jupyterlab_mlcluster.runtime.worker"
    (patch,) = plain["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert REQUIREMENTS_ENV not in env_of(container)
    assert service.cancel(plain_id).state == "cancelled"

    build_wheel(cache, "tinypkg", "0.1", "evil")  # same name, the attacker's content
    other_env = image_env(tmp_path / "pod2")
    (pod,) = player.create_pods(player.resumed(failing_id)).values()
    player.schedule(pod)
    run = player.run_rank(pod, python_env=other_env)

    def installing():  # pip waits for the index meanwhile: the job says why it waits
        rec = service.store.get_job(failing_id)
        return (
            rec
            if "installing 1 package(s) the notebook added (rank 0)" in (rec.reason or "")
            else None
        )

    assert "installing 1 package(s)" in format_jobs_table([wait_for(installing, timeout=60)])
    release.set()
    assert player.end_rank(run) != 0
    record = wait_for(
        lambda: (r := service.store.get_job(failing_id)).final and r, message="job final"
    )
    assert record.state == "failed"
    assert "PackageSyncError" in record.error and "tinypkg==0.1" in record.error, record.error
    assert "Could not find a version that satisfies the requirement tinypkg==0.1" in record.error
    traceback = json.loads(service.store.error_path(failing_id, 0).read_text())["traceback"]
    assert "ERROR: No matching distribution found for tinypkg==0.1" in traceback, traceback
    assert "rank imports" not in run.text
    assert f"the wheel cache's {wheel.name} is not the one the notebook checked" in run.text
    assert own_distributions(other_env) == own_distributions(pod_env) - {"tinypkg-0.1.dist-info"}
