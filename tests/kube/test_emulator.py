"""The emulator behaves like a kube-apiserver: each realism point, proven over HTTP."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import kubernetes
import pytest
import requests

from tests.kube.helpers import Kube, KubeApiError
from tests.kube.istio import istio_crds
from tests.kube.validation import validate_builtin, validate_builtin_uncached


def pod(
    name: str, labels: dict[str, str] | None = None, containers: tuple[str, ...] = ("main",)
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": c, "image": "python:3.11"} for c in containers]},
    }


def configmap(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **meta},
        "data": {"k": "v"},
    }


def widget_crd(status: bool = True) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "color": {"type": "string", "default": "blue"},
                            "extra": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    },
                    "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                },
            }
        },
    }
    if status:
        version["subresources"] = {"status": {}}
    group = "example.com" if status else "nostatus.example.com"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [version],
        },
    }


def widget(name: str, size: Any = 1, group: str = "example.com", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size, **spec},
    }


class Stream:
    """A watch (or log follow) read in a thread, lines collected as they arrive."""

    def __init__(self, url: str, params: dict[str, Any]) -> None:
        self.lines: list[Any] = []
        self.ended = threading.Event()
        self.response = requests.get(url, params=params, stream=True, timeout=30)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response.iter_lines():
                if line:
                    try:
                        self.lines.append(json.loads(line))
                    except ValueError:
                        self.lines.append(line.decode())
        except (requests.RequestException, AttributeError, ValueError):
            pass  # closed by the test while reading
        finally:
            self.ended.set()

    def wait(self, count: int, timeout: float = 5) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.lines

    def close(self) -> None:
        self.response.close()


def events(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in lines]


# --- create, read, errors -----------------------------------------------------------------


def test_create_fills_server_metadata_and_answers_201(kube: Kube, kube_namespace: str) -> None:
    response = kube.http.post(
        f"{kube.url}/api/v1/namespaces/{kube_namespace}/configmaps",
        json={**configmap(""), "metadata": {"generateName": "cfg-"}},
    )
    assert response.status_code == 201
    meta = response.json()["metadata"]
    assert meta["name"].startswith("cfg-") and len(meta["name"]) == len("cfg-") + 5
    assert meta["namespace"] == kube_namespace and meta["generation"] == 1
    assert len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0


def test_duplicate_is_409_and_missing_is_404_as_status_objects(
    kube: Kube, kube_namespace: str
) -> None:
    kube.create(configmap("dup"), kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.create(configmap("dup"), kube_namespace)
    assert exc.value.status == 409 and exc.value.body["reason"] == "AlreadyExists"
    assert exc.value.body["kind"] == "Status" and exc.value.body["details"]["name"] == "dup"
    with pytest.raises(KubeApiError) as exc:
        kube.get("v1", "ConfigMap", "nope", kube_namespace)
    assert exc.value.status == 404 and exc.value.body["reason"] == "NotFound"
    assert exc.value.body["message"] == 'configmaps "nope" not found'


def test_bad_requests_change_nothing(kube: Kube, kube_namespace: str) -> None:
    base = f"{kube.url}/api/v1/namespaces/{kube_namespace}/configmaps"
    before = kube.list("v1", "ConfigMap", kube_namespace)
    assert (
        kube.http.post(
            base, data="{not json", headers={"Content-Type": "application/json"}
        ).status_code
        == 400
    )
    assert kube.http.post(base, json={**configmap("x"), "kind": "Secret"}).status_code == 400
    assert kube.http.post(base, json={**configmap("x"), "apiVersion": "v2"}).status_code == 400
    other_ns = {**configmap("x"), "metadata": {"name": "x", "namespace": "default"}}
    assert kube.http.post(base, json=other_ns).status_code == 400
    assert kube.http.post(base, json={**configmap("x"), "metadata": {}}).status_code == 422
    assert kube.list("v1", "ConfigMap", kube_namespace) == before


def test_namespace_must_exist_and_not_be_terminating(kube: Kube) -> None:
    with pytest.raises(KubeApiError) as exc:
        kube.create(configmap("x"), "no-such-namespace")
    assert exc.value.status == 404
    kube.create_namespace("doomed")
    kube.create(
        {**pod("blocker"), "metadata": {"name": "blocker", "finalizers": ["test/hold"]}}, "doomed"
    )
    kube.delete("v1", "Namespace", "doomed")
    assert kube.get("v1", "Namespace", "doomed")["status"]["phase"] == "Terminating"
    with pytest.raises(KubeApiError) as exc:
        kube.create(configmap("late"), "doomed")
    assert exc.value.status == 403
    kube.patch("v1", "Pod", "blocker", {"metadata": {"finalizers": None}}, "doomed")
    kube.wait_for(lambda: kube.find("v1", "Namespace", "doomed") is None, message="namespace gone")


def test_the_kubernetes_client_works_against_it(kube_api: Any, kube_namespace: str) -> None:
    core = kubernetes.client.CoreV1Api(kube_api)
    created = core.create_namespaced_config_map(kube_namespace, configmap("via-client"))
    assert created.metadata.uid
    listed = core.list_namespaced_config_map(kube_namespace)
    assert [c.metadata.name for c in listed.items] == ["via-client"]
    patched = core.patch_namespaced_config_map("via-client", kube_namespace, {"data": {"k": "w"}})
    assert patched.data == {"k": "w"}
    with pytest.raises(kubernetes.client.ApiException) as exc:
        core.read_namespaced_config_map("missing", kube_namespace)
    assert exc.value.status == 404
    stream = kubernetes.watch.Watch().stream(
        core.list_namespaced_config_map, kube_namespace, timeout_seconds=1
    )
    assert [(e["type"], e["object"].metadata.name) for e in stream] == [("ADDED", "via-client")]


# --- resourceVersion and conflicts ----------------------------------------------------------


def test_resource_versions_increase_and_stale_updates_conflict(
    kube: Kube, kube_namespace: str
) -> None:
    first = kube.create(configmap("rv"), kube_namespace)
    second = kube.create(pod("rv-pod"), kube_namespace)
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    updated = kube.replace({**first, "data": {"k": "new"}})
    assert int(updated["metadata"]["resourceVersion"]) > int(second["metadata"]["resourceVersion"])
    with pytest.raises(KubeApiError) as exc:
        kube.replace({**first, "data": {"k": "stale"}})
    assert exc.value.status == 409 and exc.value.body["reason"] == "Conflict"
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "v1",
            "ConfigMap",
            "rv",
            {
                "metadata": {"resourceVersion": first["metadata"]["resourceVersion"]},
                "data": {"k": "stale"},
            },
            kube_namespace,
        )
    assert exc.value.status == 409
    assert kube.get("v1", "ConfigMap", "rv", kube_namespace)["data"] == {"k": "new"}


def test_a_no_op_update_keeps_the_resource_version(kube: Kube, kube_namespace: str) -> None:
    created = kube.create(configmap("same"), kube_namespace)
    again = kube.patch("v1", "ConfigMap", "same", {"data": {"k": "v"}}, kube_namespace)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_generation_counts_spec_changes_only(kube: Kube, kube_namespace: str) -> None:
    kube.install_crd(widget_crd())
    kube.create(widget("gen"), kube_namespace)
    labelled = kube.patch(
        "example.com/v1", "Widget", "gen", {"metadata": {"labels": {"a": "b"}}}, kube_namespace
    )
    assert labelled["metadata"]["generation"] == 1
    resized = kube.patch("example.com/v1", "Widget", "gen", {"spec": {"size": 2}}, kube_namespace)
    assert resized["metadata"]["generation"] == 2


# --- list with selectors --------------------------------------------------------------------


def test_label_selectors_equality_and_set_based(kube: Kube, kube_namespace: str) -> None:
    for name, labels in [
        ("a", {"app": "nb", "tier": "gpu"}),
        ("b", {"app": "nb"}),
        ("c", {"app": "job"}),
    ]:
        kube.create(pod(name, labels), kube_namespace)

    def names(selector: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in kube.list("v1", "Pod", kube_namespace, label_selector=selector)
        ]

    assert names("app=nb") == ["a", "b"]
    assert names("app==nb,tier=gpu") == ["a"]
    assert names("app!=nb") == ["c"]
    assert names("app in (nb, job)") == ["a", "b", "c"]
    assert names("app notin (nb)") == ["c"]
    assert names("tier") == ["a"]
    assert names("!tier") == ["b", "c"]
    with pytest.raises(KubeApiError) as exc:
        names("app in ()")
    assert exc.value.status == 400


def test_field_selectors_and_cluster_wide_lists(kube: Kube, kube_namespace: str) -> None:
    kube.create_namespace(f"{kube_namespace}-b")
    kube.create(pod("same-name"), kube_namespace)
    kube.create(pod("same-name"), f"{kube_namespace}-b")
    kube.create(pod("other"), kube_namespace)
    kube.set_pod_phase(kube_namespace, "other", "Running")
    everywhere = kube.list("v1", "Pod", field_selector="metadata.name=same-name")
    assert sorted(p["metadata"]["namespace"] for p in everywhere) == sorted(
        [kube_namespace, f"{kube_namespace}-b"]
    )
    here = kube.list("v1", "Pod", field_selector=f"metadata.namespace={kube_namespace}")
    assert sorted(p["metadata"]["name"] for p in here) == ["other", "same-name"]
    running = kube.list("v1", "Pod", kube_namespace, field_selector="status.phase=Running")
    assert [p["metadata"]["name"] for p in running] == ["other"]
    pending = kube.list("v1", "Pod", kube_namespace, field_selector="status.phase!=Running")
    assert [p["metadata"]["name"] for p in pending] == ["same-name"]
    with pytest.raises(KubeApiError) as exc:
        kube.list("v1", "Pod", field_selector="spec.containers=x")
    assert exc.value.status == 400 and "field label not supported" in exc.value.body["message"]
    kube.delete("v1", "Namespace", f"{kube_namespace}-b")


def test_list_paging(kube: Kube, kube_namespace: str) -> None:
    for index in range(5):
        kube.create(configmap(f"page-{index}"), kube_namespace)
    path = kube.path("v1", "ConfigMap", kube_namespace)
    first = kube.request("GET", path, params={"limit": 2})
    assert [i["metadata"]["name"] for i in first["items"]] == ["page-0", "page-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    rest = kube.request(
        "GET", path, params={"limit": 10, "continue": first["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in rest["items"]] == ["page-2", "page-3", "page-4"]
    assert "continue" not in rest["metadata"]


# --- watch ----------------------------------------------------------------------------------


def test_watch_replays_from_a_resource_version(kube: Kube, kube_namespace: str) -> None:
    start = kube.request("GET", kube.path("v1", "ConfigMap", kube_namespace))["metadata"][
        "resourceVersion"
    ]
    kube.create(configmap("w"), kube_namespace)
    kube.patch("v1", "ConfigMap", "w", {"data": {"k": "2"}}, kube_namespace)
    kube.delete("v1", "ConfigMap", "w", kube_namespace)
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "resourceVersion": start, "timeoutSeconds": 1},
    )
    assert stream.ended.wait(5)
    assert events(stream.lines) == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in stream.lines]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_watch_streams_live_changes_and_honours_timeout(kube: Kube, kube_namespace: str) -> None:
    kube.create(configmap("before"), kube_namespace)
    began = time.monotonic()
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "timeoutSeconds": 2},
    )
    stream.wait(1)
    kube.create(configmap("during"), kube_namespace)
    assert stream.ended.wait(5)
    elapsed = time.monotonic() - began
    assert events(stream.lines) == [("ADDED", "before"), ("ADDED", "during")]
    assert 1.8 < elapsed < 3.5


def test_a_burst_of_writes_reaches_a_watch_whole_and_in_order(
    kube: Kube, kube_namespace: str
) -> None:
    """Writes from many clients at once: the watch sends each as its reply showed it (the
    same serialization), in resourceVersion order, none lost or doubled, whatever a burst
    queued between two of the watch's writes."""
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "timeoutSeconds": 20},  # (ends by itself; close() waits for that)
    )
    names = [f"burst-{i}" for i in range(40)]
    clients = [Kube(kube.url) for _ in range(8)]
    replies: list[dict[str, Any]] = []
    threads = [
        threading.Thread(
            target=lambda c=client, mine=names[i::8]: replies.extend(
                c.create(configmap(name), kube_namespace) for name in mine
            )
        )
        for i, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    replies.append(kube.patch("v1", "ConfigMap", "burst-0", {"data": {"k": "w"}}, kube_namespace))
    kube.delete("v1", "ConfigMap", "burst-1", kube_namespace)
    lines = stream.wait(len(names) + 2, timeout=15)
    assert [e["type"] for e in lines] == ["ADDED"] * len(names) + ["MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in lines]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    by_version = {r["metadata"]["resourceVersion"]: r for r in replies}
    for event in lines[:-1]:
        assert event["object"] == by_version[event["object"]["metadata"]["resourceVersion"]]


def test_a_watch_from_a_resource_version_replays_only_its_own_kind(
    kube: Kube, kube_namespace: str
) -> None:
    """The store's history holds every kind's events: a watch resumed from a resourceVersion
    must replay only its own (a notebook-controller's CRD watch was once sent a Lease
    update dressed as a CRD, and kopf stopped the operator on it)."""
    since = kube.create(configmap("first"), kube_namespace)["metadata"]["resourceVersion"]
    kube.create(pod("not-a-configmap", {"app": "x"}), kube_namespace)
    kube.create(configmap("second"), kube_namespace)
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "resourceVersion": since, "timeoutSeconds": 1},
    )
    assert stream.ended.wait(5)
    assert events(stream.lines) == [("ADDED", "second")]
    assert {line["object"]["kind"] for line in stream.lines} == {"ConfigMap"}


