"""POST /jobs/{id}/export (issue 35, item 5): the export as one zip, the same files as
`mlcluster export`; an unknown target is 400; on a server shared through the identity
header another user's job is 404, as a missing one, and nothing of it is sent."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest
import yaml
from export_jobs import store_cell_job

from tests.helpers import rest_call

ALICE, MALLORY = "alice@example.com", "mallory@example.com"


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterApp": {"trust_identity_header": True}}


async def test_a_job_exports_as_a_zip_and_another_users_is_404(api, mlc, jp_fetch):
    record = store_cell_job(mlc.service, owner=ALICE, env={"LR": "0.1"})
    alice = {"kubeflow-userid": ALICE}
    response = await rest_call(
        jp_fetch,
        "POST",
        "jobs",
        record.id,
        "export",
        params={"as": "pytorchjob", "image": "pytorch/pytorch:2.5.1"},
        headers=alice,
    )
    assert response.code == 200, response.body
    assert response.headers["Content-Type"] == "application/zip"
    assert "train-cell4-pytorchjob.zip" in response.headers["Content-Disposition"]
    files = zipfile.ZipFile(io.BytesIO(response.body))
    assert sorted(files.namelist()) == [
        "requirements.txt",
        "train_cell4.py",
        "train_cell4.yaml",
        "variables.pkl",
    ]
    configmap, job = yaml.safe_load_all(files.read("train_cell4.yaml"))
    assert (configmap["kind"], job["kind"]) == ("ConfigMap", "PyTorchJob")
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == "pytorch/pytorch:2.5.1"
    assert {"name": "LR", "value": "0.1"} in container["env"]
    # The zip's variables are the job's stored payload, byte for byte: nothing was loaded.
    assert files.read("variables.pkl") == mlc.service.store.payload_path(record.id).read_bytes()

    code, error, _ = await api(
        "POST", "jobs", record.id, "export", params={"as": "docker"}, headers=alice
    )
    assert code == 400 and "docker" in error["message"]
    code, error, _ = await api(
        "POST", "jobs", record.id, "export", params={"as": "pytorchjob"}, headers=alice
    )
    assert code == 400 and "names no image" in error["message"]
    # Mallory asks for Alice's job: exactly as for a job that does not exist.
    code, error, response = await api(
        "POST",
        "jobs",
        record.id,
        "export",
        params={"as": "script"},
        headers={"kubeflow-userid": MALLORY},
    )
    assert code == 404 and error["message"] == f"no job {record.id!r}"
    assert b"variables" not in response.body
