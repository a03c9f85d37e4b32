"""`mlcluster export JOB --as pytorchjob|trainjob` (issue 35, item 5): the objects fit the
Kubernetes schemas (kubernetes-validate for the ConfigMap, the Training Operator's and
Kubeflow Trainer's published CRDs), the emulator accepts them, and the TrainJob's pods, made
as the Trainer makes them, run the exported script for real: two processes with each pod's
environment and the ConfigMap's files, meeting over gloo."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest
import yaml
from export_jobs import store_cell_job
from helpers import free_port

from jupyterlab_mlcluster.export import ExportError, export_files
from tests.k8s_schemas import validate_manifest

IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def run_pods(kube, player, namespace, job, configmap, tmp_path) -> list[str]:
    """Each pod's container as the kubelet would run it: its command, with its environment
    and the ConfigMap mounted; returns what each printed."""
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    for name, text in configmap.get("data", {}).items():
        (code_dir / name).write_text(text)
    for name, data in configmap.get("binaryData", {}).items():
        (code_dir / name).write_bytes(base64.b64decode(data))
    port = str(free_port())
    processes = []
    for pod_name in player.create_pods(job).values():
        player.schedule(pod_name)
        pod = kube.get("v1", "Pod", pod_name, namespace)
        (container,) = pod["spec"]["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "code")
        command = [sys.executable if c == "python" else c for c in container["command"]]
        command = [c.replace(mount["mountPath"], str(code_dir)) for c in command]
        env = {
            **{k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ},
            **player.pod_environment(pod),
            "MASTER_ADDR": "127.0.0.1",  # pod DNS names do not resolve here
            "MASTER_PORT": port,
        }
        processes.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = [p.communicate(timeout=180)[0].decode() for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    return outputs


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_a_kubernetes_export_fits_the_schemas_and_its_pods_run_the_script(
    target, request, service, kube, kube_namespace, player, tmp_path
):
    request.getfixturevalue("training_operator" if target == "pytorchjob" else "trainer")
    out = tmp_path / "out.txt"
    record = store_cell_job(service, env={"EXPORT_OUT": str(out)}, timeout=600)
    files = export_files(service, record.id, target, image=IMAGE)
    configmap, job = yaml.safe_load_all(files["train_cell4.yaml"])
    for obj in (configmap, job):
        validate_manifest(obj)
    assert job["kind"] == {"pytorchjob": "PyTorchJob", "trainjob": "TrainJob"}[target]
    # Nothing mlcluster's own watchers or reaper would take for one of its jobs.
    assert not [k for k in job["metadata"].get("labels", {}) if k.startswith("mlcluster.io/")]
    created = [kube.create(obj, namespace=kube_namespace) for obj in (configmap, job)]
    if target == "pytorchjob":
        # The pods the operator makes run the script with the job's variables (their
        # processes are run for the TrainJob, the engine mlcluster prefers: one is enough).
        for pod_name in player.create_pods(created[1]).values():
            pod = kube.get("v1", "Pod", pod_name, kube_namespace)
            (container,) = pod["spec"]["containers"]
            assert container["command"] == ["python", "/opt/mlcluster-export/train_cell4.py"]
            assert {"name": "EXPORT_OUT", "value": str(out)} in container["env"]
            assert container["image"] == IMAGE
        return
    run_pods(kube, player, kube_namespace, created[1], configmap, tmp_path)
    assert out.read_text() == "9 2 hihi"


def test_a_kubernetes_export_needs_an_image_and_a_framework_it_can_set_up(service):
    record = store_cell_job(service)
    with pytest.raises(ExportError, match="names no image"):
        export_files(service, record.id, "trainjob")
    jax = store_cell_job(service, framework="jax")
    with pytest.raises(ExportError, match="--framework jax"):
        export_files(service, jax.id, "pytorchjob", image=IMAGE)