def test_watch_with_selector_sees_objects_enter_and_leave(kube: Kube, kube_namespace: str) -> None:
    kube.create(pod("p", {"app": "x"}), kube_namespace)
    stream = Stream(
        kube.url + kube.path("v1", "Pod", kube_namespace),
        {"watch": "true", "labelSelector": "app=x", "timeoutSeconds": 2},
    )
    stream.wait(1)
    kube.patch("v1", "Pod", "p", {"metadata": {"labels": {"app": "y"}}}, kube_namespace)
    kube.create(pod("q", {"app": "y"}), kube_namespace)
    kube.patch("v1", "Pod", "q", {"metadata": {"labels": {"app": "x"}}}, kube_namespace)
    assert events(stream.wait(3)) == [("ADDED", "p"), ("DELETED", "p"), ("ADDED", "q")]
    stream.close()


def test_watch_of_a_compacted_resource_version_is_410_gone(kube: Kube, kube_namespace: str) -> None:
    old = kube.create(configmap("old"), kube_namespace)["metadata"]["resourceVersion"]
    kube.create(configmap("newer"), kube_namespace)
    kube.compact()
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "resourceVersion": old, "timeoutSeconds": 1},
    )
    assert stream.ended.wait(5)
    assert stream.lines[0]["type"] == "ERROR" and stream.lines[0]["object"]["code"] == 410


