"""The notebook-controller, run for real (kopf) against the Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
import yaml
from helpers import free_port, scenario_seed, stop_process

from notebook_controller import objects
from notebook_controller.cli import print_manifests, run_controller
from notebook_controller.crd import notebook_crd
from notebook_controller.manifests import all_manifests
from tests.kube.controller_process import ControllerZygote
from tests.kube.controller_support import (
    NB,
    OWNED,
    create_notebook,
    install_crds,
    notebook_status,
    owned,
    running_controller,
    wait_owned,
    wait_phase,
)
from tests.kube.fixtures import KubeCluster
from tests.kube.helpers import Kube
from tests.kube.protocol import parse_api_path

# --- create, status, spawn progress -----------------------------------------------------------


def test_notebooks_reconciled_together_read_their_namespaces_owner_once(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """Reconciles that start together in one namespace share one read of its owner (the
    Namespace and its Profile) instead of one each: at 10,000 Notebooks those reads were a
    third of the controller's work (issue 34). Made before the controller starts, the
    Notebooks are all reconciled at once from its first listing."""
    names = [f"nb{i}" for i in range(12)]
    for name in names:
        create_notebook(kube, kube_namespace, name, workspace=None)
    start = kube.on_emulator(lambda e: e._request_count)
    with controller():
        for name in names:
            wait_owned(kube, kube_namespace, name, count=4, timeout=60)
    namespace_path = f"/api/v1/namespaces/{kube_namespace}"
    reads = kube.on_emulator(
        lambda e: [
            r.url.path
            for r in e._requests
            if r.id > start
            and str(getattr(r.method, "value", r.method)) == "GET"
            and not r.headers.get("User-Agent", "").startswith("python-requests")
        ]
    )
    # One read, or two if NAMESPACE_OWNER_TTL ran out on a slow machine meanwhile.
    assert 1 <= reads.count(namespace_path) <= 2, reads


def test_a_burst_is_reconciled_a_bounded_number_at_a_time(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    """kopf starts a handler for every Notebook of its first listing at once; at most
    max_concurrent_reconciles of them work at a time (issue 34: unbounded, 10,000 of them
    each held their copies and desired objects while queued for the API, and all finished
    near the end). With one at a time, each Notebook's children are created together, in
    turn, where unbounded reconciles interleave them."""
    names = [f"nb{i}" for i in range(6)]
    for name in names:
        create_notebook(kube, kube_namespace, name, workspace=None)
    start = kube.on_emulator(lambda e: e._request_count)
    with controller(max_concurrent_reconciles=1):
        for name in names:
            wait_owned(kube, kube_namespace, name, count=4, timeout=60)
    creates = kube.on_emulator(
        lambda e: [
            r.data["metadata"]["labels"][objects.LABEL_NOTEBOOK]
            for r in e._requests
            if r.id > start
            and str(getattr(r.method, "value", r.method)) == "POST"
            and (r.data or {}).get("metadata", {}).get("namespace") == kube_namespace
            and objects.LABEL_NOTEBOOK in (r.data["metadata"].get("labels") or {})
        ]
    )
    assert sorted(creates) == sorted(name for name in names for _ in range(4)), creates
    runs = [name for i, name in enumerate(creates) if i == 0 or creates[i - 1] != name]
    assert sorted(runs) == names, f"interleaved: {creates}"


def test_create_makes_every_owned_object(kube: Kube, kube_namespace: str, controller: Any) -> None:
    with controller():
        notebook = create_notebook(kube, kube_namespace)
        children = wait_owned(kube, kube_namespace, "nb1")
        status = wait_phase(kube, kube_namespace, "nb1", "starting")
    uid = notebook["metadata"]["uid"]
    for kind, child in children.items():
        assert child["metadata"]["ownerReferences"] == [
            {
                "apiVersion": NB,
                "kind": "Notebook",
                "name": "nb1",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], kind
    prefix = f"/notebook/{kube_namespace}/nb1"
    container = children["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "NB_PREFIX", "value": prefix} in container["env"]
    assert "--ServerApp.base_url=$(NB_PREFIX)" in container["args"]
    assert children["StatefulSet"]["spec"]["replicas"] == 1
    route = children["VirtualService"]["spec"]["http"][0]
    assert route["match"][0] == {"uri": {"prefix": prefix + "/"}}
    assert route["route"][0]["destination"]["host"] == f"nb1.{kube_namespace}.svc.cluster.local"
    rule = children["AuthorizationPolicy"]["spec"]["rules"][0]
    assert rule["when"] == [
        {"key": "request.headers[kubeflow-userid]", "values": ["alice@example.com"]}
    ]
    assert children["PersistentVolumeClaim"]["metadata"]["name"] == "nb1-workspace"
    assert status["url"] == prefix + "/"
    assert status["message"] == "waiting for the notebook pod to be created"
    # Deletable while the controller is down: no finalizer of ours or kopf's.
    meta = kube.get(NB, "Notebook", "nb1", kube_namespace)["metadata"]
    assert "finalizers" not in meta
    # kopf's state stays in the controller's memory: no PATCH of each Notebook to record it.
    assert not [key for key in meta.get("annotations") or {} if key.startswith("kopf.")]


def pending_pod(kube: Kube, namespace: str) -> dict[str, Any]:
    """Notebook nb1 (no workspace) with its objects made and its pod created, not ready."""
    create_notebook(kube, namespace, workspace=None)
    wait_owned(kube, namespace, "nb1", count=4)
    [pod] = kube.run_statefulset(namespace, "nb1", ready=False)
    return pod


def notebook_events(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The Events about Notebook nb1 (the controller reissues its pod's events there)."""
    selector = "involvedObject.kind=Notebook,involvedObject.name=nb1"
    return kube.list("v1", "Event", namespace, field_selector=selector)


