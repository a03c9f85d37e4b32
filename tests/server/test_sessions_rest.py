"""Sessions over REST (a real Jupyter server, real session supervisors and ranks): list, get,
restart, stop; replies checked against the OpenAPI document; another user refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyterlab_mlcluster.jobs import sessions
from jupyterlab_mlcluster.runtime.payload import Payload

from .test_experiments import check


async def run_cell(service, name: str, source: str, user: str | None = None, **options):
    """A cell in the session `name` (started with `options`), run to its end (in a thread:
    the server under test shares this event loop)."""

    def run() -> Any:
        origin = {"kind": "test", **({"user": user} if user else {})}
        record, _ = sessions.submit_cell(
            service, name, options, Payload(kind="code", source=source), origin=origin
        )
        done = service.wait(record.id, timeout=60)
        assert done.state == "succeeded", (done.state, done.error)
        return done, service.result(record.id)

    return await asyncio.to_thread(run)


@pytest.fixture
def mlc_config() -> dict[str, Any]:
    return {"MLClusterConfig": {"kill_grace_period": 1.0}}


async def test_list_get_restart_and_stop_a_session(api, mlc):
    cell, result = await run_cell(mlc.service, "s", "x = 41\nx + 1", workers=2)
    assert result == ("value", 42)
    code, listing, _ = await api("GET", "sessions")
    assert code == 200
    check("SessionList", listing)
    (view,) = listing["sessions"]
    assert view["name"] == "s" and view["state"] == "running" and view["workers"] == 2
    assert view["cells"] == 1 and view["idle_since"] is not None and view["restarts"] == 0
    code, job, _ = await api("GET", "jobs", cell.id)
    assert code == 200 and job["session"] == {"name": "s", "id": view["id"], "cell": True}
    check("Job", job)
    code, gang, _ = await api("GET", "jobs", view["id"])
    assert gang["session"] == {"name": "s", "id": view["id"], "cell": False}
    code, one, _ = await api("GET", "sessions", "s")
    assert code == 200 and one["id"] == view["id"]
    check("Session", one)
    code, restarted, _ = await api("POST", "sessions", "s", "restart")
    assert code == 200 and restarted["restarts"] == 1 and restarted["state"] == "running"
    _, result = await run_cell(mlc.service, "s", "'x' in globals()")
    assert result == ("value", False)  # fresh ranks
    code, stopped, _ = await api("DELETE", "sessions", "s")
    assert code == 200 and stopped["state"] == "cancelled" and stopped["idle_since"] is None
    check("Session", stopped)
    code, listing, _ = await api("GET", "sessions")
    assert listing["sessions"] == []
    for method, path in (("GET", ("sessions", "s")), ("DELETE", ("sessions", "s"))):
        code, body, _ = await api(method, *path)
        assert code == 404 and body["message"] == "no session 's'"
    code, body, _ = await api("GET", "sessions", "Not%20A%20Name")
    assert code == 404


class TestSharedServer:
    """A server shared through an authenticating proxy: mallory against alice's session."""

    @pytest.fixture
    def mlc_config(self) -> dict[str, Any]:
        return {
            "MLClusterApp": {"trust_identity_header": True, "schedule_interval": 0},
            "MLClusterConfig": {"kill_grace_period": 1.0},
        }

    async def test_another_users_session_looks_missing_and_is_untouched(self, api, mlc):
        cell, _ = await run_cell(
            mlc.service, "s", "secret = 1", user="alice@example.com", workers=2, backend="local"
        )
        alice = {"kubeflow-userid": "alice@example.com"}
        mallory = {"kubeflow-userid": "mallory@example.com"}
        code, listing, _ = await api("GET", "sessions", headers=mallory)
        assert code == 200 and listing["sessions"] == []
        for method, path in (
            ("GET", ("sessions", "s")),
            ("POST", ("sessions", "s", "restart")),
            ("DELETE", ("sessions", "s")),
        ):
            code, body, _ = await api(method, *path, headers=mallory)
            assert code == 404 and body["message"] == "no session 's'", (method, path)
        # nor her cells, nor the session's gang, as jobs (reading, cancelling, purging)
        for job_id in (cell.id, cell.origin["session_job"]):
            for method, params in (("GET", None), ("DELETE", None), ("DELETE", {"purge": "true"})):
                code, _, _ = await api(method, "jobs", job_id, params=params, headers=mallory)
                assert code == 404, (method, job_id, params)
        code, view, _ = await api("GET", "sessions", "s", headers=alice)
        assert code == 200 and view["state"] == "running" and view["restarts"] == 0
        assert view["owner"] == "alice@example.com"
        code, _, _ = await api("GET", "sessions")  # no identity at all
        assert code == 403
        # alice's state is intact after all of mallory's tries
        _, result = await run_cell(mlc.service, "s", "secret", user="alice@example.com")
        assert result == ("value", 1)
        code, stopped, _ = await api("DELETE", "sessions", "s", headers=alice)
        assert code == 200 and stopped["state"] == "cancelled"