def test_watch_bookmarks_and_initial_events(fresh_kube: Any) -> None:
    cluster = fresh_kube(bookmark_interval=0.2)
    kube = cluster.kube
    kube.create(configmap("one"), "default")
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", "default"),
        {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "timeoutSeconds": 2,
        },
    )
    assert stream.ended.wait(5)
    assert stream.lines[0]["type"] == "ADDED"
    assert stream.lines[1]["type"] == "BOOKMARK"
    assert stream.lines[1]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"
    }
    assert sum(line["type"] == "BOOKMARK" for line in stream.lines) >= 3


# --- status subresource ---------------------------------------------------------------------


def test_status_subresource_separates_status_from_the_rest(kube: Kube, kube_namespace: str) -> None:
    created = kube.create({**pod("s"), "status": {"phase": "Running"}}, kube_namespace)
    assert created["status"]["phase"] == "Pending"  # status is the server's on create
    kube.patch(
        "v1",
        "Pod",
        "s",
        {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Failed"}},
        kube_namespace,
    )
    assert kube.get("v1", "Pod", "s", kube_namespace)["status"]["phase"] == "Pending"
    via_status = kube.patch(
        "v1",
        "Pod",
        "s",
        {"metadata": {"labels": {"c": "d"}}, "status": {"phase": "Running"}},
        kube_namespace,
        subresource="status",
    )
    assert via_status["status"]["phase"] == "Running"
    assert via_status["metadata"]["labels"] == {"a": "b"}  # /status ignores everything else
    full = kube.get("v1", "Pod", "s", kube_namespace)
    replaced = kube.replace({**full, "status": {"phase": "Succeeded"}}, subresource="status")
    assert replaced["status"]["phase"] == "Succeeded"
    with pytest.raises(KubeApiError) as exc:  # no status subresource on ConfigMaps
        kube.request("GET", kube.path("v1", "ConfigMap", kube_namespace, "x", "status"))
    assert exc.value.status == 404


def test_custom_resources_with_and_without_status_subresource(
    kube: Kube, kube_namespace: str
) -> None:
    kube.install_crd(widget_crd(status=True))
    kube.install_crd(widget_crd(status=False))
    kube.create({**widget("a"), "status": {"phase": "x"}}, kube_namespace)
    assert "status" not in kube.get("example.com/v1", "Widget", "a", kube_namespace)
    kube.patch("example.com/v1", "Widget", "a", {"status": {"phase": "ignored"}}, kube_namespace)
    assert "status" not in kube.get("example.com/v1", "Widget", "a", kube_namespace)
    kube.patch(
        "example.com/v1",
        "Widget",
        "a",
        {"status": {"phase": "Ready"}},
        kube_namespace,
        subresource="status",
    )
    assert kube.get("example.com/v1", "Widget", "a", kube_namespace)["status"] == {"phase": "Ready"}
    kube.create(widget("b", group="nostatus.example.com"), kube_namespace)
    patched = kube.patch(
        "nostatus.example.com/v1", "Widget", "b", {"status": {"phase": "Ready"}}, kube_namespace
    )
    assert patched["status"] == {"phase": "Ready"}


# --- patches --------------------------------------------------------------------------------


def test_merge_strategic_and_json_patches(kube: Kube, kube_namespace: str) -> None:
    template = pod("t", {"app": "p"}, containers=("a", "b"))
    template["spec"]["containers"][0]["env"] = [
        {"name": "X", "value": "1"},
        {"name": "Y", "value": "2"},
    ]
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "p", "annotations": {"keep": "1", "drop": "2"}},
            "spec": {
                "selector": {"matchLabels": {"app": "p"}},
                "template": {"metadata": template["metadata"], "spec": template["spec"]},
            },
        },
        kube_namespace,
    )
    merged = kube.patch(
        "apps/v1",
        "Deployment",
        "p",
        {"metadata": {"annotations": {"drop": None, "add": "3"}}},
        kube_namespace,
    )
    assert merged["metadata"]["annotations"] == {"keep": "1", "add": "3"}
    strategic = kube.patch(
        "apps/v1",
        "Deployment",
        "p",
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "a",
                                "image": "python:3.12",
                                "env": [
                                    {"name": "Y", "value": "3"},
                                    {"name": "X", "$patch": "delete"},
                                ],
                            }
                        ]
                    }
                }
            }
        },
        kube_namespace,
        content_type="application/strategic-merge-patch+json",
    )
    containers = strategic["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["a", "b"]  # merged by name, not replaced
    assert containers[0]["image"] == "python:3.12" and containers[0]["env"] == [
        {"name": "Y", "value": "3"}
    ]
    replaced = kube.patch(
        "apps/v1",
        "Deployment",
        "p",
        {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "x"}]}}}},
        kube_namespace,
    )  # a merge patch replaces lists
    assert [c["name"] for c in replaced["spec"]["template"]["spec"]["containers"]] == ["b"]
    kube.create(pod("p"), kube_namespace)
    strategic = kube.get("v1", "Pod", "p", kube_namespace)
    rv = strategic["metadata"]["resourceVersion"]
    patched = kube.patch(
        "v1",
        "Pod",
        "p",
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/labels/new", "value": "yes"},
        ],
        kube_namespace,
        content_type="application/json-patch+json",
    )
    assert patched["metadata"]["labels"] == {"new": "yes"}
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "v1",
            "Pod",
            "p",
            [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}],
            kube_namespace,
            content_type="application/json-patch+json",
        )
    assert exc.value.status == 422
    with pytest.raises(KubeApiError) as exc:  # the sync client's old default: dict as JSON patch
        kube.patch(
            "v1",
            "Pod",
            "p",
            {"metadata": {}},
            kube_namespace,
            content_type="application/json-patch+json",
        )
    assert exc.value.status == 400
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "v1", "Pod", "p", {}, kube_namespace, content_type="application/apply-patch+yaml"
        )
    assert exc.value.status == 415


