"""A caller of a shared server starts TensorBoard processes without end (issue 31): one per
distinct set of job ids (about 90 MiB each; the sets grow quadratically with the job
quota). Each user has at most `tensorboard_max_per_user` (opening one more stops that
user's least recently used; a burst of starts past it is refused), the server at most
`tensorboard_max_total` (opening one more is refused, 503, saying so; nobody's TensorBoard
is stopped for another user). A real Jupyter server and real TensorBoard processes, counted
by a sampler the whole time.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from .test_tensorboard_confined import ALICE, BOB, call

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")

PER_USER, TOTAL = 2, 3


@pytest.fixture
def areas(tmp_path) -> Path:
    root = tmp_path / "areas"
    for user in (BOB, ALICE):
        for run in range(6):
            (root / user / f"run{run}").mkdir(parents=True)
            (root / user / f"run{run}" / "events.out.tfevents.1").write_bytes(b"")
    return root


@pytest.fixture
def mlc_config(areas) -> dict[str, Any]:
    return {
        "MLClusterApp": {
            "trust_identity_header": True,
            "allow_local_jobs_when_shared": True,
            "tensorboard_user_dir": str(areas / "{user}"),
            "tensorboard_max_per_user": PER_USER,
            "tensorboard_max_total": TOTAL,
            "metrics_interval": 0,
        }
    }


class Sampler:
    """The most TensorBoard processes this server had at once, looked at every 20 ms."""

    def __init__(self) -> None:
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        boards = 0
        for child in psutil.Process().children(recursive=True):
            try:
                boards += any("tensorboard" in part for part in child.cmdline())
            except psutil.Error:
                continue
        return boards

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, self.count())

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


async def test_attack_many_job_sets_start_no_more_tensorboards_than_the_caps(
    jp_fetch, mlc, areas, tmp_path
):
    async def jobs_of(user: str) -> list[str]:
        ids = []
        for run in range(4):
            where = str(areas / user / f"run{run}")
            status, body = await call(
                jp_fetch, user, "POST", "jobs", body={"code": "1", "tensorboard": where}
            )
            assert status == 201, body
            ids.append(body["id"])
        return ids

    async def open_board(user: str, ids: list[str]) -> tuple[int, Any]:
        return await call(
            jp_fetch, user, "POST", "jobs", ids[0], "tensorboard", body={"jobs": ids[1:]}
        )

    def bobs() -> set[str]:
        return {k for k, p in mlc.tensorboards.running.items() if p.owner == BOB}

    bob, alice = await jobs_of(BOB), await jobs_of(ALICE)
    with Sampler() as sampler:
        # Bob opens distinct sets one after another: his least recently used is stopped.
        keys = []
        for ids in ([bob[0]], [bob[1]], [bob[0], bob[1]], [bob[2]]):
            status, body = await open_board(BOB, ids)
            assert status == 200, body
            keys.append(mlc.tensorboards.key(ids))
            assert len(bobs()) <= PER_USER
        assert bobs() == set(keys[-PER_USER:])
        # Reopening a running one is no new start, and makes it his most recently used.
        assert (await open_board(BOB, [bob[0], bob[1]]))[0] == 200
        assert (await open_board(BOB, [bob[3]]))[0] == 200
        assert bobs() == {keys[2], mlc.tensorboards.key([bob[3]])}
        # A burst of new sets at once, their starts held until two are under way: no
        # more than his share ever runs; the excess is refused, saying so.
        gate = tmp_path / "gate"
        held = tmp_path / "held-python"
        held.write_text(
            f'#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\nexec {sys.executable} "$@"\n'
        )
        held.chmod(0o755)
        mlc.tensorboards.executable = str(held)
        burst = [[bob[0], bob[2]], [bob[0], bob[3]], [bob[1], bob[2]], [bob[1], bob[3]]]
        opening = [asyncio.ensure_future(open_board(BOB, ids)) for ids in burst]
        deadline = asyncio.get_running_loop().time() + 120
        while sum(o.done() for o in opening) < len(burst) - PER_USER:
            assert asyncio.get_running_loop().time() < deadline, opening
            await asyncio.sleep(0.05)
        refused = [o.result() for o in opening if o.done()]
        for status, body in refused:
            assert status == 503 and "tensorboard_max_per_user" in body["message"], body
        gate.touch()
        answers = await asyncio.gather(*opening)
        assert sorted(status for status, _ in answers) == [200] * PER_USER + [503] * 2
        assert len(bobs()) == PER_USER
        # Alice gets the server's last one; her second is refused (the server's cap), and
        # none of Bob's is stopped for her.
        before = bobs()
        status, body = await open_board(ALICE, [alice[0]])
        assert status == 200, body
        status, body = await open_board(ALICE, [alice[1]])
        assert status == 503 and "tensorboard_max_total" in body["message"], body
        assert bobs() == before and len(mlc.tensorboards.running) == TOTAL
    print(f"most TensorBoard processes at once: {sampler.most} (caps {PER_USER}/{TOTAL})")
    assert sampler.most <= TOTAL
    assert sampler.count() == len(mlc.tensorboards.running) == TOTAL
