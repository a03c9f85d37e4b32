"""The REST API on an in-process Jupyter server (pytest-jupyter), with real jobs."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
import warnings

import pytest
from jupyter_server.serverapp import JupyterServerAuthWarning, ServerWebApplication
from tornado import web

from jupyterlab_mlcluster.server.app import MLClusterApp
from jupyterlab_mlcluster.server.openapi import build_document
from jupyterlab_mlcluster.server.routes import route_pattern, routes
from tests.kube import emulator

from .helpers import submit, wait_final

API = "mlcluster/api"

# Every operation of the document, with a path that reaches its handler.
OPERATIONS = [
    ("GET", "jobs"),
    ("POST", "jobs"),
    ("GET", "jobs/j0000000001"),
    ("DELETE", "jobs/j0000000001"),
    ("GET", "jobs/j0000000001/logs"),
    ("GET", "jobs/j0000000001/metrics"),
    ("GET", "jobs/j0000000001/result"),
    ("GET", "cluster"),
    ("GET", "openapi.json"),
    ("GET", "events"),
    ("GET", "notebooks"),
    ("POST", "notebooks"),
    ("GET", "notebooks/nb"),
    ("DELETE", "notebooks/nb"),
    ("POST", "notebooks/nb/stop"),
    ("POST", "notebooks/nb/start"),
]


# -- documentation and wiring -------------------------------------------------------------


def test_openapi_document_matches_the_routes():
    document = build_document(max_workers=8)
    served = {path: handler for path, handler in routes()}
    assert set(served) == set(document["paths"]), "routes and document paths differ"
    for path, handler in served.items():
        implemented = {
            m.lower()
            for m in handler.SUPPORTED_METHODS
            if m not in ("OPTIONS",)
            and getattr(handler, m.lower()) is not web.RequestHandler._unimplemented_method
        }
        documented = {m for m in document["paths"][path] if m != "parameters"}
        assert implemented == documented, (
            f"{path}: handler has {implemented}, document has {documented}"
        )


def test_every_handler_method_is_authenticated_and_authorized():
    """As the JupyterLab extension template checks: no method without authentication."""
    for path, handler in routes():
        missing = ServerWebApplication._check_handler_auth(None, route_pattern(path), handler)
        assert not missing, missing
        for method in ("get", "post", "delete"):
            fn = getattr(handler, method)
            if fn is web.RequestHandler._unimplemented_method:
                continue
            # @authorized wraps the method: its closure holds the action it checks.
            inner = fn.__wrapped__ if hasattr(fn, "__wrapped__") else fn
            assert inner.__code__.co_qualname.startswith("authorized"), (
                f"{handler.__name__}.{method} lacks @authorized"
            )


async def test_extension_loads_without_auth_warnings(jp_server_config, jp_configurable_serverapp):
    with warnings.catch_warnings():
        warnings.simplefilter("error", JupyterServerAuthWarning)
        app = jp_configurable_serverapp(config=jp_server_config)
    assert "mlcluster" in app.extension_manager.extension_points


async def test_openapi_route_serves_the_document(api, mlc, jp_base_url):
    status, document, _ = await api("GET", "openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.1")
    assert document["servers"] == [{"url": f"{jp_base_url}{API}"}]
    workers = document["components"]["schemas"]["JobSubmission"]["properties"]["workers"]
    assert workers["maximum"] == mlc.mlconfig.max_workers


@pytest.fixture
def mlc_config():
    return {
        "MLClusterConfig": {"max_workers": 3, "cpu_slots": 6},
        "MLClusterApp": {"snapshot_limit": 7},
    }


async def test_server_config_reaches_the_engine_and_the_schema(api, mlc):
    assert mlc.mlconfig.max_workers == 3 and mlc.service.config.cpu_slots == 6
    assert mlc.snapshot_limit == 7
    status, error, _ = await api("POST", "jobs", body={"code": "pass", "workers": 4})
    assert status == 400 and "workers" in error["message"] and "3" in error["message"]
    status, cluster, _ = await api("GET", "cluster")
    assert cluster["capacity"]["cpus"]["total"] == 6


# -- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize("method,path", OPERATIONS)
async def test_unauthenticated_requests_are_rejected(api, method, path, store_dir):
    for headers in ({"Authorization": "token wrong"}, {"Authorization": ""}):
        body = "{}" if method == "POST" else None
        status, _data, _ = await api(method, *path.split("/"), body=body, headers=headers)
        assert status == 403, (method, path, status)
    assert not (store_dir / "jobs").exists() or not any((store_dir / "jobs").iterdir())


def documented_responses(method: str, path: str) -> dict:
    """The responses the document lists for a concrete request path."""
    document = build_document(max_workers=1)
    for template, item in document["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), "/" + path):
            return item[method.lower()]["responses"]
    raise AssertionError(f"{path} is not in the document")


@pytest.mark.parametrize("method,path", [op for op in OPERATIONS if op[1] != "events"])
async def test_a_blocked_cross_origin_request_gets_the_documented_404(api, method, path, store_dir):
    """A request without the token from an origin Jupyter Server does not allow (a page on
    another site using the browser's cookie) is refused with 404 before any handler runs,
    where the same request without the Origin header gets 403 (see above). A generated
    Origin header once failed the schemathesis run for want of this 404 in the document:
    nothing happens, and it is listed."""
    body = json.dumps({"code": "pass", "name": "nb"}) if method == "POST" else None
    headers = {"Authorization": "", "Origin": "http://evil.example"}
    status, error, _ = await api(method, *path.split("/"), body=body, headers=headers)
    assert status == 404 and error["message"], (method, path, status)
    assert "404" in documented_responses(method, path)
    assert not (store_dir / "jobs").exists() or not any((store_dir / "jobs").iterdir())


async def test_post_with_a_cookie_but_without_xsrf_is_rejected(api, store_dir):
    # A browser session (cookie) must also send the XSRF token for anything that changes state.
    status, _, response = await api("GET", "cluster")
    cookie = "; ".join(c.split(";")[0] for c in response.headers.get_list("Set-Cookie"))
    browser = {"Authorization": "", "Cookie": cookie, "Host": response.effective_url.split("/")[2]}
    status, _, _ = await api("GET", "cluster", headers=browser)
    assert status == 200, "the cookie alone authenticates reads"
    status, error, _ = await api("POST", "jobs", body={"code": "pass"}, headers=browser)
    assert status == 403 and "_xsrf" in error["message"]
    assert not any((store_dir / "jobs").iterdir())


# -- jobs ------------------------------------------------------------------------------------


async def test_submit_list_get_logs_result(api, mlc, jp_base_url):
    code = textwrap.dedent(
        """
        import os
        rank = int(os.environ["RANK"])
        for i in range(3):
            print(f"line {i} of rank {rank}")
        answer = 6 * 7
        """
    )
    status, job, response = await api(
        "POST",
        "jobs",
        body={
            "code": code,
            "workers": 2,
            "name": "rest-job",
            "pull": ["answer"],
            "env": {"FOO": "bar"},
        },
    )
    assert status == 201
    assert response.headers["Location"] == f"{jp_base_url}{API}/jobs/{job['id']}"
    assert job["name"] == "rest-job" and job["workers"] == 2 and job["env"] == {"FOO": "bar"}
    assert job["origin"]["kind"] == "rest" and job["origin"]["user"] == job["owner"]
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    final = await wait_final(api, job["id"])
    assert final["state"] == "succeeded", final["error"]
    assert all(r["state"] == "succeeded" and r["exit_code"] == 0 for r in final["ranks"])

    # by name, the newest job of that name
    status, by_name, _ = await api("GET", "jobs", "rest-job")
    assert status == 200 and by_name["id"] == job["id"]

    status, page, _ = await api("GET", "jobs", job["id"], "logs")
    assert status == 200
    texts = sorted(
        (entry["rank"], entry["line"]) for entry in page["lines"] if entry["stream"] == "stdout"
    )
    assert texts == [(r, f"line {i} of rank {r}") for r in (0, 1) for i in range(3)]
    status, again, _ = await api("GET", "jobs", job["id"], "logs", params={"since": page["cursor"]})
    assert again["lines"] == [] and again["cursor"] == page["cursor"]
    # A schema-valid cursor past the files' ends, past the largest file the file system
    # holds even (ext4's lseek answers EINVAL there): no lines, not a 500 (the document's
    # fuzzing found it).
    far = "0:68405010460060,1:999999999999999999"
    status, past, _ = await api("GET", "jobs", job["id"], "logs", params={"since": far})
    assert status == 200 and past == {"lines": [], "cursor": far}, past
    status, one_rank, _ = await api(
        "GET", "jobs", job["id"], "logs", params={"rank": "1", "tail": "1"}
    )
    assert [(entry["rank"], entry["line"]) for entry in one_rank["lines"]] == [
        (1, "line 2 of rank 1")
    ]

    status, result, _ = await api("GET", "jobs", job["id"], "result")
    assert status == 200 and result == {"kind": "pull", "value": {"answer": 42}}

    status, listing, _ = await api("GET", "jobs", params={"state": "succeeded"})
    assert status == 200 and listing["total"] == 1 and listing["jobs"][0]["id"] == job["id"]


async def test_list_filters_and_paging(api, mlc):
    ok = [await submit(api, "pass") for _ in range(3)]
    bad = await submit(api, "raise SystemExit(3)")
    for job in [*ok, bad]:
        await wait_final(api, job["id"])
    status, page, _ = await api("GET", "jobs", params={"limit": "2", "offset": "1"})
    assert status == 200 and page["total"] == 4 and page["limit"] == 2 and page["offset"] == 1
    newest_first = [bad["id"], *[j["id"] for j in reversed(ok)]]
    assert [j["id"] for j in page["jobs"]] == newest_first[1:3]
    status, failed, _ = await api("GET", "jobs", params={"state": "failed"})
    assert [j["id"] for j in failed["jobs"]] == [bad["id"]]
    # repeated and comma-separated states both work
    status, both, _ = await api("GET", "jobs", params=[("state", "failed"), ("state", "succeeded")])
    status, comma, _ = await api("GET", "jobs", params={"state": "failed,succeeded"})
    assert both["total"] == comma["total"] == 4
    status, local, _ = await api("GET", "jobs", params={"backend": "kubernetes"})
    assert local["total"] == 0 and local["jobs"] == []


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({}, "code"),
        ({"code": "pass", "workers": 0}, "workers"),
        ({"code": "pass", "workers": "two"}, "workers"),
        ({"code": "pass", "gpus": 1}, "unknown option"),
        ({"code": "pass", "memory": "lots"}, "memory"),
        ({"code": "pass", "memory": "0"}, "memory"),
        ({"code": "pass", "timeout": "soon"}, "timeout"),
        ({"code": "pass", "framework": "mxnet"}, "framework"),
        ({"code": "pass", "name": "Bad_Name"}, "name"),
        ({"code": "pass", "name": "ok\n"}, "name"),
        ({"code": "pass", "env": {"RANK": "3"}}, "env"),
        ({"code": "pass", "env": {"A": 1}}, "env"),
        ({"code": "pass", "env": {"A": "nul\u0000byte"}}, "env"),
        ({"code": "pass", "image": "x\u001cy"}, "image"),
        ({"code": "pass", "push": ["x"]}, "unknown option"),
        ({"code": 12}, "code"),
        ([1, 2], "object"),
    ],
)
async def test_submit_validation_errors(api, store_dir, body, fragment):
    status, error, _ = await api("POST", "jobs", body=body)
    assert status == 400, error
    assert fragment in error["message"], error["message"]
    assert not any((store_dir / "jobs").iterdir()), "nothing may be stored for a bad request"


@pytest.mark.parametrize(
    "raw", ["", "{", "not json", '{"code": "pass", "cpus": NaN}', "null", '{"code": "\\ud800"}']
)
async def test_submit_rejects_bodies_that_are_not_json_objects(api, raw, store_dir):
    status, error, _ = await api("POST", "jobs", body=raw)
    assert status == 400 and error["message"]
    assert not any((store_dir / "jobs").iterdir())


async def test_impossible_for_the_backend_is_409_and_kubernetes_without_cluster_is_503(
    api, store_dir
):
    status, error, _ = await api("POST", "jobs", body={"code": "pass", "gpus_per_worker": 2})
    assert status == 409 and "GPU" in error["message"]
    status, error, _ = await api("POST", "jobs", body={"code": "pass", "backend": "kubernetes"})
    assert status == 503 and error["message"].startswith("no Kubernetes cluster is configured")
    assert not any((store_dir / "jobs").iterdir())


@pytest.mark.parametrize(
    "path,params",
    [
        ("jobs", {"limit": "0"}),
        ("jobs", {"limit": "many"}),
        ("jobs", {"offset": "-1"}),
        ("jobs", {"state": "done"}),
        ("jobs", {"backend": "mesos"}),
        ("jobs", {"limit": ["1", "2"]}),
    ],
)
async def test_query_validation_errors(api, path, params):
    pairs = [(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, list) else [vs])]
    status, error, _ = await api("GET", path, params=pairs)
    assert status == 400 and error["message"].split(":")[0].split("[")[0] in params


async def test_job_query_validation_errors(api, mlc):
    job = await submit(api, "pass", workers=2)
    for path, params, fragment in [
        ("logs", {"rank": "-1"}, "rank"),
        ("logs", {"since": "garbage"}, "since"),
        ("logs", {"follow": "perhaps"}, "follow"),
        ("metrics", {"since": "yesterday"}, "since"),
    ]:
        status, error, _ = await api("GET", "jobs", job["id"], path, params=params)
        assert status == 400 and fragment in error["message"], (path, params, error)
    # A well-formed rank the job does not have is missing, not malformed (schema-valid
    # input never answers 400: the document's fuzzing found this once).
    status, error, _ = await api("GET", "jobs", job["id"], "logs", params={"rank": "2"})
    assert status == 404 and "has no rank 2: its ranks are 0 to 1" in error["message"], error
    status, error, _ = await api("DELETE", "jobs", job["id"], params={"purge": "maybe"})
    assert status == 400 and "purge" in error["message"]
    await wait_final(api, job["id"])


@pytest.mark.parametrize(
    "method,suffix",
    [("GET", ""), ("DELETE", ""), ("GET", "/logs"), ("GET", "/metrics"), ("GET", "/result")],
)
async def test_unknown_job_is_404(api, method, suffix):
    status, error, _ = await api(method, f"jobs/j0123456789{suffix}")
    assert status == 404 and "j0123456789" in error["message"]


_AUDIT: list[tuple[str, str]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _AUDIT is not None and event in (
        "open",
        "os.listdir",
        "os.scandir",
        "os.remove",
        "shutil.rmtree",
        "os.rmdir",
        "os.mkdir",
        "os.rename",
    ):
        _AUDIT.append((event, repr(args)))


@pytest.mark.parametrize(
    "method,suffix",
    [
        ("GET", ""),
        ("DELETE", "?purge=true"),
        ("GET", "/logs"),
        ("GET", "/logs?follow=true"),
        ("GET", "/metrics"),
        ("GET", "/result"),
    ],
)
async def test_path_traversal_never_touches_the_filesystem(api, mlc, jp_fetch, method, suffix):
    """A job id like ../../etc/passwd is refused before any file is opened."""
    global _AUDIT
    if _audit not in getattr(sys, "_mlcluster_hooks", []):
        sys.addaudithook(_audit)
        sys._mlcluster_hooks = [*getattr(sys, "_mlcluster_hooks", []), _audit]
    for evil in ("../../etc/passwd", "..", "%2e%2e", "j1/../../../etc/passwd", "/etc/passwd"):
        _AUDIT = []
        try:
            path, _, query = suffix.partition("?")
            response = await jp_fetch(
                API,
                "jobs",
                evil + path,
                method=method,
                raise_error=False,
                params=dict([query.split("=")]) if query else None,
            )
            touched = [entry for entry in _AUDIT if "passwd" in entry[1] or "/etc" in entry[1]]
        finally:
            _AUDIT = None
        assert response.code == 404, (evil, response.code)
        assert not touched, touched


async def test_cancel_and_purge(api, mlc, store_dir):
    job = await submit(api, "import time\nprint('started', flush=True)\ntime.sleep(60)", workers=2)
    # wait until it runs
    for _ in range(200):
        status, current, _ = await api("GET", "jobs", job["id"])
        if current["state"] == "running":
            break
        await asyncio.sleep(0.05)
    status, cancelled, _ = await api("DELETE", "jobs", job["id"])
    assert status == 200 and cancelled["state"] == "cancelled"
    assert all(r["state"] in ("cancelled", "failed") for r in cancelled["ranks"])
    status, again, _ = await api("DELETE", "jobs", job["id"])  # idempotent
    assert status == 200 and again["state"] == "cancelled"
    status, _, _ = await api("DELETE", "jobs", job["id"], params={"purge": "true"})
    assert status == 204
    status, _, _ = await api("GET", "jobs", job["id"])
    assert status == 404
    assert not (store_dir / "jobs" / job["id"]).exists()


async def test_metrics_series_and_current(api, mlc):
    job = await submit(api, "import time\nx = sum(range(10**7))\ntime.sleep(2.5)")
    final = await wait_final(api, job["id"])
    assert final["state"] == "succeeded"
    status, metrics, _ = await api("GET", "jobs", job["id"], "metrics")
    assert status == 200 and metrics["id"] == job["id"]
    (rank,) = metrics["ranks"]
    assert rank["rank"] == 0 and rank["series"], "a 2.5 s job has samples at 1/s"
    assert rank["series"][0]["memory_bytes"] > 0
    assert set(rank["current"]) == {"cpu_percent", "memory_bytes", "gpu_util", "gpu_memory_bytes"}
    later = rank["series"][-1]["ts"]
    status, newer, _ = await api("GET", "jobs", job["id"], "metrics", params={"since": str(later)})
    assert newer["ranks"][0]["series"] == []


async def test_result_states(api, mlc):
    running = await submit(api, "import time; time.sleep(30)")
    status, error, _ = await api("GET", "jobs", running["id"], "result")
    assert status == 409 and "only a succeeded job" in error["message"]
    status, _, _ = await api("DELETE", "jobs", running["id"])
    value = await submit(api, "{'a': [1, 2.5, None]}")
    opaque = await submit(api, "object()")
    nothing = await submit(api, "x = 1")
    big = await submit(api, "list(range(300_000))")  # over 1 MiB pickled: not encoded twice
    for job in (value, opaque, nothing, big):
        assert (await wait_final(api, job["id"]))["state"] == "succeeded"
    status, error, _ = await api("GET", "jobs", big["id"], "result")
    assert status == 409 and "more than 1 MiB" in error["message"], error
    assert (await api("GET", "jobs", value["id"], "result"))[1] == {
        "kind": "value",
        "value": {"a": [1, 2.5, None]},
    }
    status, error, _ = await api("GET", "jobs", opaque["id"], "result")
    assert status == 409 and "no JSON form" in error["message"] and "object" in error["message"]
    assert (await api("GET", "jobs", nothing["id"], "result"))[1] == {"kind": "none", "value": None}


async def test_cluster(api, mlc):
    status, cluster, _ = await api("GET", "cluster")
    assert status == 200 and cluster["backend"] == "local"
    assert cluster["capacity"]["cpus"]["total"] == mlc.mlconfig.cpu_slots
    assert cluster["queue"] == []


# -- notebooks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "notebooks", None),
        ("POST", "notebooks", {"name": "mine"}),
        ("GET", "notebooks/mine", None),
        ("DELETE", "notebooks/mine", None),
        ("POST", "notebooks/mine/stop", None),
        ("POST", "notebooks/mine/start", None),
    ],
)
async def test_notebooks_without_a_cluster_are_503(api, method, path, body):
    status, error, _ = await api(method, *path.split("/"), body=body)
    assert status == 503
    assert error["message"].startswith("no Kubernetes cluster is configured: ")
    assert "kubeconfig" in error["message"]


async def test_notebook_requests_are_validated_first(api):
    status, error, _ = await api("POST", "notebooks", body={"name": "Not A Name"})
    assert status == 400 and "name" in error["message"]
    status, error, _ = await api("POST", "notebooks", body={"name": "ok", "gpus": -1})
    assert status == 400 and "gpus" in error["message"]


def write_kubeconfig(path, server: str) -> None:
    path.write_text(json.dumps(emulator.kubeconfig(server, namespace="users")))


async def test_notebooks_with_an_unreachable_cluster_are_503(api, tmp_path, monkeypatch):
    from .live import free_port

    kubeconfig = tmp_path / "kubeconfig"
    address = f"http://127.0.0.1:{free_port()}"
    write_kubeconfig(kubeconfig, address)  # nothing listens there
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    status, error, _ = await api("GET", "notebooks")
    assert status == 503, (status, error)
    # Where and why, in words that stay the same from one attempt to the next (no urllib3
    # object addresses): the sidebar shows them, and tests compare them.
    assert error["message"] == (
        f"the Kubernetes API server at {address} cannot be reached: [Errno 111] Connection refused"
    )
    _, again, _ = await api("GET", "notebooks")
    assert again["message"] == error["message"]


async def test_notebooks_refused_by_the_api_server_are_502(api, tmp_path, monkeypatch):
    """An API server that answers 403 (as without RBAC permissions): 502 with its reason."""
    seen = []

    class Forbidden(web.RequestHandler):
        def get(self, path):
            seen.append((self.request.path, self.request.query))
            self.set_status(403)
            self.finish(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Forbidden",
                    "message": "notebooks.mlcluster.io is forbidden",
                    "code": 403,
                }
            )

    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    sock, port = bind_unused_port()
    server = HTTPServer(web.Application([(r"(.*)", Forbidden)]))
    server.add_sockets([sock])
    try:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, f"http://127.0.0.1:{port}")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        status, error, _ = await api("GET", "notebooks")
    finally:
        server.stop()
    assert status == 502 and "403" in error["message"], error
    path, query = seen[0]
    assert path == "/apis/mlcluster.io/v1alpha1/namespaces/users/notebooks"
    assert "labelSelector=mlcluster.io/owner%3D" in query


# -- packaging and configuration ------------------------------------------------------------


def test_installed_config_enables_the_extension():
    import tomllib
    from pathlib import Path

    import jupyterlab_mlcluster

    repo = Path(__file__).resolve().parents[2]
    enabled = json.loads(
        (repo / "jupyter-config/jupyter_server_config.d/jupyterlab_mlcluster.json").read_text()
    )
    assert enabled == {"ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}}}
    shared = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]["shared-data"]
    assert shared["jupyter-config/jupyter_server_config.d"] == "etc/jupyter/jupyter_server_config.d"
    (point,) = jupyterlab_mlcluster._jupyter_server_extension_points()
    assert point["app"] is MLClusterApp and point["app"].name == "mlcluster"


async def test_jupyter_mlcluster_config_file_is_read(
    jp_server_config, jp_configurable_serverapp, jp_config_dir
):
    # The extension's own config file, as `jupyter_mlcluster_config` next to the server's.
    (jp_config_dir / "jupyter_mlcluster_config.json").write_text(
        json.dumps(
            {"MLClusterApp": {"event_max_rate": 4.0}, "MLClusterConfig": {"kill_grace_period": 7.5}}
        )
    )
    app = jp_configurable_serverapp(config=jp_server_config)
    mlc = app.extension_manager.extension_points["mlcluster"].app
    assert mlc.event_max_rate == 4.0 and mlc.broadcaster.min_gap == 0.25
    assert mlc.service.config.kill_grace_period == 7.5


@pytest.fixture
def orphaned_job(store_dir):
    """A job left `running` by a supervisor that died while no server was up."""
    import subprocess

    import psutil

    from jupyterlab_mlcluster.jobs.model import JobSpec, JobState
    from jupyterlab_mlcluster.jobs.record import JobRecord
    from jupyterlab_mlcluster.jobs.running.processes import this_host
    from jupyterlab_mlcluster.jobs.storage.store import JobStore

    gone = subprocess.Popen(["true"])
    created = psutil.Process(gone.pid).create_time()
    gone.wait()
    store = JobStore(store_dir)
    store.insert_job(JobRecord(id="jorphan0001", name="orphan", spec=JobSpec(), created=1.0))
    store.update_job(
        "jorphan0001", supervisor={"pid": gone.pid, "create_time": created, "host": this_host()}
    )
    store.transition("jorphan0001", JobState.RUNNING, started=2.0)
    return store


async def test_starting_the_server_settles_jobs_whose_supervisor_died(orphaned_job, mlc):
    # Settled by the start hook itself, before any request asks about it.
    record = orphaned_job.get_job("jorphan0001")
    assert record.state.value == "failed" and "supervisor" in record.error


def test_the_job_schema_is_the_engines_job_shape():
    """The document's Job is exactly what JobRecord.to_json() gives: a field added to the
    engine's JSON without the document (or the other way round) fails here."""
    import jsonschema

    from jupyterlab_mlcluster.jobs.model import JobSpec, JobState, RankState
    from jupyterlab_mlcluster.jobs.record import JobRecord, RankRecord

    record = JobRecord(
        id="j0123456789",
        name="x",
        spec=JobSpec(workers=2, memory=2**30, env={"A": "1"}, timeout=60.0),
        state=JobState.RUNNING,
        created=1.0,
        started=2.0,
        owner="me",
        origin={"kind": "rest"},
        restarts=1,
        attempts=[
            {
                "attempt": 0,
                "started": 2.0,
                "ended": 3.0,
                "outcome": "failed",
                "reason": "Slurm preempted the job (PREEMPTED)",
                "failed_rank": None,
                "restarted": True,
            }
        ],
        ranks=[
            RankRecord(
                0,
                RankState.RUNNING,
                pid=10,
                host="h",
                started=2.0,
                metrics={"cpu_percent": 99.5, "memory_bytes": 10**8},
                progress={"step": 1, "total": 10, "desc": "e"},
            ),
            RankRecord(1, RankState.FAILED, exit_code=1, started=2.0, finished=3.0),
        ],
    )
    shape = record.to_json()
    schemas = build_document(max_workers=2)["components"]["schemas"]
    jsonschema.validate(
        shape,
        {**schemas["Job"], "components": {"schemas": schemas}},
        format_checker=jsonschema.FormatChecker(),
    )
    assert set(shape) == set(schemas["Job"]["properties"]) == set(schemas["Job"]["required"])
    assert set(shape["ranks"][0]) == set(schemas["Rank"]["properties"])
    assert set(shape["attempts"][0]) == set(schemas["Attempt"]["properties"])


async def test_jupyterlab_cache_buster_is_accepted_but_typos_are_not(api):
    code, page, _ = await api("GET", "jobs", params={"1795317812852": ""})
    assert code == 200 and page["jobs"] == []
    code, body, _ = await api("GET", "jobs", params={"stat": "running"})
    assert code == 400 and "unknown query parameter(s): stat" in body["message"]