def test_strategic_merge_is_for_builtins_only(kube: Kube, kube_namespace: str) -> None:
    kube.install_crd(widget_crd())
    kube.create(widget("smp"), kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "example.com/v1",
            "Widget",
            "smp",
            {"spec": {"size": 2}},
            kube_namespace,
            content_type="application/strategic-merge-patch+json",
        )
    assert exc.value.status == 415


def test_server_side_defaults_and_supported_values(kube: Kube, kube_namespace: str) -> None:
    created = kube.create(
        {
            **pod("d"),
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "python:3.12",
                        "ports": [{"containerPort": 80}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 80}},
                    },
                    {"name": "latest", "image": "python"},
                ]
            },
        },
        kube_namespace,
    )
    spec = created["spec"]
    assert (spec["restartPolicy"], spec["dnsPolicy"], spec["schedulerName"]) == (
        "Always",
        "ClusterFirst",
        "default-scheduler",
    )
    first, second = spec["containers"]
    assert (first["imagePullPolicy"], second["imagePullPolicy"]) == ("IfNotPresent", "Always")
    assert first["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert first["readinessProbe"] == {
        "httpGet": {"path": "/", "port": 80, "scheme": "HTTP"},
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    service = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc"},
            "spec": {"selector": {"a": "b"}, "ports": [{"port": 80}]},
        },
        kube_namespace,
    )
    assert service["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    assert service["spec"]["type"] == "ClusterIP" and service["spec"]["clusterIP"].startswith("10.")
    for field, value in (("imagePullPolicy", "Sometimes"), ("terminationMessagePolicy", "Maybe")):
        bad = pod("bad")
        bad["spec"]["containers"][0][field] = value
        with pytest.raises(KubeApiError) as exc:
            kube.create(bad, kube_namespace)
        assert exc.value.status == 422 and "supported values" in exc.value.body["message"]


def test_pods_are_immutable_beyond_images(kube: Kube, kube_namespace: str) -> None:
    kube.create(pod("m", containers=("a", "b")), kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "v1",
            "Pod",
            "m",
            {"spec": {"containers": [{"name": "a", "image": "x"}]}},
            kube_namespace,
        )
    assert exc.value.status == 422
    updated = kube.patch(
        "v1",
        "Pod",
        "m",
        {"spec": {"containers": [{"name": "a", "image": "new"}]}},
        kube_namespace,
        content_type="application/strategic-merge-patch+json",
    )
    assert [c["image"] for c in updated["spec"]["containers"]] == ["new", "python:3.11"]


# --- deletion, finalizers, garbage collection -------------------------------------------------


def _owned(kube: Kube, ns: str, owner: dict[str, Any], name: str, **meta: Any) -> dict[str, Any]:
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    return kube.create(configmap(name, ownerReferences=[ref], **meta), ns)


def test_background_cascade_deletes_dependents(kube: Kube, kube_namespace: str) -> None:
    owner = kube.create(configmap("owner"), kube_namespace)
    _owned(kube, kube_namespace, owner, "child-1")
    _owned(kube, kube_namespace, owner, "child-2")
    kube.delete("v1", "ConfigMap", "owner", kube_namespace)
    assert kube.find("v1", "ConfigMap", "owner", kube_namespace) is None
    kube.wait_for(
        lambda: kube.list("v1", "ConfigMap", kube_namespace) == [], message="dependents gone"
    )


def test_foreground_keeps_the_owner_until_dependents_are_gone(
    kube: Kube, kube_namespace: str
) -> None:
    owner = kube.create(configmap("owner"), kube_namespace)
    _owned(kube, kube_namespace, owner, "held", finalizers=["test/hold"])
    deleting = kube.delete("v1", "ConfigMap", "owner", kube_namespace, propagation="Foreground")
    assert (
        deleting["metadata"]["deletionTimestamp"]
        and "foregroundDeletion" in deleting["metadata"]["finalizers"]
    )
    time.sleep(0.2)
    held = kube.get("v1", "ConfigMap", "held", kube_namespace)
    assert held["metadata"]["deletionTimestamp"]
    assert kube.find("v1", "ConfigMap", "owner", kube_namespace) is not None
    kube.patch("v1", "ConfigMap", "held", {"metadata": {"finalizers": None}}, kube_namespace)
    kube.wait_for(
        lambda: kube.find("v1", "ConfigMap", "owner", kube_namespace) is None, message="owner gone"
    )
    assert kube.find("v1", "ConfigMap", "held", kube_namespace) is None


def test_orphan_propagation_keeps_dependents(kube: Kube, kube_namespace: str) -> None:
    owner = kube.create(configmap("owner"), kube_namespace)
    _owned(kube, kube_namespace, owner, "kept")
    kube.delete("v1", "ConfigMap", "owner", kube_namespace, propagation="Orphan")
    time.sleep(0.1)
    kept = kube.get("v1", "ConfigMap", "kept", kube_namespace)
    assert "ownerReferences" not in kept["metadata"]


def test_dependents_of_an_owner_that_never_existed_are_collected(
    kube: Kube, kube_namespace: str
) -> None:
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ghost", "uid": "no-such-uid"},
    }
    _owned(kube, kube_namespace, ghost, "orphan")
    kube.wait_for(
        lambda: kube.find("v1", "ConfigMap", "orphan", kube_namespace) is None,
        message="orphan gone",
    )


