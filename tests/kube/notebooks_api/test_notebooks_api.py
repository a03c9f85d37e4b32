"""Per-user notebook servers end to end: the server extension's REST API and /events websocket
(an in-process Jupyter server, pytest-jupyter) against the Kubernetes API emulator, with the
real notebook-controller (kopf) turning Notebooks into objects; the tests play kubelet.

Users are told apart by the `kubeflow-userid` header (trust_identity_header, as behind
Kubeflow's authenticating proxy), and in one test by Jupyter Server's identity provider.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Self

import pytest
from tornado.ioloop import PeriodicCallback

from jupyterlab_mlcluster.kubeconn import NO_CLUSTER, KubeConnection
from jupyterlab_mlcluster.server.notebook_feed import NotebookFeed
from jupyterlab_mlcluster.server.notebook_watch import ListWatch, request_notebooks
from jupyterlab_mlcluster.server.notebooks import OWNER_LABEL
from jupyterlab_mlcluster.server.openapi import Validators, build_document
from notebook_controller.objects import notebook_resource
from tests.helpers import rest_call
from tests.kube.controller_support import NB, install_crds, wait_owned
from tests.kube.helpers import Kube

ALICE, BOB = "alice@example.com", "bob@example.com"
IMAGE = "quay.io/jupyter/base-notebook:2026-01-01"
VALIDATORS = Validators(build_document(max_workers=1))


def documented(schema: str, value: Any) -> Any:
    """`value`, after checking it is what the OpenAPI document says a `schema` is."""
    VALIDATORS.check({"$ref": f"#/components/schemas/{schema}"}, value, schema)
    return value


@pytest.fixture
def mlc_settings() -> dict[str, Any]:
    """MLClusterApp settings of the server under test (tests override this fixture)."""
    return {"trust_identity_header": True}


@pytest.fixture
def jp_server_config(store_dir, monkeypatch, kube_namespace, mlc_settings):
    monkeypatch.setenv("MLCLUSTER_WARM_POOL", "0")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyterlab_mlcluster": True}},
        "MLClusterApp": {"notebook_namespace": kube_namespace, **mlc_settings},
        # One login cookie name for the REST client (127.0.0.1) and the websocket (localhost).
        "IdentityProvider": {"cookie_name": "mlcluster-test-user"},
    }


class User:
    """One user's REST calls and /events websocket, identified by the proxy header."""

    def __init__(self, jp_fetch: Any, jp_ws_fetch: Any, name: str | None):
        self.fetch, self.ws_fetch, self.name = jp_fetch, jp_ws_fetch, name
        self.headers = {"kubeflow-userid": name} if name else {}
        self.ws: Any = None
        self.seen: list[dict[str, Any]] = []

    async def call(self, method: str, *path: str, **kwargs: Any) -> tuple[int, Any, Any]:
        """(status, decoded JSON body or None, response); `body=`, `params=` as rest_call's."""
        response = await rest_call(self.fetch, method, *path, headers=dict(self.headers), **kwargs)
        text = response.body.decode() if response.body else ""
        return response.code, (json.loads(text) if text else None), response

    async def connect(self) -> dict[str, Any]:
        self.ws = await self.ws_fetch("mlcluster", "api", "events", headers=dict(self.headers))
        snapshot = json.loads(await asyncio.wait_for(self.ws.read_message(), 10))
        assert snapshot["type"] == "snapshot"
        return snapshot

    async def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20
    ) -> dict[str, Any]:
        """The first notebook message (from now on) that `predicate` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{self.name}: timed out; got {[describe(m) for m in self.seen]}"
            text = await asyncio.wait_for(self.ws.read_message(), remaining)
            assert text is not None, "websocket closed"
            message = json.loads(text)
            if message["type"].startswith("notebook"):
                self.seen.append(documented("Event", message))
                if predicate(message):
                    return message

    async def notebook_messages(self, quiet: float = 0.5) -> list[dict[str, Any]]:
        """Whatever notebook messages come within `quiet` seconds."""
        with_timeout = asyncio.wait_for(self.until(lambda m: False, timeout=3600), quiet)
        try:
            await with_timeout
        except TimeoutError:
            pass
        return self.seen


@pytest.fixture
def users(kube: Kube, mlc: Any, jp_fetch, jp_ws_fetch) -> Callable[..., list[User]]:
    """The running server with the CRDs installed: `users(ALICE, BOB)` are clients as them."""
    install_crds(kube)
    return lambda *names: [User(jp_fetch, jp_ws_fetch, name) for name in names]


def describe(message: dict[str, Any]) -> str:
    if message["type"] == "notebook_deleted":
        return f"deleted {message['name']}"
    view = message["notebook"]
    return (
        f"{view['name']} {view['phase']}{' stopped' if view['stopped'] else ''}: {view['message']}"
    )


def notebook(name: str, phase: str | None = None, text: str = "") -> Callable[[dict], bool]:
    def accepts(message: dict[str, Any]) -> bool:
        view = message.get("notebook") or {}
        return (
            message["type"] == "notebook"
            and view["name"] == name
            and (phase is None or view["phase"] == phase)
            and text in view["message"]
        )

    return accepts


class LoopLag:
    """The longest the event loop went without running a 10 ms periodic callback, and the
    same for a bare event loop in a thread of this process (`reference`): what the machine's
    load alone costs a loop at that moment. A handler that blocks the server's loop stalls
    it alone (a blocking call releases the GIL); a loaded machine stalls both."""

    def __init__(self) -> None:
        self.worst, self._last = 0.0, time.monotonic()
        self._callback = PeriodicCallback(self._tick, 10)
        self.reference = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._bare_loop, daemon=True)

    def _tick(self) -> None:
        now = time.monotonic()
        self.worst, self._last = max(self.worst, now - self._last), now

    def _bare_loop(self) -> None:
        async def ticks() -> None:
            last = time.monotonic()
            while not self._stop.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                self.reference, last = max(self.reference, now - last), now

        asyncio.run(ticks())

    def stalled(self) -> bool:
        """Over 0.5 s, and 0.4 s more than the bare loop's worst gap."""
        return self.worst >= 0.5 and self.worst > self.reference + 0.4

    def __enter__(self) -> Self:
        self._last = time.monotonic()
        self._callback.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._callback.stop()
        self._stop.set()
        self._thread.join(5)


def blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A test-side call to the emulator, off the server's event loop."""
    return asyncio.to_thread(fn, *args, **kwargs)


# -- the whole life of a notebook server ------------------------------------------------------


def test_spawn_progress_stop_start_delete_and_isolation(
    kube: Kube, kube_namespace: str, controller: Any, mlc: Any, jp_fetch, jp_ws_fetch, run
) -> None:
    alice, bob = User(jp_fetch, jp_ws_fetch, ALICE), User(jp_fetch, jp_ws_fetch, BOB)

    async def scenario() -> None:
        await alice.connect()
        await bob.connect()
        with LoopLag() as lag:
            clock = time.monotonic()
            status, made, response = await alice.call(
                "POST",
                "notebooks",
                body={
                    "name": "nb1",
                    "image": IMAGE,
                    "cpu": 1,
                    "memory": "2Gi",
                    "workspace_size": "1Gi",
                },
            )
            assert status == 201, made
            documented("Notebook", made)
            assert response.headers["Location"].endswith("/mlcluster/api/notebooks/nb1")
            assert made["owner"] == ALICE and made["phase"] == "starting" and not made["ready"]
            assert made["url"] == f"/notebook/{kube_namespace}/nb1/"
            assert (made["cpu"], made["memory"], made["workspace_size"]) == ("1", "2Gi", "1Gi")

            # The controller makes its objects, owned by the Notebook, admitting only alice.
            children = await blocking(wait_owned, kube, kube_namespace, "nb1")
            rule = children["AuthorizationPolicy"]["spec"]["rules"][0]
            assert rule["when"][0]["values"] == [ALICE]
            await alice.until(notebook("nb1", "starting", "waiting for the notebook pod"))
            latency = {"created -> objects made, status pushed": time.monotonic() - clock}

            # Play scheduler and kubelet: the pod's events become the spawn progress.
            (pod,) = await blocking(kube.run_statefulset, kube_namespace, "nb1", ready=False)
            await blocking(
                kube.record_event,
                pod,
                "Scheduled",
                f"Successfully assigned {kube_namespace}/nb1-0 to node-1",
                component="default-scheduler",
            )
            await alice.until(notebook("nb1", "starting", "Successfully assigned"))
            clock = time.monotonic()
            await blocking(kube.record_event, pod, "Pulling", f'Pulling image "{IMAGE}"')
            progress = await alice.until(notebook("nb1", "starting", "Pulling image"))
            latency["pod event -> pushed as progress"] = time.monotonic() - clock
            assert progress["notebook"]["message"] == f'Pod nb1-0: Pulling image "{IMAGE}"'
            status, got, _ = await alice.call("GET", "notebooks", "nb1")
            assert (
                status == 200
                and documented("Notebook", got)["message"] == progress["notebook"]["message"]
            ), "REST shows it too"

            clock = time.monotonic()
            await blocking(kube.run_statefulset, kube_namespace, "nb1")  # Running and Ready
            ready = await alice.until(notebook("nb1", "ready"))
            latency["pod ready -> pushed ready"] = time.monotonic() - clock
            assert ready["notebook"]["ready"] and ready["notebook"]["message"] == "ready"
            phases = [m["notebook"]["phase"] for m in alice.seen if m["type"] == "notebook"]
            assert phases[0] == "starting" and phases[-1] == "ready"
            assert set(phases) == {"starting", "ready"}, phases
            assert [m["seq"] for m in alice.seen] == sorted(m["seq"] for m in alice.seen)

            # Stop and start over REST.
            status, stopped, _ = await alice.call("POST", "notebooks", "nb1", "stop")
            assert status == 200 and stopped["stopped"] and not stopped["ready"]
            await blocking(
                kube.wait_for,
                lambda: (
                    kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"]
                    == 0
                ),
            )
            await blocking(kube.run_statefulset, kube_namespace, "nb1")  # the pod goes
            await alice.until(notebook("nb1", "stopped"))
            status, again, _ = await alice.call("POST", "notebooks", "nb1", "stop")
            assert status == 200 and again["stopped"], "stopping twice is fine"
            status, started, _ = await alice.call("POST", "notebooks", "nb1", "start")
            assert status == 200 and not started["stopped"]
            await alice.until(notebook("nb1", "starting"))
            await blocking(
                kube.wait_for,
                lambda: (
                    kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"]
                    == 1
                ),
            )
            await blocking(kube.run_statefulset, kube_namespace, "nb1")
            await alice.until(notebook("nb1", "ready"))

            # Bob cannot tell nb1 from a name nobody uses, and hears nothing of it.
            status, missing, _ = await bob.call("GET", "notebooks", "nb9")
            assert status == 404
            for method, path in [
                ("GET", ("notebooks", "nb1")),
                ("POST", ("notebooks", "nb1", "stop")),
                ("POST", ("notebooks", "nb1", "start")),
                ("DELETE", ("notebooks", "nb1")),
            ]:
                status, error, _ = await bob.call(method, *path)
                assert status == 404, (method, path, status)
                assert error["message"] == missing["message"].replace("nb9", "nb1")
            assert (await bob.call("GET", "notebooks"))[1] == {"notebooks": []}
            status, error, _ = await bob.call("POST", "notebooks", body={"name": "nb1"})
            assert status == 409 and "nb1" in error["message"]
            status, mine, _ = await bob.call("POST", "notebooks", body={"name": "nb2"})
            assert status == 201 and mine["owner"] == BOB
            await bob.until(notebook("nb2"))
            status, listed, _ = await alice.call("GET", "notebooks")
            assert [n["name"] for n in documented("NotebookList", listed)["notebooks"]] == ["nb1"]

            # Delete: the Notebook goes after what it owns (foreground), then alice is told.
            status, _, _ = await alice.call("DELETE", "notebooks", "nb1")
            assert status == 204
            await alice.until(lambda m: m == {**m, "type": "notebook_deleted", "name": "nb1"})
            assert await blocking(kube.find, NB, "Notebook", "nb1", kube_namespace) is None
            assert (
                await blocking(
                    kube.list,
                    "apps/v1",
                    "StatefulSet",
                    kube_namespace,
                    label_selector="mlcluster.io/notebook-name=nb1",
                )
                == []
            )
            assert (await alice.call("GET", "notebooks", "nb1"))[0] == 404

        assert {m.get("notebook", m).get("name") for m in alice.seen} == {"nb1"}
        bob_saw = await bob.notebook_messages()
        assert {m["notebook"]["name"] for m in bob_saw} == {"nb2"}, [describe(m) for m in bob_saw]
        assert not lag.stalled(), (
            f"the event loop stalled {lag.worst:.3f} s (a bare loop: {lag.reference:.3f} s)"
        )
        # To the real stderr: KopfRunner (click's CliRunner) holds sys.stdout meanwhile.
        print(
            "\n" + ", ".join(f"{k}: {v * 1000:.0f} ms" for k, v in latency.items()),
            f"; event loop: worst gap between 10 ms ticks {lag.worst * 1000:.0f} ms",
            file=sys.__stderr__,
        )

    with controller():
        run(scenario())


