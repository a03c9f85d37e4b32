"""`--tensorboard DIR` / REST `tensorboard` / MLClusterConfig.tensorboard_dir: the directory
a real local job's ranks get as $MLCLUSTER_TENSORBOARD_DIR, `{job}` filled in; bad values
are refused before anything is submitted."""

from __future__ import annotations

import pytest

from .helpers import submit, wait_final

# Each rank leaves a marker in the directory it was given.
MARK = """
import os, pathlib
d = pathlib.Path(os.environ["MLCLUSTER_TENSORBOARD_DIR"])
d.mkdir(parents=True, exist_ok=True)
(d / f"rank{os.environ['RANK']}").write_text(os.environ["MLCLUSTER_JOB_ID"])
"""


@pytest.fixture
def setting_dir(tmp_path):
    return tmp_path / "shared"


@pytest.fixture
def mlc_config(setting_dir):
    return {
        "MLClusterApp": {"metrics_interval": 0},
        "MLClusterConfig": {"tensorboard_dir": str(setting_dir / "runs-{job}")},
    }


async def test_the_option_names_the_ranks_directory_with_the_job_id(api, tmp_path):
    job = await submit(api, MARK, workers=2, tensorboard=str(tmp_path / "mine" / "{job}"))
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    directory = tmp_path / "mine" / job["id"]
    assert job["tensorboard"] == str(directory)
    assert {p.name: p.read_text() for p in directory.iterdir()} == {
        "rank0": job["id"],
        "rank1": job["id"],
    }


async def test_the_setting_is_the_default_and_an_env_of_the_users_own_wins(
    api, setting_dir, tmp_path
):
    job = await submit(api, MARK)
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    directory = setting_dir / f"runs-{job['id']}"
    assert job["tensorboard"] == str(directory)
    assert (directory / "rank0").read_text() == job["id"]

    own = tmp_path / "own"
    job = await submit(api, MARK, env={"MLCLUSTER_TENSORBOARD_DIR": str(own)})
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    assert job["tensorboard"] is None and (own / "rank0").read_text() == job["id"]


@pytest.mark.parametrize(
    "value, words",
    [
        ("runs/{job}", "absolute path"),  # relative: the ranks may run elsewhere
        ("/runs/{user}", "{job}"),
        ("/runs/{job!r}", "{job}"),
        ("/runs/{", "{job}"),
        ("/runs/\nx", "absolute path"),
        ("", "absolute path"),
    ],
)
async def test_a_bad_directory_is_refused_and_nothing_is_submitted(api, value, words):
    before = (await api("GET", "jobs"))[1]
    code, answer, _ = await api("POST", "jobs", body={"code": MARK, "tensorboard": value})
    assert code == 400, answer
    # Refused by the model's words, or first by the document's shared pattern for the field.
    assert words in answer["message"] or "does not match" in answer["message"], answer
    assert (await api("GET", "jobs"))[1] == before


async def test_the_option_and_an_env_naming_the_directory_are_refused_together(api, tmp_path):
    body = {
        "code": MARK,
        "tensorboard": str(tmp_path / "a"),
        "env": {"MLCLUSTER_TENSORBOARD_DIR": str(tmp_path / "b")},
    }
    code, answer, _ = await api("POST", "jobs", body=body)
    assert code == 400 and "--tensorboard or --env" in answer["message"], answer