def test_finalizers_hold_deletion_and_cannot_be_added_during_it(
    kube: Kube, kube_namespace: str
) -> None:
    kube.create(configmap("fin", finalizers=["test/a"]), kube_namespace)
    stream = Stream(
        kube.url + kube.path("v1", "ConfigMap", kube_namespace),
        {"watch": "true", "timeoutSeconds": 2},
    )
    stream.wait(1)
    kube.delete("v1", "ConfigMap", "fin", kube_namespace)
    marked = kube.get("v1", "ConfigMap", "fin", kube_namespace)
    assert marked["metadata"]["deletionTimestamp"]
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "v1",
            "ConfigMap",
            "fin",
            {"metadata": {"finalizers": ["test/a", "test/b"]}},
            kube_namespace,
        )
    assert exc.value.status == 422
    kube.patch("v1", "ConfigMap", "fin", {"metadata": {"finalizers": []}}, kube_namespace)
    assert kube.find("v1", "ConfigMap", "fin", kube_namespace) is None
    assert events(stream.wait(3)) == [("ADDED", "fin"), ("MODIFIED", "fin"), ("DELETED", "fin")]
    stream.close()


def test_deleting_a_namespace_deletes_its_content(kube: Kube) -> None:
    kube.create_namespace("short-lived")
    kube.create(configmap("c"), "short-lived")
    kube.create(pod("p"), "short-lived")
    kube.delete("v1", "Namespace", "short-lived")
    kube.wait_for(
        lambda: kube.find("v1", "Namespace", "short-lived") is None, message="namespace gone"
    )
    assert kube.list("v1", "Pod", field_selector="metadata.namespace=short-lived") == []