# -- quota, identity, restarts, no cluster ------------------------------------------------------


@pytest.mark.parametrize("mlc_settings", [{"trust_identity_header": True, "notebook_quota": 2}])
def test_quota_is_per_user_and_holds_under_concurrent_spawns(
    kube: Kube, kube_namespace: str, users, run
) -> None:
    alice, bob = users(ALICE, BOB)

    async def scenario() -> None:
        answers = await asyncio.gather(
            *(alice.call("POST", "notebooks", body={"name": f"nb{i}"}) for i in range(5))
        )
        statuses = sorted(status for status, _, _ in answers)
        assert statuses == [201, 201, 403, 403, 403], statuses
        refused = next(body for status, body, _ in answers if status == 403)
        assert refused["message"] == (
            "you have 2 notebook servers, the most allowed (MLClusterApp.notebook_quota = 2); "
            "delete one first"
        )
        mine = sorted(body["name"] for status, body, _ in answers if status == 201)
        listed = await blocking(kube.list, NB, "Notebook", kube_namespace)
        assert sorted(n["metadata"]["name"] for n in listed) == mine, "nothing else was made"
        assert (await bob.call("POST", "notebooks", body={"name": "bobs"}))[0] == 201
        # One deleted (it is gone at once: no controller, nothing it owns) frees a place.
        assert (await alice.call("DELETE", "notebooks", mine[0]))[0] == 204
        await blocking(
            kube.wait_for, lambda: kube.find(NB, "Notebook", mine[0], kube_namespace) is None
        )
        assert (await alice.call("POST", "notebooks", body={"name": "nb9"}))[0] == 201
        status, error, _ = await alice.call("POST", "notebooks", body={"name": "nb8"})
        assert status == 403 and "quota" in error["message"]

    run(scenario())


