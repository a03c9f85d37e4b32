"""Submit latency of the Kubernetes backend, against the API emulator (tests/kube).

    python bench/bench_k8s.py [--runs 10] [--workers 4] [--skip magic,...]

Per submit, measured from the moment the front end is asked to submit:
  submit()   - until JobService.submit returns (validated against the cluster, stored, the
               job's supervisor started): what the caller waits for
  created    - until the job object exists in the cluster (seen by a watch)
  ready      - until the job object is resumed, i.e. every object (job, payload Secrets,
               headless Service) exists and the pods may be created: "submit -> objects created"

Cases: the engine (Indexed Job + Service, or a PyTorchJob with the Training Operator CRDs
served), the size of the payload (the code alone, or with 16 MiB of pushed random bytes:
22 Secrets), the job's supervisor forked from a warm pool that has the Kubernetes client
imported or started cold, and the `%%distributed` magic in a real kernel (execute_request
to ready). Each job is cancelled (and its objects deleted) after it is measured; one
warm-up submit per case is not counted. Times are medians and 95th percentiles in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

NAMESPACE = "bench"
# The emulator runs in a process of its own, so that its work does not compete for this
# process's GIL with what is measured (as a real API server would not).
SERVE_EMULATOR = """
import sys
from pathlib import Path
from tests.kube.fixtures import start_cluster
cluster = start_cluster(Path(sys.argv[1]))
print(cluster.url, flush=True)
sys.stdin.read()  # until the benchmark ends
cluster.thread.stop()
"""


class JobWatch:
    """Watches job objects in the namespace; records when each appears and is resumed."""

    def __init__(self, url: str, api_version: str, plural: str):
        import requests

        self.created: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._cond = threading.Condition()
        prefix = "/apis/batch/v1" if api_version == "batch/v1" else f"/apis/{api_version}"
        self._url = f"{url}{prefix}/namespaces/{NAMESPACE}/{plural}"
        self._session = requests.Session()
        rv = self._session.get(self._url).json()["metadata"]["resourceVersion"]
        self._response = self._session.get(
            self._url, params={"watch": "true", "resourceVersion": rv}, stream=True
        )
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for line in self._response.iter_lines():
            now = time.perf_counter()
            event = json.loads(line)
            obj = event["object"]
            job_id = (obj.get("metadata", {}).get("labels") or {}).get("mlcluster.io/job-id")
            if not job_id:
                continue
            spec = obj.get("spec", {})
            suspended = (
                spec.get("suspend")
                if "suspend" in spec
                else spec.get("runPolicy", {}).get("suspend")
            )
            with self._cond:
                self.created.setdefault(job_id, now)
                if not suspended:
                    self.ready.setdefault(job_id, now)
                self._cond.notify_all()

    def wait_ready(self, job_id: str, timeout: float = 60.0) -> tuple[float, float]:
        with self._cond:
            if not self._cond.wait_for(lambda: job_id in self.ready, timeout):
                raise TimeoutError(f"job {job_id} was not resumed within {timeout}s")
            return self.created[job_id], self.ready[job_id]


def configure(root: Path, case: dict[str, Any]) -> None:
    settings = {
        "kubernetes_namespace": NAMESPACE,
        "kubernetes_image": "registry.example.com/notebook:1",
        "warm_pool": case["warm"],
        "warm_pool_modules": ["kubernetes"],
    }
    config_dir = root / "jupyter-config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps({"MLClusterConfig": settings})
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def api_case(
    case: dict[str, Any], runs: int, workers: int, watch: JobWatch
) -> dict[str, list[float]]:
    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.model import JobSpec
    from jupyterlab_mlcluster.jobs.service import JobService
    from jupyterlab_mlcluster.runtime.payload import Payload

    service = JobService()
    push = {"blob": os.urandom(case["payload"])} if case["payload"] else {}
    samples: dict[str, list[float]] = {"submit": [], "created": [], "ready": []}
    for i in range(runs + 1):
        spec = JobSpec.from_options({"backend": "kubernetes", "workers": workers})
        t0 = time.perf_counter()
        record = service.submit(spec, Payload(kind="code", source="print('hi')", push=push))
        t_submit = time.perf_counter()
        created, ready = watch.wait_ready(record.id)
        service.cancel(record.id)
        if i:
            samples["submit"].append(t_submit - t0)
            samples["created"].append(created - t0)
            samples["ready"].append(ready - t0)
    return samples


def magic_case(runs: int, workers: int, watch: JobWatch) -> dict[str, list[float]]:
    from jupyter_client.manager import start_new_kernel

    import jupyterlab_mlcluster.backends  # noqa: F401 - fills the backend registry
    from jupyterlab_mlcluster.jobs.service import JobService

    service = JobService()
    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    samples: dict[str, list[float]] = {"submit": [], "created": [], "ready": []}
    try:

        def quiet(msg):
            return None

        kc.execute_interactive("import jupyterlab_mlcluster", timeout=60, output_hook=quiet)
        for i in range(runs + 1):
            known = {r.id for r in service.store.list_jobs()[0]}
            cell = f"%%distributed --backend kubernetes --workers {workers} --no-wait --quiet\nprint('hi')\n"
            t0 = time.perf_counter()
            reply = kc.execute_interactive(cell, timeout=60, output_hook=quiet)
            t_reply = time.perf_counter()
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"the cell failed: {reply['content']}")
            (job_id,) = {r.id for r in service.store.list_jobs()[0]} - known
            created, ready = watch.wait_ready(job_id)
            service.cancel(job_id)
            if i:
                samples["submit"].append(t_reply - t0)
                samples["created"].append(created - t0)
                samples["ready"].append(ready - t0)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return samples


def isolated_environment(prefix: str) -> Path:
    """A fresh temporary directory holding the job store, Jupyter config, warm pool and
    kubeconfig of this run, named in os.environ (for this process and those it starts)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["MLCLUSTER_STORE_DIR"] = str(root / "store")
    os.environ["JUPYTER_CONFIG_DIR"] = str(root / "jupyter-config")
    os.environ["MLCLUSTER_WARM_POOL_DIR"] = str(root / "warm-pool")
    # Processes started elsewhere (the warm pool starts in /) import this checkout's code.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    os.environ["KUBECONFIG"] = str(root / "kubeconfig.yaml")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--skip", default="", help="comma-separated case names to skip")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    root = isolated_environment("bench-k8s-")
    emulator = subprocess.Popen(
        [sys.executable, "-c", SERVE_EMULATOR, os.environ["KUBECONFIG"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert emulator.stdout is not None
    url = emulator.stdout.readline().strip()
    from tests.kube.crds import training_operator_crds
    from tests.kube.helpers import Kube

    kube = Kube(url)
    kube.create_namespace(NAMESPACE)

    cases = [
        {"name": "indexed-job", "engine": "indexed-job", "payload": 0, "warm": True},
        {"name": "indexed-job+16MiB", "engine": "indexed-job", "payload": 16 * 2**20, "warm": True},
        {"name": "indexed-job cold", "engine": "indexed-job", "payload": 0, "warm": False},
        {"name": "pytorchjob", "engine": "pytorchjob", "payload": 0, "warm": True},
        {"name": "magic", "engine": "indexed-job", "payload": 0, "warm": True},
    ]
    rows = []
    for case in cases:
        if case["name"] in skip:
            continue
        configure(root, case)
        if case["engine"] == "pytorchjob":
            for crd in training_operator_crds():
                kube.install_crd(crd)
            watch = JobWatch(url, "kubeflow.org/v1", "pytorchjobs")
        else:
            watch = JobWatch(url, "batch/v1", "jobs")
        # (the watch ends with the emulator)
        if case["name"] == "magic":
            samples = magic_case(args.runs, args.workers, watch)
        else:
            samples = api_case(case, args.runs, args.workers, watch)
        if case["engine"] == "pytorchjob":
            for crd in training_operator_crds():
                kube.uninstall_crd(crd["metadata"]["name"])
        rows.append((case["name"], samples))
        print(f"  {case['name']}: done", file=sys.stderr, flush=True)

    header = f"{'case':<20} {'submit() ms':>18} {'created ms':>18} {'ready ms':>18}"
    print(f"\nKubernetes submit latency, {args.workers} ranks, {args.runs} runs (median / p95)\n")
    print(header)
    print("-" * len(header))
    for name, samples in rows:
        cells = [
            f"{statistics.median(v) * 1000:7.1f} / {percentile(v, 0.95) * 1000:7.1f}"
            for v in (samples["submit"], samples["created"], samples["ready"])
        ]
        print(f"{name:<20} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18}")
    from jupyterlab_mlcluster.config import get_config
    from jupyterlab_mlcluster.jobs import warm

    warm.stop(get_config())  # the zygote this benchmark started
    emulator.communicate("")


if __name__ == "__main__":
    main()