def test_delete_preconditions(kube: Kube, kube_namespace: str) -> None:
    kube.create(configmap("pre"), kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.request(
            "DELETE",
            kube.path("v1", "ConfigMap", kube_namespace, "pre"),
            {"preconditions": {"uid": "other"}},
        )
    assert exc.value.status == 409
    assert kube.find("v1", "ConfigMap", "pre", kube_namespace) is not None


# --- validation -----------------------------------------------------------------------------


def test_builtin_kinds_are_validated_strictly(kube: Kube, kube_namespace: str) -> None:
    bad = pod("bad")
    bad["spec"]["containers"][0]["imagePullPolicy_typo"] = "Always"
    with pytest.raises(KubeApiError) as exc:
        kube.create(bad, kube_namespace)
    assert exc.value.status == 422 and exc.value.body["reason"] == "Invalid"
    assert exc.value.body["details"]["causes"][0]["field"] == "spec.containers[0]"
    with pytest.raises(KubeApiError) as exc:
        kube.create(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}},
            kube_namespace,
        )
    assert exc.value.status == 422
    with pytest.raises(KubeApiError):
        kube.create(pod("Upper_Case"), kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.create(pod("user", {"owner": "alice@example.com"}), kube_namespace)
    assert exc.value.status == 422 and "label" in exc.value.body["message"]
    assert kube.list("v1", "Pod", kube_namespace) == []


def test_immutable_fields_are_enforced(kube: Kube, kube_namespace: str) -> None:
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sts"},
        "spec": {
            "serviceName": "sts",
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }
    kube.create(sts, kube_namespace)
    assert (
        kube.patch("apps/v1", "StatefulSet", "sts", {"spec": {"replicas": 0}}, kube_namespace)[
            "spec"
        ]["replicas"]
        == 0
    )
    with pytest.raises(KubeApiError) as exc:
        kube.patch(
            "apps/v1", "StatefulSet", "sts", {"spec": {"serviceName": "other"}}, kube_namespace
        )
    assert exc.value.status == 422


def test_the_cached_validator_agrees_with_kubernetes_validate() -> None:
    good = pod("x")
    bad = pod("y")
    bad["spec"]["bogus"] = True
    for obj in (good, bad, configmap("z")):
        assert bool(validate_builtin(obj)) == bool(validate_builtin_uncached(obj))


def test_crds_validate_prune_and_default_their_objects(kube: Kube, kube_namespace: str) -> None:
    kube.install_crd(widget_crd())
    with pytest.raises(KubeApiError) as exc:
        kube.create(widget("w", size="big"), kube_namespace)
    assert (
        exc.value.status == 422 and exc.value.body["details"]["causes"][0]["field"] == "spec.size"
    )
    with pytest.raises(KubeApiError):
        kube.create(widget("w", size=0), kube_namespace)
    with pytest.raises(KubeApiError):
        kube.create({**widget("w"), "spec": {}}, kube_namespace)
    response = kube.http.post(
        kube.url + kube.path("example.com/v1", "Widget", kube_namespace),
        json=widget("w", typo=1, extra={"free": "form"}),
    )
    assert response.status_code == 201 and "unknown field" in response.headers["Warning"]
    stored = kube.get("example.com/v1", "Widget", "w", kube_namespace)
    assert stored["spec"] == {"size": 1, "color": "blue", "extra": {"free": "form"}}
    strict = kube.http.post(
        kube.url + kube.path("example.com/v1", "Widget", kube_namespace),
        params={"fieldValidation": "Strict"},
        json=widget("w2", typo=1),
    )
    assert strict.status_code == 400


def test_crds_appear_in_discovery_and_go_with_their_objects(
    kube: Kube, kube_namespace: str
) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "gadgets.toys.example.com"
    crd["spec"].update(group="toys.example.com", names={"plural": "gadgets", "kind": "Gadget"})
    kube.install_crd(crd)
    groups = {g["name"]: g for g in kube.request("GET", "/apis")["groups"]}
    assert groups["toys.example.com"]["preferredVersion"]["version"] == "v1"
    assert (
        kube.request("GET", "/apis/toys.example.com")["versions"][0]["groupVersion"]
        == "toys.example.com/v1"
    )
    resources = {
        r["name"]: r for r in kube.request("GET", "/apis/toys.example.com/v1")["resources"]
    }
    assert resources["gadgets"]["kind"] == "Gadget" and resources["gadgets"]["namespaced"] is True
    assert "gadgets/status" in resources
    kube.create(
        {
            "apiVersion": "toys.example.com/v1",
            "kind": "Gadget",
            "metadata": {"name": "g"},
            "spec": {"size": 1},
        },
        kube_namespace,
    )
    established = kube.get(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", "gadgets.toys.example.com"
    )
    assert {c["type"] for c in established["status"]["conditions"]} == {
        "NamesAccepted",
        "Established",
    }
    kube.uninstall_crd("gadgets.toys.example.com")
    assert "toys.example.com" not in {g["name"] for g in kube.request("GET", "/apis")["groups"]}
    with pytest.raises(KubeApiError) as exc:
        kube.request("GET", f"/apis/toys.example.com/v1/namespaces/{kube_namespace}/gadgets")
    assert exc.value.status == 404


def test_an_invalid_crd_is_rejected(kube: Kube) -> None:
    crd = widget_crd()
    crd["metadata"]["name"] = "wrong.example.com"
    with pytest.raises(KubeApiError) as exc:
        kube.create(crd)
    assert exc.value.status == 422


def test_builtin_discovery(kube: Kube) -> None:
    groups = {g["name"] for g in kube.request("GET", "/apis")["groups"]}
    assert {
        "apps",
        "batch",
        "rbac.authorization.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
        "networking.k8s.io",
        "coordination.k8s.io",
    } <= groups
    core = {r["name"] for r in kube.request("GET", "/api/v1")["resources"]}
    assert {"pods", "pods/status", "pods/log", "services", "events", "namespaces"} <= core
    assert kube.request("GET", "/version")["minor"] == "33"
    for path in ("/version/", "/api/", "/apis/", "/api/v1/", "/apis/apps/", "/apis/apps/v1/"):
        assert kube.request("GET", path), path  # trailing slashes, as real servers answer
    assert (
        kubernetes.client.VersionApi(
            kubernetes.config.new_client_from_config(os.environ["KUBECONFIG"])
        )
        .get_code()
        .minor
        == "33"
    )


def test_istio_versions_are_whatever_the_test_installs(fresh_kube: Any) -> None:
    kube = fresh_kube().kube
    for crd in istio_crds(networking=("v1beta1",), security=("v1beta1",)):
        kube.install_crd(crd)
    group = kube.request("GET", "/apis/networking.istio.io")
    assert [v["version"] for v in group["versions"]] == ["v1beta1"]
    for crd in istio_crds():
        kube.install_crd(crd)
    assert kube.request("GET", "/apis/networking.istio.io")["preferredVersion"]["version"] == "v1"
    assert kube.request("GET", "/apis/security.istio.io")["preferredVersion"]["version"] == "v1"
    vs = {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "VirtualService",
        "metadata": {"name": "vs", "namespace": "default"},
        "spec": {"hosts": ["*"], "http": [{"route": [{"destination": {"host": "svc"}}]}]},
    }
    kube.create(vs)
    # One storage, two served versions.
    assert (
        kube.get("networking.istio.io/v1", "VirtualService", "vs", "default")["apiVersion"]
        == "networking.istio.io/v1"
    )
    with pytest.raises(KubeApiError) as exc:
        kube.create(
            {
                **vs,
                "metadata": {"name": "bad", "namespace": "default"},
                "spec": {"http": [{"route": [{"destination": {}}]}]},
            }
        )
    assert exc.value.status == 422


# --- pod logs -------------------------------------------------------------------------------


def test_pod_logs(kube: Kube, kube_namespace: str) -> None:
    kube.create(pod("logger"), kube_namespace)
    log_path = kube.path("v1", "Pod", kube_namespace, "logger", "log")
    with pytest.raises(KubeApiError) as exc:
        kube.request("GET", log_path)
    assert exc.value.status == 400 and "waiting to start" in exc.value.body["message"]
    kube.set_pod_phase(kube_namespace, "logger", "Running")
    kube.append_log(kube_namespace, "logger", "one\ntwo\n")
    kube.append_log(kube_namespace, "logger", "thr")
    kube.append_log(kube_namespace, "logger", "ee\n")
    assert kube.request("GET", log_path) == "one\ntwo\nthree\n"
    assert kube.request("GET", log_path, params={"tailLines": 1}) == "three\n"
    stamped = kube.request("GET", log_path, params={"timestamps": "true"}).splitlines()
    assert stamped[0].endswith("Z one") and len(stamped) == 3
    future = "2999-01-01T00:00:00Z"
    assert kube.request("GET", log_path, params={"sinceTime": future}) == ""


def test_pod_logs_need_a_container_name_when_there_are_several(
    kube: Kube, kube_namespace: str
) -> None:
    kube.create(pod("two", containers=("main", "side")), kube_namespace)
    kube.set_pod_phase(kube_namespace, "two", "Running")
    kube.append_log(kube_namespace, "two", "from side\n", container="side")
    log_path = kube.path("v1", "Pod", kube_namespace, "two", "log")
    with pytest.raises(KubeApiError) as exc:
        kube.request("GET", log_path)
    assert exc.value.status == 400 and "choose one of: [main side]" in exc.value.body["message"]
    assert kube.request("GET", log_path, params={"container": "side"}) == "from side\n"
    assert kube.request("GET", log_path, params={"container": "main"}) == ""


def test_followed_logs_stream_until_the_container_ends_and_vanish_with_the_pod(
    kube: Kube, kube_namespace: str
) -> None:
    kube.create(pod("f"), kube_namespace)
    kube.set_pod_phase(kube_namespace, "f", "Running")
    kube.append_log(kube_namespace, "f", "early\n")
    stream = Stream(
        kube.url + kube.path("v1", "Pod", kube_namespace, "f", "log"), {"follow": "true"}
    )
    assert stream.wait(1) == ["early"]
    kube.append_log(kube_namespace, "f", "late\n")
    assert stream.wait(2) == ["early", "late"]
    kube.set_pod_phase(kube_namespace, "f", "Succeeded")
    assert stream.ended.wait(5)
    kube.delete("v1", "Pod", "f", kube_namespace)
    with pytest.raises(KubeApiError) as exc:
        kube.request("GET", kube.path("v1", "Pod", kube_namespace, "f", "log"))
    assert exc.value.status == 404


# --- events, kubelet/controller roles, fault injection ----------------------------------------


def test_events_in_both_apis(kube: Kube, kube_namespace: str) -> None:
    target = kube.create(pod("ev"), kube_namespace)
    kube.record_event(target, "Scheduled", "Successfully assigned")
    kube.create(
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "ev.new", "namespace": kube_namespace},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "test",
            "reportingInstance": "test-1",
            "action": "Testing",
            "reason": "Tested",
            "type": "Normal",
            "regarding": {"kind": "Pod", "name": "ev", "namespace": kube_namespace},
            "note": "hi",
        }
    )
    core = kube.list("v1", "Event", kube_namespace, field_selector="involvedObject.name=ev")
    assert [e["reason"] for e in core] == ["Scheduled"]
    assert [e["note"] for e in kube.list("events.k8s.io/v1", "Event", kube_namespace)] == ["hi"]


def test_run_statefulset_plays_controller_and_kubelet(kube: Kube, kube_namespace: str) -> None:
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db"},
            "spec": {
                "replicas": 2,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        },
        kube_namespace,
    )
    pods = kube.run_statefulset(kube_namespace, "db")
    assert [p["metadata"]["name"] for p in pods] == ["db-0", "db-1"]
    assert kube.get("apps/v1", "StatefulSet", "db", kube_namespace)["status"]["readyReplicas"] == 2
    kube.patch("apps/v1", "StatefulSet", "db", {"spec": {"replicas": 0}}, kube_namespace)
    kube.run_statefulset(kube_namespace, "db")
    assert kube.list("v1", "Pod", kube_namespace) == []
    kube.delete("apps/v1", "StatefulSet", "db", kube_namespace)


def test_kmock_reactions_still_inject_faults(kube: Kube, kube_namespace: str) -> None:
    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    kube.on_emulator(lambda e: e["post", path][:1] << 503)  # exactly one failure
    with pytest.raises(KubeApiError) as exc:
        kube.create(configmap("flaky"), kube_namespace)
    assert exc.value.status == 503
    assert kube.create(configmap("flaky"), kube_namespace)["metadata"]["name"] == "flaky"
