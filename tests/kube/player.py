"""Playing the cluster's side of an mlcluster job, through the API like the real components:

- the Job controller / the Training Operator: create the pods of a job object once it is
  resumed (names, labels, annotations, ownerReferences and operator-injected variables as
  they set them), and report the job object's conditions;
- the scheduler and the kubelet: pod phases and container states; and the container itself:
  `run_rank` runs the real worker runtime (`python -m jupyterlab_mlcluster.runtime.worker`)
  in a local process with the pod's environment (fieldRefs resolved) and the payload it would
  mount (read back from the job's Secrets), and appends its output to the pod log as it comes.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import os
import secrets as pysecrets
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .helpers import Kube, KubeApiError

JOB_KINDS = (
    ("batch/v1", "Job"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("kubeflow.org/v1", "TFJob"),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
)
REPO = Path(__file__).resolve().parents[2]
INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RankRun:
    """A rank's container, run for real on this machine."""

    pod: str
    process: subprocess.Popen
    output: list[bytes] = field(default_factory=list)
    pump: threading.Thread | None = None

    def wait(self, timeout: float = 120) -> int:
        code = self.process.wait(timeout)
        if self.pump is not None:
            self.pump.join(timeout)
        return code

    @property
    def text(self) -> str:
        return b"".join(self.output).decode("utf-8", "replace")