@pytest.mark.parametrize("mlc_settings", [{}])
def test_without_a_trusted_header_the_identity_provider_names_the_owner(
    kube: Kube, kube_namespace: str, users, jp_fetch, run
) -> None:
    [forger] = users(ALICE)  # sends kubeflow-userid: alice, ignored here

    async def scenario() -> None:
        # A browser: the token once, then the login cookie the server sets carries the user.
        # (Token-only requests are each a new anonymous user of jupyter_server's default
        # identity provider.)
        first = await jp_fetch("api", "me")
        me = json.loads(first.body)["identity"]["username"]
        forger.headers["Cookie"] = first.headers["Set-Cookie"].split(";")[0]
        await forger.connect()
        status, made, _ = await forger.call("POST", "notebooks", body={"name": "nb1"})
        assert status == 201 and made["owner"] == me != ALICE
        stored = await blocking(kube.get, NB, "Notebook", "nb1", kube_namespace)
        assert stored["spec"]["owner"] == me
        await forger.until(notebook("nb1"))  # the websocket's user is the same identity

    run(scenario())


def test_a_request_without_the_trusted_header_is_refused(
    kube: Kube, kube_namespace: str, users, run
) -> None:
    [anonymous] = users(None)

    async def scenario() -> None:
        for method, path in [("GET", ("notebooks",)), ("POST", ("notebooks", "nb1", "stop"))]:
            status, error, _ = await anonymous.call(method, *path)
            assert status == 403 and "kubeflow-userid" in error["message"], error
        status, _, _ = await anonymous.call("POST", "notebooks", body={"name": "nb1"})
        assert status == 403
        assert await blocking(kube.list, NB, "Notebook", kube_namespace) == []
        # Nor the event stream: on a shared server every job is somebody's (test_attacks.py).
        with pytest.raises(Exception) as refused:
            await anonymous.connect()
        assert getattr(refused.value, "code", None) == 403, refused.value

    run(scenario())