def test_status_follows_the_pod_and_pod_events_are_reissued(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    with controller():
        pod = pending_pod(kube, kube_namespace)
        kube.set_pod_unschedulable(
            kube_namespace, "nb1-0", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        )
        kube.wait_for(
            lambda: (
                notebook_status(kube, kube_namespace, "nb1").get("message")
                == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
            ),
            message="the scheduler message in the status",
        )
        kube.record_event(
            pod,
            "FailedScheduling",
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            type="Warning",
            component="default-scheduler",
        )
        kube.set_container_waiting(
            kube_namespace, "nb1-0", "ImagePullBackOff", 'Back-off pulling image "nope:1"'
        )
        status = wait_phase(kube, kube_namespace, "nb1", "error")
        assert status["phase"] == 'error: ImagePullBackOff: Back-off pulling image "nope:1"'
        kube.record_event(pod, "Pulled", 'Successfully pulled image "python:3.12"')
        kube.run_statefulset(kube_namespace, "nb1", ready=True)
        status = kube.wait_for(
            lambda: (
                (s := notebook_status(kube, kube_namespace, "nb1")).get("readyReplicas") == 1 and s
            )
        )
        assert status["ready"] is True and status["phase"] == "ready"
        mirrored = kube.wait_for(lambda: len(e := notebook_events(kube, kube_namespace)) >= 2 and e)
    reasons = {e["reason"]: e for e in mirrored}
    assert reasons["FailedScheduling"]["type"] == "Warning"
    assert reasons["Pulled"]["message"] == 'Pod nb1-0: Successfully pulled image "python:3.12"'


def test_restart_does_not_duplicate_reissued_events(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    with controller():
        pod = pending_pod(kube, kube_namespace)
        kube.record_event(pod, "Scheduled", "Successfully assigned")
        kube.wait_for(lambda: notebook_events(kube, kube_namespace))
    with controller():
        time.sleep(1.5)  # the restarted controller sees the same pod event again
        assert len(notebook_events(kube, kube_namespace)) == 1


# --- stop, start, drift, deletion -------------------------------------------------------------


def test_stop_and_start(kube: Kube, kube_namespace: str, controller: Any) -> None:
    with controller():
        create_notebook(kube, kube_namespace)
        wait_owned(kube, kube_namespace, "nb1")
        kube.run_statefulset(kube_namespace, "nb1")
        wait_phase(kube, kube_namespace, "nb1", "ready")
        kube.patch(
            NB,
            "Notebook",
            "nb1",
            objects.stop_patch(datetime.datetime.now(datetime.UTC)),
            kube_namespace,
        )
        kube.wait_for(
            lambda: (
                kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"] == 0
            )
        )
        kube.run_statefulset(kube_namespace, "nb1")  # the StatefulSet controller removes the pod
        status = kube.wait_for(
            lambda: (
                (s := notebook_status(kube, kube_namespace, "nb1"))["message"].startswith(
                    "stopped since"
                )
                and s
            ),
            message="stopped, the pod gone",
        )
        assert status["phase"] == "stopped" and status["ready"] is False
        assert kube.find("v1", "PersistentVolumeClaim", "nb1-workspace", kube_namespace) is not None
        kube.patch(NB, "Notebook", "nb1", objects.start_patch(), kube_namespace)
        kube.wait_for(
            lambda: (
                kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"] == 1
            )
        )
        kube.run_statefulset(kube_namespace, "nb1")
        wait_phase(kube, kube_namespace, "nb1", "ready")


def test_deleted_or_edited_objects_are_put_back(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    with controller():
        create_notebook(kube, kube_namespace)
        before = wait_owned(kube, kube_namespace, "nb1")
        kube.delete("v1", "Service", "nb1", kube_namespace)
        service = kube.wait_for(
            lambda: kube.find("v1", "Service", "nb1", kube_namespace), message="service back"
        )
        assert service["metadata"]["uid"] != before["Service"]["metadata"]["uid"]
        kube.delete("networking.istio.io/v1", "VirtualService", "nb1", kube_namespace)
        kube.wait_for(
            lambda: kube.find("networking.istio.io/v1", "VirtualService", "nb1", kube_namespace)
        )
        policy = kube.get("security.istio.io/v1", "AuthorizationPolicy", "nb1", kube_namespace)
        policy["spec"]["rules"][0]["when"][0]["values"].append("mallory@example.com")
        kube.replace(policy)
        kube.wait_for(
            lambda: (
                kube.get("security.istio.io/v1", "AuthorizationPolicy", "nb1", kube_namespace)[
                    "spec"
                ]["rules"][0]["when"][0]["values"]
                == ["alice@example.com"]
            ),
            message="policy restored",
        )
        kube.patch("apps/v1", "StatefulSet", "nb1", {"spec": {"replicas": 3}}, kube_namespace)
        kube.wait_for(
            lambda: (
                kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"] == 1
            )
        )


def test_deleting_a_notebook_leaves_nothing(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    with controller():
        create_notebook(kube, kube_namespace)
        wait_owned(kube, kube_namespace, "nb1")
        kube.run_statefulset(kube_namespace, "nb1")
        kube.delete(NB, "Notebook", "nb1", kube_namespace)
        kube.wait_for(
            lambda: owned(kube, kube_namespace, "nb1") == {}, message="children collected"
        )
        time.sleep(0.5)  # the controller must not recreate anything for a deleted notebook
        assert owned(kube, kube_namespace, "nb1") == {}
        assert kube.list("v1", "Pod", kube_namespace) == []


def test_a_bad_template_is_a_readable_error(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    with controller():
        body = objects.notebook_resource("nb1", kube_namespace, "alice@example.com")
        body["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Sometimes"
        kube.create(body)
        status = wait_phase(kube, kube_namespace, "nb1", "error")
        assert "StatefulSet nb1" in status["phase"] and "Sometimes" in status["phase"]
        time.sleep(1)  # other events (Service, pods) must not clear the error meanwhile
        assert notebook_status(kube, kube_namespace, "nb1")["phase"] == status["phase"]
        kube.patch(
            NB,
            "Notebook",
            "nb1",
            {
                "spec": {
                    "template": {
                        "spec": {"containers": [{"name": "notebook", "imagePullPolicy": "Always"}]}
                    }
                }
            },
            kube_namespace,
        )
        kube.wait_for(
            lambda: kube.find("apps/v1", "StatefulSet", "nb1", kube_namespace), message="fixed"
        )
        wait_phase(kube, kube_namespace, "nb1", "starting")


# --- Istio versions ---------------------------------------------------------------------------


def test_istio_objects_use_the_newest_served_version(
    fresh_kube: Callable[..., KubeCluster],
) -> None:
    cluster = fresh_kube()
    kube = cluster.kube
    install_crds(kube, networking=("v1beta1",), security=("v1beta1",))
    with running_controller("default", kubeconfig=str(cluster.kubeconfig)):
        create_notebook(kube, "default", workspace=None)
        children = wait_owned(kube, "default", "nb1", count=4, istio="v1beta1")
    assert children["VirtualService"]["apiVersion"] == "networking.istio.io/v1beta1"
    requests_made = cluster.thread.call(
        lambda e: [
            str(r.url.path)
            for r in e._requests
            if r.method == "POST" and "istio" in str(r.url.path)
        ]
    )
    assert requests_made == [
        "/apis/networking.istio.io/v1beta1/namespaces/default/virtualservices",
        "/apis/security.istio.io/v1beta1/namespaces/default/authorizationpolicies",
    ]


def test_without_istio_the_notebook_says_why(fresh_kube: Callable[..., KubeCluster]) -> None:
    cluster = fresh_kube()
    kube = cluster.kube
    kube.install_crd(notebook_crd())
    with running_controller("default", kubeconfig=str(cluster.kubeconfig)):
        create_notebook(kube, "default", name="routed", workspace=None)
        status = wait_phase(kube, "default", "routed", "error")
        assert "Istio is not installed" in status["phase"]
    with running_controller("default", kubeconfig=str(cluster.kubeconfig), use_istio=False):
        create_notebook(kube, "default", name="plain", workspace=None)
        assert set(wait_owned(kube, "default", "plain", count=2)) == {"Service", "StatefulSet"}
        wait_phase(kube, "default", "plain", "starting")


# --- culling ------------------------------------------------------------------------------------


@contextlib.contextmanager
def jupyter_server(base_url: str, root: Path) -> Iterator[str]:
    """A real, idle jupyter_server standing in for the notebook pod; yields its URL."""
    port = free_port()
    config = root / "jupyter_server_config.json"
    # Only the server and terminals: JupyterLab's extension is irrelevant to activity and slow.
    config.write_text(
        json.dumps(
            {
                "ServerApp": {
                    "jpserver_extensions": {
                        "jupyterlab": False,
                        "jupyter_lsp": False,
                        "notebook_shim": False,
                    }
                }
            }
        )
    )
    log = (root / "jupyter.log").open("w")  # the server writes it; closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--config={config}",
            "--allow-root",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--port={port}",
            f"--ServerApp.base_url={base_url}",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.disable_check_xsrf=True",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}{base_url}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            try:
                requests.get(url + "api/status", params={"no_track_activity": "1"}, timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            raise RuntimeError((root / "jupyter.log").read_text()[-2000:])
        yield url
    finally:
        stop_process(process, grace=15)
        log.close()


def run_in_kernel(url: str, code: str) -> None:
    """Start a kernel and send it code over the kernel websocket, as JupyterLab does."""
    kernel = requests.post(url + "api/kernels", json={}).json()

    async def send() -> None:
        ws_url = url.replace("http://", "ws://") + f"api/kernels/{kernel['id']}/channels"
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
            message = {
                "header": {
                    "msg_id": uuid.uuid4().hex,
                    "msg_type": "execute_request",
                    "username": "test",
                    "session": uuid.uuid4().hex,
                    "version": "5.3",
                    "date": "",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                },
            }
            await ws.send_json(message)
            async for reply in ws:  # until the kernel says it is busy with our code
                data = json.loads(reply.data)
                if (
                    data.get("msg_type") == "status"
                    and data["content"].get("execution_state") == "busy"
                    and data["parent_header"].get("msg_id") == message["header"]["msg_id"]
                ):
                    return

    asyncio.run(send())


@pytest.mark.slow
def test_culling_stops_an_idle_notebook_but_not_a_busy_one(
    kube: Kube, kube_namespace: str, controller: Any, tmp_path: Path
) -> None:
    base_url = f"/notebook/{kube_namespace}/nb1/"
    release = tmp_path / "release-the-kernel"
    with jupyter_server(base_url, tmp_path) as url:
        # Busy until the test says so (not for a fixed time), so a slow start of the
        # controller on a loaded machine can never eat into the busy window.
        run_in_kernel(
            url,
            f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)",
        )
        settings = dict(
            cull_idle_time=2.0,
            cull_check_period=0.3,
            cull_connected=True,
            notebook_url_template=f"http://{url.split('/')[2]}/notebook/{{namespace}}/{{name}}/",
        )
        with controller(**settings):
            create_notebook(kube, kube_namespace, workspace=None)
            wait_owned(kube, kube_namespace, "nb1", count=4, timeout=60)
            kube.run_statefulset(kube_namespace, "nb1")
            wait_phase(kube, kube_namespace, "nb1", "ready", timeout=60)
            # Checked every 0.3 s with a 2 s idle limit; the busy kernel keeps it alive for
            # twice the limit (many cull checks).
            busy_checked_until = time.monotonic() + 4
            while time.monotonic() < busy_checked_until:
                assert not objects.is_stopped(kube.get(NB, "Notebook", "nb1", kube_namespace))
                time.sleep(0.3)
            release.touch()  # the kernel goes idle now
            busy_until = time.monotonic()
            kube.wait_for(
                lambda: notebook_status(kube, kube_namespace, "nb1").get("lastActivity"),
                timeout=60,
            )
            stopped = kube.wait_for(
                lambda: (
                    objects.is_stopped(n := kube.get(NB, "Notebook", "nb1", kube_namespace)) and n
                ),
                timeout=60,
                message="culled",
            )
            culled_after = time.monotonic() - busy_until
            kube.wait_for(
                lambda: (
                    kube.get("apps/v1", "StatefulSet", "nb1", kube_namespace)["spec"]["replicas"]
                    == 0
                ),
                timeout=60,
            )
            events = kube.list("v1", "Event", kube_namespace, field_selector="reason=Culled")
    # Never before the idle limit after the kernel finished (the kernel's last activity is
    # at or after `release`); the upper bound is only the generous convergence wait.
    assert 1.5 < culled_after < 60, culled_after
    assert stopped["metadata"]["annotations"][objects.ANNOTATION_STOPPED].endswith("Z")
    assert len(events) == 1 and events[0]["involvedObject"]["name"] == "nb1"


# --- restart safety -----------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkilled_during_a_burst_of_creates_converges(
    kube: Kube, kube_namespace: str, tmp_path: Path
) -> None:
    install_crds(kube)
    seed = scenario_seed()
    rng = random.Random(seed)
    zygote = ControllerZygote()
    argv = [
        f"--namespace={kube_namespace}",
        "--no-culling",
        "--log-level=WARNING",
        "--ControllerConfig.retry_delay=0.5",
        "--ControllerConfig.mirror_events=False",
    ]
    names = [f"nb-{i:02d}" for i in range(50)]
    deleted = set(rng.sample(names, 8))
    done = threading.Event()

    def burst() -> None:
        for index, name in enumerate(names):
            create_notebook(
                kube, kube_namespace, name=name, workspace="1Gi" if index % 3 == 0 else None
            )
            time.sleep(rng.uniform(0.02, 0.08))
        for name in deleted:  # deletions while the controller may be dead or half-way
            kube.delete(NB, "Notebook", name, kube_namespace)
        done.set()

    def made() -> int:
        return len(kube.list("apps/v1", "StatefulSet", kube_namespace))

    kills = 0
    progress = []  # StatefulSets made so far, at each kill
    try:
        pid = zygote.spawn(argv, tmp_path / "controller.log")
        creator = threading.Thread(target=burst)
        creator.start()
        while not done.is_set() or kills < 4:
            # Once this controller is busy (it made something), kill it at a random moment.
            before = made()
            with contextlib.suppress(TimeoutError):
                kube.wait_for(lambda before=before: made() > before, timeout=10, interval=0.02)
            time.sleep(rng.uniform(0, 0.3))
            zygote.kill(pid)  # SIGKILL: no cleanup, no finally, no flushed state
            kills += 1
            progress.append(made())
            pid = zygote.spawn(argv, tmp_path / "controller.log")
        creator.join()

        expected = {
            name: 4 + (index % 3 == 0) for index, name in enumerate(names) if name not in deleted
        }
        notebooks = {n["metadata"]["name"]: n for n in kube.list(NB, "Notebook", kube_namespace)}
        assert set(notebooks) == set(expected), seed

        def converged() -> bool:
            for name, count in expected.items():
                children = owned(kube, kube_namespace, name)
                if len(children) != count or not notebook_status(kube, kube_namespace, name).get(
                    "phase"
                ):
                    return False
            return True

        kube.wait_for(converged, timeout=90, interval=0.5, message=f"convergence (seed {seed})")
    finally:
        zygote.close()
    # No duplicates (owned() asserts one per kind), no orphans, right owners.
    uids = {n["metadata"]["uid"] for n in notebooks.values()}
    for api_version, kind in OWNED:
        for child in kube.list(api_version, kind, kube_namespace):
            refs = child["metadata"].get("ownerReferences") or []
            assert [r["uid"] for r in refs if r["kind"] == "Notebook"] and all(
                r["uid"] in uids for r in refs
            ), (kind, child["metadata"]["name"], seed)
    assert kills >= 4
    assert any(0 < made < len(names) for made in progress), (progress, seed)  # killed mid-work


# --- least privilege, CLI, shipped manifests -----------------------------------------------------


def _allowed(
    namespace: str, verb: str, group: str, resource: str, where: str | None, name: str
) -> bool:
    """Granted to the controller by the printed RBAC, with `namespace` a user namespace."""
    from tests.kube.rbac_authz import can

    printed = all_manifests(user_namespaces=[namespace])
    account = ("mlcluster-system", "notebook-controller")
    return can(printed, account, verb, group, resource, where, name)


def test_rbac_allows_exactly_what_the_controller_does(
    kube: Kube, kube_namespace: str, controller: Any
) -> None:
    start = kube.on_emulator(lambda e: e._request_count)
    with controller(
        cull_check_period=0.2,
        cull_idle_time=0.1,
        notebook_url_template="http://127.0.0.1:9/{namespace}/{name}/",
    ):
        create_notebook(kube, kube_namespace)
        wait_owned(kube, kube_namespace, "nb1")
        [pod] = kube.run_statefulset(kube_namespace, "nb1")
        kube.record_event(pod, "Started", "Started container notebook")
        kube.delete("v1", "Service", "nb1", kube_namespace)
        kube.wait_for(lambda: kube.find("v1", "Service", "nb1", kube_namespace))
        wait_phase(kube, kube_namespace, "nb1", "ready")
        kube.patch(NB, "Notebook", "nb1", objects.start_patch(), kube_namespace)
        kube.wait_for(
            lambda: kube.list(
                "v1", "Event", kube_namespace, field_selector="involvedObject.kind=Notebook"
            )
        )
    requests_seen = kube.on_emulator(
        lambda e: [
            (
                r.method.value if hasattr(r.method, "value") else str(r.method),
                r.url.path,
                dict(r.params),
            )
            for r in e._requests
            if r.id > start and not r.headers.get("User-Agent", "").startswith("python-requests")
        ]
    )
    used = set()
    for method, path, params in requests_seen:
        api = parse_api_path(path)
        if api is None:
            continue  # discovery
        watching = params.get("watch") in ("true", "1")
        verb = {
            "GET": "watch" if watching else ("get" if api.name else "list"),
            "POST": "create",
            "PATCH": "patch",
            "PUT": "update",
            "DELETE": "delete",
        }[method.upper()]
        resource = api.plural + (f"/{api.subresource}" if api.subresource else "")
        used.add((verb, api.group, resource))
        assert _allowed(kube_namespace, verb, api.group, resource, api.namespace, api.name or ""), (
            f"{verb} {api.group}/{resource} in {api.namespace} is not granted"
        )
    assert ("create", "apps", "statefulsets") in used and (
        "patch",
        "mlcluster.io",
        "notebooks/status",
    ) in used


@pytest.mark.slow
def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert print_manifests(["--namespace=ml-system", "--image=registry.example.com/ml:1"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == all_manifests(namespace="ml-system", image="registry.example.com/ml:1")
    assert run_controller(["--help"]) == 0
    assert "cull" in capsys.readouterr().out
    assert run_controller(["--ControllerConfig.cull_idle_time=soon"]) != 0


def test_the_controller_collects_young_objects_less_often() -> None:
    """The controller's process runs young collections every GC_YOUNG_THRESHOLD allocations
    (Python's 700 walked a burst's waiting objects every few ms: ~15 % of its CPU), and
    leaves the imports' objects out of full collections. In a fresh interpreter, as the
    controller's `start` does it."""
    code = (
        "import gc, json; from notebook_controller.cli import tune_gc, GC_YOUNG_THRESHOLD;"
        "before = gc.get_threshold(); tune_gc();"
        "print(json.dumps([before, gc.get_threshold(), GC_YOUNG_THRESHOLD, gc.get_freeze_count()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    before, after, threshold, frozen = json.loads(done.stdout)
    assert before[0] < threshold and after == [threshold, *before[1:]], (before, after)
    assert frozen > 10_000, frozen  # the imports' objects (kopf, the kubernetes client, ...)


def test_checked_in_manifests_are_current() -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "controller" / "manifests.yaml"
    assert list(yaml.safe_load_all(shipped.read_text())) == all_manifests(), (
        "regenerate: python -m notebook_controller manifests > deploy/controller/manifests.yaml"
    )
