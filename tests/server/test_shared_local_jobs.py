"""Local-backend jobs on a server shared by many users (identity from the trusted header, each
user in their own namespace: MLClusterApp.per_user_namespaces) would all run as the server's
one Unix user, where one user's job code reads another's files, environment and processes.
Such a server refuses them, as JupyterHub never runs two users' code as one Unix user.

Bob, on a real Jupyter server (pytest-jupyter), submits a local job: 403 saying why and what to
do, and nothing stored, no job directory, no process, his code never run. A request naming no
backend gets kubernetes (the user's own namespace), never local. The server fires no local
schedule either. With MLClusterApp.allow_local_jobs_when_shared (a single-tenant deployment),
the same requests run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest

from .test_attacks import Caller, _wait
from .test_experiments import add_schedule, wait_until

BOB = "bob@example.com"
SHARED = {"trust_identity_header": True, "schedule_interval": 0.05}


def bobs_code(marker: Path) -> str:
    """What bob's job would do first: leave a mark (stands for reading others' files)."""
    return f"open({str(marker)!r}, 'w').write('bob ran as ' + __import__('getpass').getuser())\n"


def job_dirs(mlc: Any) -> list[Path]:
    return sorted((Path(mlc.service.store.root) / "jobs").iterdir())


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


class TestSharedServer:
    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": dict(SHARED)}

    async def test_attack_local_job_on_a_shared_server_is_refused(
        self, jp_fetch, jp_ws_fetch, mlc, tmp_path
    ) -> None:
        assert mlc.per_user_namespaces and mlc.refuses_local_jobs
        bob = Caller(jp_fetch, jp_ws_fetch, BOB)
        marker = tmp_path / "bob-was-here"
        dirs, before = job_dirs(mlc), children()

        # Slurm's tasks run as the server's account too (its allocations, its credentials):
        # refused the same way, before sbatch (or anything) is ever run.
        for options in (
            {"backend": "local"},
            {"backend": "local", "workers": 2, "name": "x"},
            {"backend": "slurm"},
            {"backend": "slurm", "workers": 2, "env": {"LD_PRELOAD": "/tmp/bob.so"}},
        ):
            status, error = await bob.call(
                "POST", "jobs", body={"code": bobs_code(marker), **options}
            )
            assert status == 403, error
            message = error["message"]
            assert f"{options['backend']} jobs would run" in message, message
            assert "shared by many users" in message and "one Unix user" in message, message
            assert "backend kubernetes" in message and "your own server" in message, message

        # Nothing stored, nothing written, nothing started: his code can never run.
        assert mlc.service.store.list_jobs()[1] == 0
        assert job_dirs(mlc) == dirs
        assert children() <= before
        status, page = await bob.call("GET", "jobs")
        assert (status, page["total"]) == (200, 0)
        assert not marker.exists()

    async def test_a_job_naming_no_backend_goes_to_kubernetes_not_local(
        self, jp_fetch, jp_ws_fetch, mlc, tmp_path
    ) -> None:
        """The shared server's default is kubernetes (the caller's namespace), whatever
        MLClusterConfig.default_backend says; here no cluster is configured, so 503 saying
        the kubernetes backend needs one, and again nothing stored or run."""
        assert mlc.mlconfig.default_backend == "kubernetes"
        bob = Caller(jp_fetch, jp_ws_fetch, BOB)
        marker = tmp_path / "bob-was-here"
        status, error = await bob.call("POST", "jobs", body={"code": bobs_code(marker)})
        assert status == 503 and "kubernetes backend" in error["message"], error
        assert mlc.service.store.list_jobs()[1] == 0 and not marker.exists()
        status, cluster = await bob.call("GET", "cluster")
        assert status == 200 and cluster["backend"] == "kubernetes", cluster

    async def test_no_local_schedule_is_fired(self, mlc) -> None:
        """The server fires only local schedules; on a shared server, none (a due one stays
        due: its pass never starts)."""
        add_schedule(mlc.service, "bobs-nightly", BOB)
        assert mlc.scheduler.interval == 0 and mlc.scheduler._task is None
        assert mlc.scheduler.passes == 0 and mlc.service.store.list_jobs()[1] == 0


class TestSharedServerThatAllowsLocalJobs:
    """The opt-out, for a single-tenant deployment that still trusts the header."""

    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {"MLClusterApp": {**SHARED, "allow_local_jobs_when_shared": True}}

    async def test_local_jobs_run(self, jp_fetch, jp_ws_fetch, mlc, tmp_path) -> None:
        assert mlc.per_user_namespaces and not mlc.refuses_local_jobs
        assert mlc.mlconfig.default_backend == "local"
        bob = Caller(jp_fetch, jp_ws_fetch, BOB)
        for name, options in (("named", {"backend": "local"}), ("default", {})):
            marker = tmp_path / name
            status, job = await bob.call(
                "POST", "jobs", body={"code": bobs_code(marker), "name": name, **options}
            )
            assert status == 201 and job["backend"] == "local", job
            final = await _wait(bob, job["id"])
            assert final["state"] == "succeeded", final
            assert marker.read_text().startswith("bob ran as ")
        # And the server fires local schedules again.
        add_schedule(mlc.service, "bobs-nightly", BOB)

        def fired() -> list[Any]:
            jobs = mlc.service.store.list_jobs()[0]
            return [j for j in jobs if (j.origin or {}).get("schedule") == "bobs-nightly"]

        (run,) = await wait_until(fired)
        assert run.backend == "local" and run.owner == BOB


def test_a_single_namespace_or_personal_server_is_not_shared() -> None:
    """Only per-user namespaces make a server shared: a personal server (no trusted header)
    or a single-namespace install (notebook_namespace, chosen by the operator) runs local
    jobs as before."""
    from jupyterlab_mlcluster.server.app import MLClusterApp

    assert MLClusterApp(trust_identity_header=True).refuses_local_jobs
    assert not MLClusterApp().refuses_local_jobs
    assert not MLClusterApp(
        trust_identity_header=True, notebook_namespace="team"
    ).refuses_local_jobs
    assert not MLClusterApp(
        trust_identity_header=True, allow_local_jobs_when_shared=True
    ).refuses_local_jobs
