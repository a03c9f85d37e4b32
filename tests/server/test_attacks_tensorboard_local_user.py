"""Another Unix user of the machine the server runs on (a shared workstation, a Slurm login
node) reads a job's TensorBoard (issue 31). TensorBoard listens on loopback and has no
authentication of its own: before, its path prefix was in `/proc/<pid>/cmdline` (with the
jobs' directories), its port in `/proc/net/tcp` and both in a world-readable
`/tmp/.tensorboard-info` file, so the other user read the job's scalars, run names and log
directory. Now it answers only requests carrying the proxy's secret, which it read on stdin.

The intruder is a real second Unix user (made with useradd for the test: it needs root),
running a stdlib script that looks wherever a local user may look, then asks every port
listening on loopback under every prefix it found.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess

import pytest
from tornado.httpclient import AsyncHTTPClient

from .helpers import submit, wait_final
from .test_tensorboard import WRITE_SCALARS, get

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")

INTRUDER = r"""
import glob, json, re, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor

ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        local, state = row.split()[1], row.split()[3]
        address, port = local.rsplit(":", 1)
        if state == "0A" and address in ("0100007F", "00000000"):  # listening, IPv4 loopback
            ports.add(int(port, 16))
prefixes, cmdlines, infos = {""}, [], []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        text = open(path, "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if "tensorboard" in text:
        cmdlines.append(text)
        prefixes.update(re.findall(r"--path_prefix[ =](\S+)", text))
for path in glob.glob("/tmp/.tensorboard-info/*.info"):
    try:
        info = json.load(open(path))
    except (OSError, ValueError):
        continue
    infos.append(info)
    prefixes.add(info.get("path_prefix") or "")
    ports.add(int(info.get("port") or 0))

def ask(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return url, answer.status, answer.read(100000).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return url, exc.code, exc.read(2000).decode(errors="replace")
    except Exception as exc:
        return url, None, repr(exc)

urls = [
    f"http://127.0.0.1:{port}{prefix}{rest}"
    for port in sorted(ports - {0})
    for prefix in sorted(prefixes)
    for rest in ("/data/runs", "/data/plugin/scalars/tags", "/data/environment", "/data/logdir")
]
with ThreadPoolExecutor(16) as pool:
    answers = {url: [code, body] for url, code, body in pool.map(ask, urls)}
print(json.dumps({"ports": sorted(ports), "prefixes": sorted(prefixes), "cmdlines": cmdlines,
                  "infos": infos, "answers": answers}))
"""


@pytest.fixture
def mlc_config():
    return {"MLClusterApp": {"tensorboard_reload_interval": 1.0, "metrics_interval": 0}}


@pytest.fixture
def intruder():
    """Another Unix user, made for this test and removed after it."""
    if os.geteuid() != 0:
        pytest.skip("making another Unix user (useradd) needs root")
    if shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs useradd and /usr/bin/python3")
    name = f"mlc-intruder-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def look_around(name: str) -> dict:
    done = subprocess.run(
        ["/usr/bin/python3", "-c", INTRUDER],
        user=name,
        group=name,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": "/"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_attack_another_unix_user_reads_nothing_from_tensorboard(
    api, mlc, jp_base_url, jp_http_port, jp_serverapp, intruder, store_dir
):
    job = await submit(api, WRITE_SCALARS, workers=2, name="tb-secret")
    assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    code, answer, _ = await api("POST", "jobs", job["id"], "tensorboard")
    assert code == 200, answer
    url, token = answer["url"], jp_serverapp.identity_provider.token
    # Through the server's proxy, with its token: the scalars (once TensorBoard read them).
    deadline = asyncio.get_running_loop().time() + 90
    while True:
        tags = await get(jp_base_url, jp_http_port, url + "data/plugin/scalars/tags", token)
        assert tags.code == 200, tags.body
        if "train/loss" in json.loads(tags.body).get(f"{job['id']}/rank0", {}):
            break
        assert asyncio.get_running_loop().time() < deadline, tags.body
        await asyncio.sleep(0.5)
    (board,) = mlc.tensorboards.running.values()
    logdir = str(store_dir)

    seen = await asyncio.to_thread(look_around, intruder)
    # The intruder found the port (as anyone can) ...
    assert board.port in seen["ports"], seen["ports"]
    # ... but every question to TensorBoard's port is refused, whatever the prefix.
    mine = {u: a for u, a in seen["answers"].items() if f":{board.port}/" in u}
    assert mine, seen
    for asked, (status, body) in mine.items():
        assert "train/loss" not in body and job["id"] not in body, (asked, status, body[:300])
    for asked, (status, body) in mine.items():
        assert status == 403, (asked, status, body[:300])
    # No directory, and no prefix, on a command line or in an info file.
    for text in seen["cmdlines"] + [json.dumps(info) for info in seen["infos"]]:
        assert logdir not in text and job["id"] not in text, text
    for asked, (_, body) in seen["answers"].items():
        for secret in (job["id"], logdir):
            assert secret not in body, (asked, secret, body[:300])

    # A browser's header of the secret's name is dropped, not passed on in its place.
    forged = await AsyncHTTPClient().fetch(
        f"http://localhost:{jp_http_port}{url}data/plugin/scalars/tags",
        headers={"Authorization": f"token {token}", "X-MLCluster-TensorBoard-Secret": "guess"},
        raise_error=False,
    )
    assert forged.code == 200 and b"train/loss" in forged.body
