"""Kubernetes ranks get torchrun's worker variables too: the builders' pod env, resolved as
the kubelet would, completed by the rank's runtime, equals what `torchrun --nnodes=W
--nproc-per-node=1` gives node R's one worker."""

from __future__ import annotations

import pytest

from jupyterlab_mlcluster.backends.kubernetes import objects
from jupyterlab_mlcluster.jobs.model import JobSpec
from jupyterlab_mlcluster.runtime.worker import complete_environment


def resolved_env(container: dict, rank: int) -> dict[str, str]:
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:  # the fieldRefs of this rank's pod: its index
            env[item["name"]] = str(rank)
    return env


@pytest.mark.parametrize("engine", ["indexed-job", "tfjob"])
def test_pod_rank_gets_torchruns_worker_variables(engine):
    spec = JobSpec.from_options({"workers": 4, "backend": "kubernetes", "max_restarts": 2})
    template = objects.pod_template(
        "j123",
        spec,
        engine=engine,
        name="train-j123",
        image="img",
        labels={},
        chunk_count=1,
        attempt=1,
    )
    env = resolved_env(template["spec"]["containers"][0], rank=2)
    complete_environment(env)
    expected = {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "ROLE_RANK": "2",
        "ROLE_WORLD_SIZE": "4",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "2",
        "TORCHELASTIC_RUN_ID": "j123",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert env["TORCHELASTIC_ERROR_FILE"].endswith("j123-rank2-error.json")


def test_the_users_choice_wins():
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    complete_environment(env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"


@pytest.mark.parametrize("engine", ["indexed-job", "tfjob", "pytorchjob", "trainjob"])
def test_a_pod_without_gpus_gets_no_empty_cuda_visible_devices(engine):
    """torchrun sets no CUDA_VISIBLE_DEVICES; neither does a pod without GPUs. It tells the
    NVIDIA container runtime to give it none instead (a CUDA image's NVIDIA_VISIBLE_DEVICES=all
    would hand it the node's), unless the user says otherwise."""
    framework = "tensorflow" if engine == "tfjob" else "pytorch"

    def env_of(**options):
        spec = JobSpec.from_options({"workers": 2, "framework": framework, **options})
        template = objects.pod_template(
            "j1", spec, engine=engine, name="t-j1", image="img", labels={}, chunk_count=1
        )
        env = resolved_env(template["spec"]["containers"][0], rank=1)
        complete_environment(env)
        return env

    cpu_only = env_of()
    assert "CUDA_VISIBLE_DEVICES" not in cpu_only
    assert cpu_only["NVIDIA_VISIBLE_DEVICES"] == "void"
    with_gpus = env_of(gpus_per_worker=2)
    assert with_gpus["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "NVIDIA_VISIBLE_DEVICES" not in with_gpus  # the device plugin sets it
    assert env_of(env=["NVIDIA_VISIBLE_DEVICES=all"])["NVIDIA_VISIBLE_DEVICES"] == "all"