class ClusterPlayer:
    def __init__(self, kube: Kube, namespace: str, workdir: Path) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.runs: list[RankRun] = []

    # -- finding the job ---------------------------------------------------------------------
    def job_object(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        """The job object mlcluster created for `job_id` (whatever its kind)."""

        def find() -> dict[str, Any] | None:
            for api_version, kind in JOB_KINDS:
                try:
                    items = self.kube.list(
                        api_version,
                        kind,
                        self.namespace,
                        label_selector=f"mlcluster.io/job-id={job_id}",
                    )
                except KubeApiError:
                    continue  # kind not served here
                if items:
                    return items[0]
            return None

        return self.kube.wait_for(find, timeout=timeout, message=f"the job object of {job_id}")

    def refresh(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.kube.get(
            job["apiVersion"], job["kind"], job["metadata"]["name"], self.namespace
        )

    @staticmethod
    def suspended(job: dict[str, Any]) -> bool:
        spec = job["spec"]
        return bool(
            spec.get("suspend")
            if job["kind"] in ("Job", "TrainJob")
            else spec["runPolicy"].get("suspend")
        )

    def resumed(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        """The job object once mlcluster (or Kueue) has let it start."""
        job = self.job_object(job_id, timeout)

        def running() -> dict[str, Any] | None:
            current = self.refresh(job)
            return None if self.suspended(current) else current

        return self.kube.wait_for(running, timeout=timeout, message="the job to be resumed")

    # -- the controllers -------------------------------------------------------------------
    def create_pods(self, job: dict[str, Any]) -> dict[int, str]:
        """What the Job controller / Training Operator does: one pod per replica. Returns
        {first rank of the pod: pod name}."""
        if job["kind"] == "Job":
            return {
                i: self._create_pod(job, i, self._indexed_pod(job, i))
                for i in range(job["spec"]["completions"])
            }
        if job["kind"] == "TrainJob":
            nodes = job["spec"]["trainer"]["numNodes"]
            per_pod = job["spec"]["trainer"].get("numProcPerNode") or 1
            return {
                i * per_pod: self._create_pod(job, i, self._trainer_pod(job, i))
                for i in range(nodes)
            }
        if job["kind"] == "TFJob":
            workers = job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
            return {
                i: self._create_pod(job, i, self._operator_pod(job, "Worker", i, i, workers))
                for i in range(workers)
            }
        replicas = job["spec"]["pytorchReplicaSpecs"]
        nodes = 1 + (replicas["Worker"]["replicas"] if "Worker" in replicas else 0)
        per_pod = int(job["spec"].get("nprocPerNode") or 1)
        pods = {0: self._create_pod(job, 0, self._operator_pod(job, "Master", 0, 0, nodes))}
        for index in range(nodes - 1):
            pods[(index + 1) * per_pod] = self._create_pod(
                job, index + 1, self._operator_pod(job, "Worker", index, index + 1, nodes)
            )
        return pods

    def _owner(self, job: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _create_pod(self, job: dict[str, Any], ordinal: int, pod: dict[str, Any]) -> str:
        pod["metadata"]["ownerReferences"] = [self._owner(job)]
        pod["metadata"]["namespace"] = self.namespace
        return self.kube.create(pod)["metadata"]["name"]

    def _indexed_pod(self, job: dict[str, Any], index: int) -> dict[str, Any]:
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        meta = template.get("metadata") or {}
        labels = {
            **meta.get("labels", {}),
            INDEX_KEY: str(index),
            "batch.kubernetes.io/job-name": name,
            "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
        }
        spec = {**template["spec"], "hostname": f"{name}-{index}"}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}-{pysecrets.token_hex(3)[:5]}",
                "labels": labels,
                "annotations": {**meta.get("annotations", {}), INDEX_KEY: str(index)},
            },
            "spec": spec,
        }

    def _trainer_pod(self, job: dict[str, Any], index: int) -> dict[str, Any]:
        """A pod of a TrainJob as Kubeflow Trainer v2.3 + JobSet + the Job controller make it:
        the runtime's `node` container with the TrainJob's trainer image/command/env/resources,
        the Trainer's PET_* variables, the runtimePatches merged in; named
        `<jobset>-node-0-<index>-<random>`, labelled as JobSet labels its pods. (The JobSet
        and its Jobs are not played: the emulator serves no JobSet; the pod's ownerReference
        names the TrainJob instead, so deletion reaches it as through the real chain.)"""
        name = job["metadata"]["name"]
        trainer = job["spec"]["trainer"]
        (patch,) = job["spec"].get("runtimePatches") or [{}]
        (node_job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod_patch = node_job["template"]["spec"]["template"]
        (container_patch,) = pod_patch["spec"]["containers"]
        master = f"{name}-node-0-0.{name}"
        env = [
            *(trainer.get("env") or []),
            {"name": "PET_NNODES", "value": str(trainer["numNodes"])},
            {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode") or 1)},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
            },
            {"name": "PET_MASTER_ADDR", "value": master},
            {"name": "PET_MASTER_PORT", "value": "29500"},
            *container_patch.get("env", []),
        ]
        container = {
            "name": "node",
            "image": trainer["image"],
            "command": trainer["command"],
            "env": env,
            "resources": trainer.get("resourcesPerNode") or {},
            "ports": [{"containerPort": 29500}],
            "volumeMounts": container_patch.get("volumeMounts", []),
        }
        spec = {
            k: v for k, v in pod_patch["spec"].items() if k not in ("containers", "initContainers")
        }
        spec.update(
            containers=[container],
            restartPolicy="Never",
            hostname=f"{name}-node-0-{index}",
            subdomain=name,
        )
        meta = pod_patch.get("metadata") or {}
        labels = {
            **meta.get("labels", {}),
            "jobset.sigs.k8s.io/jobset-name": name,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": "0",
            "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            "batch.kubernetes.io/job-name": f"{name}-node-0",
            INDEX_KEY: str(index),
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-node-0-{index}-{pysecrets.token_hex(3)[:5]}",
                "labels": labels,
                "annotations": {**meta.get("annotations", {}), INDEX_KEY: str(index)},
            },
            "spec": spec,
        }

    def _operator_pod(
        self, job: dict[str, Any], replica: str, index: int, node_rank: int, nodes: int
    ) -> dict[str, Any]:
        name = job["metadata"]["name"]
        specs = job["spec"].get("pytorchReplicaSpecs") or job["spec"].get("tfReplicaSpecs")
        template = specs[replica]["template"]
        meta = template.get("metadata") or {}
        labels = {
            **meta.get("labels", {}),
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/operator-name": f"{job['kind'].lower()}-controller",
            "training.kubeflow.org/replica-type": replica.lower(),
            "training.kubeflow.org/replica-index": str(index),
        }
        spec = {**template["spec"]}
        container = dict(spec["containers"][0])
        env = list(container.get("env") or [])
        if job["kind"] == "PyTorchJob":
            per_pod = int(job["spec"].get("nprocPerNode") or 1)
            master, port = f"{name}-master-0", "23456"
            env += [
                {"name": "MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": master},
                {"name": "WORLD_SIZE", "value": str(nodes * per_pod)},
                {"name": "RANK", "value": str(node_rank)},
                {"name": "PET_MASTER_PORT", "value": port},
                {"name": "PET_MASTER_ADDR", "value": master},
                {"name": "PET_NNODES", "value": str(nodes)},
                {"name": "PET_NPROC_PER_NODE", "value": str(per_pod)},
                {"name": "PET_NODE_RANK", "value": str(node_rank)},
            ]
        else:
            import json

            workers = [f"{name}-worker-{i}.{self.namespace}.svc:2222" for i in range(nodes)]
            env.append(
                {
                    "name": "TF_CONFIG",
                    "value": json.dumps(
                        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
                    ),
                }
            )
        container["env"] = env
        spec["containers"] = [container, *spec["containers"][1:]]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{replica.lower()}-{index}",
                "labels": labels,
                "annotations": dict(meta.get("annotations", {})),
            },
            "spec": spec,
        }

    def finish_job(
        self, job: dict[str, Any], succeeded: bool, reason: str = "", message: str = ""
    ) -> None:
        """The controller's verdict on the job object (status subresource). None to give
        when the object is gone already: mlcluster finishes a job whose ranks all succeeded
        from its pods alone and deletes the object, maybe before the controller's verdict."""
        now = _now()
        try:
            job = self.refresh(job)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            return
        if job["kind"] in ("TrainJob", "Job"):
            kind = "Complete" if succeeded else "Failed"
        else:  # Kubeflow v1 jobs
            kind = "Succeeded" if succeeded else "Failed"
        condition = {"type": kind, "status": "True", "reason": reason or kind, "message": message}
        if job["kind"] == "TrainJob":
            # JobSet's own reasons, and a message always present.
            condition["reason"] = reason or ("JobSetCompleted" if succeeded else "JobSetFailed")
            condition["message"] = message or kind
            condition["lastTransitionTime"] = now
            status = {
                "conditions": [condition],
                "jobsStatus": [
                    {
                        "name": "node",
                        "active": 0,
                        "ready": 0,
                        "succeeded": 1 if succeeded else 0,
                        "failed": 0 if succeeded else 1,
                        "suspended": 0,
                    }
                ],
            }
        elif job["kind"] == "Job":
            condition.update(lastProbeTime=now, lastTransitionTime=now)
            status = {"conditions": [condition], "startTime": now}
            if succeeded:
                status["completionTime"] = now
        else:
            condition.update(lastUpdateTime=now, lastTransitionTime=now)
            status = {"conditions": [condition], "replicaStatuses": {}, "startTime": now}
        try:
            self.kube.patch(
                job["apiVersion"],
                job["kind"],
                job["metadata"]["name"],
                {"status": status},
                self.namespace,
                subresource="status",
            )
        except KubeApiError as exc:
            if exc.status != 404:
                raise

    # -- scheduler and kubelet -------------------------------------------------------------
    def schedule(self, pod: str) -> None:
        """Placed on a node; the container is being created."""
        now = _now()
        self.kube.patch(
            "v1",
            "Pod",
            pod,
            {
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
                    ],
                }
            },
            self.namespace,
            subresource="status",
        )

    def pod_environment(self, pod: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet would give it (fieldRefs resolved)."""
        env: dict[str, str] = {}
        meta = pod["metadata"]
        for item in pod["spec"]["containers"][0].get("env") or []:
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            source, _, key = path.partition("[")
            bag = {
                "metadata.annotations": meta.get("annotations", {}),
                "metadata.labels": meta.get("labels", {}),
            }[source]
            env[item["name"]] = bag[key.strip("]'")]
        return env

    def payload_dir(self, pod: dict[str, Any]) -> Path:
        """The pod's projected payload volume, materialised from the Secrets it names."""
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "payload")
        target = self.workdir / f"payload-{pod['metadata']['name']}"
        target.mkdir(parents=True, exist_ok=True)
        for source in volume["projected"]["sources"]:
            secret = self.kube.get("v1", "Secret", source["secret"]["name"], self.namespace)
            for item in source["secret"]["items"]:
                (target / item["path"]).write_bytes(base64.b64decode(secret["data"][item["key"]]))
        return target

    def run_rank(
        self,
        pod_name: str,
        *,
        extra_env: dict[str, str] | None = None,
        python_env: Path | None = None,
        pod_ip: str | None = None,
    ) -> RankRun:
        """Start the pod's container: Running, the real worker, output into the pod log as
        it is written. `python_env`: the image's Python environment (a venv) - then the
        container's own command runs, with `python` that environment's interpreter.
        `pod_ip`: the pod's IP in its status (127.0.0.1: reachable here, as a session's
        supervisor reaches its pods)."""
        pod = self.kube.get("v1", "Pod", pod_name, self.namespace)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
        command = [sys.executable, "-m", "jupyterlab_mlcluster.runtime.worker"]
        if python_env is not None:
            env["PATH"] = os.pathsep.join([str(python_env / "bin"), env.get("PATH", "")])
            command = pod["spec"]["containers"][0]["command"]
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env.update(self.pod_environment(pod))
        env["MLCLUSTER_PAYLOAD"] = str(self.payload_dir(pod))
        env["MASTER_ADDR"] = "127.0.0.1"  # pod DNS names do not resolve here
        env.update(extra_env or {})
        if pod_ip is None:
            self.kube.set_pod_phase(self.namespace, pod_name, "Running")
        else:
            self.kube.set_pod_phase(self.namespace, pod_name, "Running", pod_ip=pod_ip)
        process = subprocess.Popen(
            command,
            env=env,
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        run = RankRun(pod_name, process)
        self.runs.append(run)

        def pump() -> None:
            assert process.stdout is not None
            while chunk := process.stdout.read1(65536):
                run.output.append(chunk)
                try:
                    self.kube.append_log(self.namespace, pod_name, chunk.decode("utf-8", "replace"))
                except KeyError:
                    return  # the pod is gone (deleted): its log with it

        run.pump = threading.Thread(target=pump, daemon=True)
        run.pump.start()
        return run

    def end_rank(self, run: RankRun, timeout: float = 120) -> int:
        """The container exited: the kubelet reports the pod Succeeded or Failed."""
        code = run.wait(timeout)
        try:
            if code == 0:
                self.kube.set_pod_phase(self.namespace, run.pod, "Succeeded")
            else:
                self.kube.set_pod_phase(self.namespace, run.pod, "Failed", exit_code=code)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
        return code

    def evict(
        self,
        run: RankRun,
        reason: str = "EvictionByEvictionAPI",
        message: str = "Eviction API: evicting",
    ) -> int:
        """What an eviction does to a running pod: the API server marks it (DisruptionTarget)
        and deletes it gracefully; the kubelet sends the container SIGTERM, SIGKILL after the
        pod's terminationGracePeriodSeconds (30 s unless set), reports it Failed (the mark
        kept) and lets it go. Returns the container's exit status."""
        import signal

        pod = self.kube.get("v1", "Pod", run.pod, self.namespace)
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        mark = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": _now(),
        }
        conditions = [*(pod.get("status") or {}).get("conditions", []), mark]
        self.kube.patch(
            "v1",
            "Pod",
            run.pod,
            {"status": {"conditions": conditions}},
            self.namespace,
            subresource="status",
        )
        run.process.send_signal(signal.SIGTERM)
        try:
            code = run.process.wait(grace)
        except subprocess.TimeoutExpired:
            run.process.kill()
            code = run.process.wait(30)
        if run.pump is not None:
            run.pump.join(30)
        now = _now()
        status = self.kube.get("v1", "Pod", run.pod, self.namespace)["status"]
        container = pod["spec"]["containers"][0]
        terminated = {"exitCode": code if code >= 0 else 128 - code, "reason": "Error"}
        terminated.update(startedAt=now, finishedAt=now)
        status.update(
            phase="Failed",
            conditions=[c for c in status.get("conditions", []) if c["type"] != "Ready"]
            + [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            containerStatuses=[
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": f"docker.io/{container['image']}@sha256:0",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            ],
        )
        self.kube.patch(
            "v1", "Pod", run.pod, {"status": status}, self.namespace, subresource="status"
        )
        with contextlib.suppress(KubeApiError):
            self.kube.delete("v1", "Pod", run.pod, self.namespace)
        return code

    def end_when_exited(self, run: RankRun) -> threading.Thread:
        """The kubelet's part while the container lives on (a session's rank): once it
        exits, however and whenever, its pod says so."""

        def wait() -> None:
            with contextlib.suppress(KeyError, KubeApiError, subprocess.TimeoutExpired):
                self.end_rank(run, timeout=3600)

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return thread

    def kill_deleted(self) -> None:
        """What a kubelet does for a deleted pod: stop its container."""
        for run in self.runs:
            if (
                run.process.poll() is None
                and self.kube.find("v1", "Pod", run.pod, self.namespace) is None
            ):
                run.process.kill()
                run.wait(30)

    def stop_all(self) -> None:
        for run in self.runs:
            if run.process.poll() is None:
                run.process.kill()
            run.wait(30)

    def play(
        self, job_id: str, *, finish_job: bool = True, timeout: float = 120
    ) -> dict[int, RankRun]:
        """The whole happy story: pods created, scheduled, run for real, reported finished."""
        job = self.resumed(job_id)
        pods = self.create_pods(job)
        for pod in pods.values():
            self.schedule(pod)
        runs = {rank: self.run_rank(pod) for rank, pod in pods.items()}
        codes = {rank: self.end_rank(run, timeout) for rank, run in runs.items()}
        if finish_job:
            try:
                self.finish_job(job, succeeded=all(c == 0 for c in codes.values()))
            except KubeApiError as exc:
                if exc.status != 404:  # mlcluster may already have deleted it
                    raise
        return runs


def objects_of(kube: Kube, namespace: str, job_id: str) -> dict[str, list[str]]:
    """Every object of one job still in the namespace, by kind (kinds not served are skipped)."""
    found: dict[str, list[str]] = {}
    kinds = (
        ("v1", "Pod"),
        ("v1", "Secret"),
        ("v1", "Service"),
        *JOB_KINDS,
        ("scheduling.volcano.sh/v1beta1", "PodGroup"),
    )
    for api_version, kind in kinds:
        try:
            items = kube.list(
                api_version, kind, namespace, label_selector=f"mlcluster.io/job-id={job_id}"
            )
        except KubeApiError:
            continue
        if items:
            found[kind] = [i["metadata"]["name"] for i in items]
    return found
