"""TensorBoard one click away: a job's scalars through the server's authenticated proxy."""

from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from .helpers import submit, wait_final

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")

WRITE_SCALARS = """
import os
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("gloo")
rank = dist.get_rank()
writer = SummaryWriter(os.path.join(os.environ["MLCLUSTER_TENSORBOARD_DIR"], f"rank{rank}"))
for step in range(20):
    writer.add_scalar("train/loss", 1.0 / (step + 1) + rank, step)
writer.close()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def mlc_config():
    return {"MLClusterApp": {"tensorboard_reload_interval": 1.0, "metrics_interval": 0}}


async def get(jp_base_url, jp_http_port, path: str, token: str | None, **kwargs):
    url = f"http://localhost:{jp_http_port}{path}"
    headers = {"Authorization": f"token {token}"} if token else {}
    return await AsyncHTTPClient().fetch(
        url, headers=headers, raise_error=False, follow_redirects=False, **kwargs
    )


async def test_a_jobs_scalars_in_tensorboard_only_with_authentication(
    api, mlc, jp_base_url, jp_http_port, jp_serverapp
):
    job = await submit(api, WRITE_SCALARS, workers=2, name="tb")
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    code, answer, _ = await api("POST", "jobs", job["id"], "tensorboard")
    assert code == 200, answer
    url = answer["url"]
    assert url.startswith(jp_base_url) and url.endswith("/") and answer["jobs"] == [job["id"]]
    token = jp_serverapp.identity_provider.token

    page = await get(jp_base_url, jp_http_port, url, token)
    assert page.code == 200 and b"<tb-webapp>" in page.body, page.body[:300]
    # Without the trailing slash: redirected to the directory, under the server's base URL.
    bare = await get(jp_base_url, jp_http_port, url.rstrip("/"), token)
    assert bare.code in (301, 302) and bare.headers["Location"].endswith(url), bare.headers
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # TensorBoard reads the event files in the background
        tags = await get(jp_base_url, jp_http_port, url + "data/plugin/scalars/tags", token)
        assert tags.code == 200, tags.body
        runs = json.loads(tags.body)
        if f"{job['id']}/rank0" in runs and f"{job['id']}/rank1" in runs:
            break
        assert asyncio.get_running_loop().time() < deadline, runs
        await asyncio.sleep(0.5)
    assert "train/loss" in runs[f"{job['id']}/rank0"]

    # The same job again: the same TensorBoard.
    code, again, _ = await api("POST", "jobs", job["id"], "tensorboard")
    assert code == 200 and again["url"] == url and len(mlc.tensorboards.running) == 1

    # Without the token: refused, on the page and on its data.
    for path in (url, url + "data/plugin/scalars/tags"):
        refused = await get(jp_base_url, jp_http_port, path, None)
        assert refused.code in (302, 403), refused.code
        assert b"train/loss" not in (refused.body or b"")
    # A wrong token too.
    refused = await get(
        jp_base_url, jp_http_port, url + "data/plugin/scalars/tags", "not-the-token"
    )
    assert refused.code in (302, 403) and b"train/loss" not in (refused.body or b"")
    # Nothing else listens: TensorBoard is bound to loopback only.
    (process,) = mlc.tensorboards.running.values()
    import psutil

    listening = [
        c.laddr.ip
        for c in psutil.Process(process.process.pid).net_connections()
        if c.status == "LISTEN"
    ]
    assert listening and set(listening) <= {"127.0.0.1"}, listening


async def test_a_job_without_data_gets_a_clear_409_and_no_tensorboard(api, mlc):
    job = await submit(api, "x = 1")
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    code, answer, _ = await api("POST", "jobs", job["id"], "tensorboard")
    assert code == 409
    assert f"job {job['id']}" in answer["message"] and "no TensorBoard data" in answer["message"]
    assert "tensorboard" in answer["message"]  # names the directory
    assert mlc.tensorboards.running == {}
    code, answer, _ = await api("POST", "jobs", "j0123456789", "tensorboard")
    assert code == 404
    code, answer, _ = await api("POST", "jobs", job["id"], "tensorboard", body={"jobs": ["../x"]})
    assert code == 400
    code, answer, _ = await api("POST", "jobs", job["id"], "tensorboard", body={"other": 1})
    assert code == 400


async def test_an_unknown_tensorboard_is_a_404(mlc, jp_fetch):
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("mlcluster", "tensorboard", "j0123456789", "", method="GET")
    assert missing.value.code == 404


async def test_several_jobs_in_one_tensorboard_which_stops_when_idle(
    api, mlc, tmp_path, jp_http_port, jp_serverapp, jp_base_url
):
    from torch.utils.tensorboard import SummaryWriter

    jobs = []
    for name, value in (("lr-small", 1.0), ("lr-big", 2.0)):
        directory = tmp_path / name
        with SummaryWriter(str(directory)) as writer:
            writer.add_scalar("eval/accuracy", value, 0)
        env = {"MLCLUSTER_TENSORBOARD_DIR": str(directory)}
        code = "import os; os.environ['MLCLUSTER_TENSORBOARD_DIR']"
        job = await submit(api, code, name=name, env=env)
        assert (await wait_final(api, job["id"]))["state"] == "succeeded"
        jobs.append(job["id"])
    mlc.tensorboards.idle_timeout = 1.0
    code, answer, _ = await api("POST", "jobs", jobs[0], "tensorboard", body={"jobs": [jobs[1]]})
    assert code == 200, answer
    assert answer["jobs"] == sorted(jobs)
    token = jp_serverapp.identity_provider.token
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        tags = await get(
            jp_base_url, jp_http_port, answer["url"] + "data/plugin/scalars/tags", token
        )
        runs = json.loads(tags.body)
        if {run.split("/")[0] for run in runs} == set(jobs):
            break
        assert asyncio.get_running_loop().time() < deadline, runs
        await asyncio.sleep(0.5)
    (process,) = mlc.tensorboards.running.values()
    await asyncio.wait_for(process.process.wait(), 30)  # idle for 1 s: stopped
    assert mlc.tensorboards.running == {}
    gone = await get(jp_base_url, jp_http_port, answer["url"], token)
    assert gone.code == 404