def test_a_watch_that_missed_changes_lists_again(kube: Kube, kube_namespace: str) -> None:
    """The Notebook follower, disconnected while a notebook is deleted and etcd compacts, gets
    410 Gone when it resumes, lists again, and reports the deletion it never saw."""
    install_crds(kube)
    for name in ("nb1", "nb2"):
        kube.create(notebook_resource(name, kube_namespace, ALICE, labels={OWNER_LABEL: "x"}))
    published: list[tuple[str, str, dict[str, Any]]] = []
    feed = NotebookFeed(lambda owner, name, message: published.append((owner, name, message)))
    may_connect, stopping = threading.Event(), threading.Event()
    may_connect.set()

    def request(api: Any, namespace: str, **params: Any) -> Any:
        if params.get("watch"):
            may_connect.wait()  # the network is down while this is clear
        return request_notebooks(api, namespace, **params)

    follower = ListWatch(
        "Notebooks",
        request,
        KubeConnection(kube_namespace),
        feed.replace_notebooks,
        feed.notebook_changed,
        stopping,
    )
    thread = threading.Thread(target=follower.run, daemon=True)
    thread.start()
    try:
        kube.wait_for(lambda: len(published) == 2, message="both notebooks")
        may_connect.clear()
        kube.wait_for(lambda: follower._response is not None, message="a watch")
        follower.interrupt()  # the connection drops; reconnecting waits for may_connect
        kube.delete(NB, "Notebook", "nb1", kube_namespace)
        kube.create_namespace(f"{kube_namespace}-x")  # more history after nb1's deletion
        kube.compact()
        assert follower.lists == 1 and len(published) == 2
        may_connect.set()
        kube.wait_for(lambda: follower.lists == 2, message="a second list after 410 Gone")
        kube.wait_for(lambda: len(published) == 3, message="the deletion")
        assert published[2] == (ALICE, "nb1", {"type": "notebook_deleted", "name": "nb1"})
        # And it watches again: a change of nb2 comes through.
        kube.patch(
            NB,
            "Notebook",
            "nb2",
            {"status": {"phase": "ready"}},
            kube_namespace,
            subresource="status",
        )
        kube.wait_for(lambda: len(published) == 4, message="nb2 ready")
        assert published[3][2]["notebook"]["phase"] == "ready"
    finally:
        stopping.set()
        may_connect.set()
        follower.interrupt()
        thread.join(5)
        kube.delete("v1", "Namespace", f"{kube_namespace}-x")
    assert not thread.is_alive()


def test_the_servers_watch_stops_at_once(kube: Kube, mlc: Any, users, run) -> None:
    [alice] = users(ALICE)

    async def scenario() -> None:
        await alice.connect()
        assert (await alice.call("POST", "notebooks", body={"name": "nb1"}))[0] == 201
        await alice.until(notebook("nb1"))  # both threads are watching now
        watch = mlc.notebook_watch
        await blocking(
            kube.wait_for, lambda: watch.events._response is not None, message="events watched"
        )
        started = time.monotonic()
        await asyncio.to_thread(watch.stop)
        took = time.monotonic() - started
        assert took < 1.0, f"stopping the watch took {took:.2f} s"
        assert len(watch._threads) == 2 and not any(t.is_alive() for t in watch._threads)

    run(scenario())


@pytest.mark.parametrize("mlc_settings", [{"trust_identity_header": True}])
def test_503_without_a_cluster(
    tmp_path, monkeypatch, mlc_settings, store_dir, jp_fetch, jp_ws_fetch, jp_serverapp, run
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    alice = User(jp_fetch, jp_ws_fetch, ALICE)

    async def scenario() -> None:
        status, error, _ = await alice.call("GET", "notebooks")
        assert status == 503 and error["message"].startswith(NO_CLUSTER)
        assert "no-such-kubeconfig" in error["message"]
        status, error, _ = await alice.call("POST", "notebooks", body={"name": "nb1"})
        assert status == 503
        status, error, _ = await alice.call("POST", "notebooks", body={"name": "-nb1"})
        assert status == 400, "bad input is refused first, cluster or not"

    run(scenario())
