"""Per-user notebook servers, the parts without a cluster: the request -> Notebook mapping,
the view REST and /events show (against the OpenAPI schema), the request schema agreeing with
the controller's own validation, the feed that decides what /events says, identities, and
the REST API of a server that has no cluster. (With a cluster: tests/kube/notebooks_api/.)"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from jupyterlab_mlcluster.kubeconn import NO_CLUSTER
from jupyterlab_mlcluster.server.identity import IdentityError, calling_user
from jupyterlab_mlcluster.server.notebook_feed import NotebookFeed
from jupyterlab_mlcluster.server.notebooks import (
    OWNER_LABEL,
    InvalidNotebook,
    notebook_name_error,
    notebook_view,
    owner_label,
    spawn_arguments,
)
from jupyterlab_mlcluster.server.openapi import Validators, build_document
from notebook_controller.objects import notebook_resource

LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DOCUMENT = build_document(max_workers=1)
VALIDATORS = Validators(DOCUMENT)
NOTEBOOK_SCHEMA = {"$ref": "#/components/schemas/Notebook"}
REQUEST_SCHEMA = {"$ref": "#/components/schemas/NotebookRequest"}


def schema_accepts(schema: dict[str, Any], value: Any) -> bool:
    try:
        VALIDATORS.check(schema, value, "body")
    except ValueError:
        return False
    return True


def spawned(request: dict[str, Any], owner: str = "alice@example.com") -> dict[str, Any]:
    return notebook_resource(
        request["name"],
        "users",
        owner,
        **spawn_arguments(request, "img:1"),
        labels={OWNER_LABEL: owner_label(owner)},
    )


# -- requests -> Notebooks ----------------------------------------------------------------------


def test_owner_labels_are_valid_and_distinct():
    users = ["alice", "alice@example.com", "Alice", "a" * 200, "ünïcode", "", "-weird-", "x.org"]
    labels = [owner_label(u) for u in users]
    assert len(set(labels)) == len(users)
    for label in labels:
        assert len(label) <= 63 and jsonschema.validators.Draft202012Validator(
            {"pattern": LABEL_VALUE}
        ).is_valid(label), label


def test_a_spawn_request_becomes_the_controllers_notebook():
    """The controller's own builder makes it (its output is tested in its suite); this maps
    the request's fields onto it and adds the owner label."""
    obj = spawned({"name": "nb1", "cpu": 0.5, "memory": "4Gi", "gpus": 1, "workspace_size": "10Gi"})
    assert obj == notebook_resource(
        "nb1",
        "users",
        "alice@example.com",
        image="img:1",
        cpu="500m",
        memory="4Gi",
        gpus=1,
        workspace_size="10Gi",
        labels={OWNER_LABEL: owner_label("alice@example.com")},
    )
    assert obj["metadata"]["labels"] == {OWNER_LABEL: owner_label("alice@example.com")}


@pytest.mark.parametrize(
    ("cpu", "quantity"),
    [(2, "2"), (2.0, "2"), (0.5, "500m"), (1.25, "1250m"), (0.0001, "1m"), ("250m", "250m")],
)
def test_cpu_numbers_become_quantities(cpu, quantity):
    assert spawn_arguments({"name": "x", "cpu": cpu}, "")["cpu"] == quantity


def test_defaults_are_left_to_the_controller():
    args = spawn_arguments({"name": "x", "gpus": 2.0}, "")
    assert args == {"image": None, "cpu": None, "memory": None, "gpus": 2, "workspace_size": None}
    container = spawned({"name": "x"})["spec"]["template"]["spec"]["containers"][0]
    assert container == {"name": "notebook", "image": "img:1"}
    assert (
        "image"
        not in notebook_resource("x", "ns", "bob", **args)["spec"]["template"]["spec"][
            "containers"
        ][0]
    )


NAMES = [
    "a",
    "nb1",
    "my-notebook",
    "a" * 52,
    "a" * 53,
    "",
    "1abc",
    "-abc",
    "abc-",
    "Abc",
    "a_b",
    "a.b",
    "ab\n",
    "é",
    "a--b",
]


@pytest.mark.parametrize("name", NAMES)
def test_the_request_schema_takes_exactly_the_names_the_controller_takes(name):
    in_schema = schema_accepts(REQUEST_SCHEMA, {"name": name})
    assert in_schema == (notebook_name_error(name) is None)
    path_schema = VALIDATORS.parameters("/notebooks/{name}", "get")[0]["schema"]
    assert schema_accepts(path_schema, name) == in_schema


# (value, {field: (the request schema takes it, the controller's builder takes it)}). The
# schema may be stricter than the builder (which strips surrounding spaces), never looser.
QUANTITIES = [
    ("1", {"cpu": (True, True), "memory": (True, True), "workspace_size": (True, True)}),
    ("0.5", {"cpu": (True, True), "memory": (True, True), "workspace_size": (True, True)}),
    ("500m", {"cpu": (True, True), "memory": (False, False), "workspace_size": (False, False)}),
    ("4Gi", {"cpu": (False, False), "memory": (True, True), "workspace_size": (True, True)}),
    ("4G", {"cpu": (False, False), "memory": (True, True), "workspace_size": (True, True)}),
    ("1.5Ti", {"cpu": (False, False), "memory": (True, True), "workspace_size": (True, True)}),
    ("1Ei", {"cpu": (False, False), "memory": (True, True), "workspace_size": (False, False)}),
    ("4GB", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
    ("4gi", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
    ("-1", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
    ("1e3", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
    ("", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
    (" 4Gi", {"cpu": (False, False), "memory": (False, True), "workspace_size": (False, True)}),
    ("4 Gi", {"cpu": (False, False), "memory": (False, False), "workspace_size": (False, False)}),
]


@pytest.mark.parametrize(
    ("field", "value", "in_schema", "in_builder"),
    [
        (field, value, in_schema, in_builder)
        for value, outcomes in QUANTITIES
        for field, (in_schema, in_builder) in outcomes.items()
    ],
)
def test_what_the_request_schema_takes_the_builder_takes_too(field, value, in_schema, in_builder):
    """So a request the document calls valid never gets a 400 from the builder."""
    request = {"name": "nb", field: value}
    assert schema_accepts(REQUEST_SCHEMA, request) == in_schema
    try:
        spawned(request)
        built = True
    except InvalidNotebook:
        built = False
    assert built == in_builder
    assert in_builder or not in_schema


def test_quantities_in_the_request_schema():
    good = {
        "cpu": [0.5, 2, "2", "500m"],
        "memory": ["4Gi", "512M", "1.5G"],
        "workspace_size": ["10Gi"],
    }
    bad = {
        "cpu": [0, -1, "2 cpus", "0.5Gi", True],
        "memory": ["4GB", "4 Gi", 4],
        "workspace_size": ["1Ei", "10GB"],
    }
    for field, values in good.items():
        for value in values:
            assert schema_accepts(REQUEST_SCHEMA, {"name": "nb", field: value}), (field, value)
            spawned({"name": "nb", field: value})
    for field, values in bad.items():
        for value in values:
            assert not schema_accepts(REQUEST_SCHEMA, {"name": "nb", field: value}), (field, value)


# -- the view ---------------------------------------------------------------------------------


def with_status(obj: dict[str, Any], **status: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(uid="u1", creationTimestamp="2026-01-02T03:04:05Z")
    obj["status"] = status
    return obj


def test_the_view_is_the_controllers_summary_and_matches_the_schema():
    obj = with_status(
        spawned({"name": "nb1", "cpu": "2", "memory": "4Gi", "workspace_size": "1Gi"}),
        phase="ready",
        message="ready",
        ready=True,
        url="/notebook/users/nb1/",
    )
    view = notebook_view(obj)
    assert schema_accepts(NOTEBOOK_SCHEMA, view), view
    assert view == {
        "name": "nb1",
        "namespace": "users",
        "owner": "alice@example.com",
        "phase": "ready",
        "ready": True,
        "stopped": False,
        "url": "/notebook/users/nb1/",
        "message": "ready",
        "created": "2026-01-02T03:04:05Z",
        "last_activity": None,
        "image": "img:1",
        "cpu": "2",
        "memory": "4Gi",
        "gpus": 0,
        "workspace_size": "1Gi",
    }
    fresh = notebook_view(spawned({"name": "nb2"}))
    assert schema_accepts(NOTEBOOK_SCHEMA, {**fresh, "created": None})
    assert fresh["phase"] == "starting" and fresh["url"] == "/notebook/users/nb2/"


def test_pod_events_are_the_message_only_while_it_spawns():
    progress = {"message": "Pod nb1-0: Pulling image img:1", "time": "2026-01-02T03:04:06Z"}
    base = spawned({"name": "nb1"})
    starting = with_status(base, phase="starting", message="waiting for the pod to start")
    assert notebook_view(starting, progress)["message"] == progress["message"]
    assert notebook_view(starting)["message"] == "waiting for the pod to start"
    for phase in ("ready", "error: ImagePullBackOff: no such image"):
        obj = with_status(base, phase=phase, message="theirs")
        assert notebook_view(obj, progress)["message"] == "theirs", phase
    stopped = with_status(base, phase="starting", message="stopping")
    stopped["metadata"]["annotations"] = {"mlcluster.io/stopped": "2026-01-02T03:04:07Z"}
    assert notebook_view(stopped, progress)["message"] == "stopping"
    deleting = with_status(base, phase="starting", message="x")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:08Z"
    view = notebook_view(deleting, progress)
    assert view["phase"] == "deleting" and view["message"] == "x"


# -- the feed: what /events says -------------------------------------------------------------


class Published(list):
    def __call__(self, owner: str, name: str, message: dict[str, Any]) -> None:
        self.append((owner, name, message))

    def take(self) -> list[tuple[str, str, dict[str, Any]]]:
        taken = list(self)
        self.clear()
        return taken


def notebook(
    name: str, owner: str, uid: str, phase: str | None = None, stopped: bool = False
) -> dict[str, Any]:
    obj = spawned({"name": name}, owner)
    obj["metadata"].update(uid=uid, creationTimestamp="2026-01-02T03:00:00Z")
    if stopped:
        obj["metadata"]["annotations"] = {"mlcluster.io/stopped": "2026-01-02T03:30:00Z"}
    if phase:
        obj["status"] = {"phase": phase, "message": f"status {phase}"}
    return obj


def event(name: str, uid: str, message: str, at: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.{at}", "namespace": "users"},
        "involvedObject": {"kind": "Notebook", "name": name, "uid": uid},
        "message": message,
        "lastTimestamp": at,
    }


def messages(published: Published) -> list[tuple[str, str, str]]:
    """(owner, type, phase or name: message) of each published message, in order."""
    out = []
    for owner, _, message in published.take():
        if message["type"] == "notebook":
            view = message["notebook"]
            stopped = " (stopped)" if view["stopped"] else ""
            out.append((owner, "notebook", f"{view['phase']}{stopped}: {view['message']}"))
        else:
            out.append((owner, message["type"], message["name"]))
    return out


def test_the_feed_tells_each_owner_of_their_notebooks_changes():
    published = Published()
    feed = NotebookFeed(published)
    feed.replace_notebooks([notebook("nb1", "alice", "u1"), notebook("nb2", "bob", "u2", "ready")])
    assert messages(published) == [
        ("alice", "notebook", "starting: waiting for the controller"),
        ("bob", "notebook", "ready: status ready"),
    ]
    same = notebook("nb2", "bob", "u2", "ready")
    same["metadata"]["annotations"] = {"kopf.mlcluster.io/last-handled-configuration": "{}"}
    feed.notebook_changed("MODIFIED", same)
    assert messages(published) == [], "nothing its owner can see changed"

    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "starting"))
    feed.event_changed("ADDED", event("nb1", "u1", "Pod nb1-0: Scheduled", "2026-01-02T03:01:00Z"))
    feed.event_changed("ADDED", event("nb1", "u1", "Pod nb1-0: Pulling", "2026-01-02T03:02:00Z"))
    feed.event_changed("MODIFIED", event("nb1", "u1", "Pod nb1-0: older", "2026-01-02T03:01:30Z"))
    feed.event_changed("ADDED", event("nb1", "u0", "an earlier nb1's", "2026-01-02T03:03:00Z"))
    feed.event_changed("ADDED", event("nb2", "u2", "Pod nb2-0: Killing", "2026-01-02T03:03:00Z"))
    assert messages(published) == [
        ("alice", "notebook", "starting: status starting"),
        ("alice", "notebook", "starting: Pod nb1-0: Scheduled"),
        ("alice", "notebook", "starting: Pod nb1-0: Pulling"),
    ]
    assert feed.progress(notebook("nb1", "alice", "u1"))["message"] == "Pod nb1-0: Pulling"

    # Ready, stopped, started again: the old spawn's events are not the new one's progress.
    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "ready"))
    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "ready", stopped=True))
    feed.event_changed("ADDED", event("nb1", "u1", "Pod nb1-0: Killing", "2026-01-02T03:31:00Z"))
    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "stopped", stopped=True))
    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "stopped"))  # started
    feed.notebook_changed("MODIFIED", notebook("nb1", "alice", "u1", "starting"))
    assert messages(published) == [
        ("alice", "notebook", "ready: status ready"),
        ("alice", "notebook", "ready (stopped): status ready"),
        ("alice", "notebook", "stopped (stopped): status stopped"),
        ("alice", "notebook", "stopped: status stopped"),
        ("alice", "notebook", "starting: status starting"),
    ]
    feed.event_changed("ADDED", event("nb1", "u1", "Pod nb1-0: again", "2026-01-02T03:40:00Z"))
    assert messages(published) == [("alice", "notebook", "starting: Pod nb1-0: again")]

    # Handed to another owner: gone for the first, new for the second.
    feed.notebook_changed("MODIFIED", notebook("nb2", "carol", "u2", "ready"))
    assert messages(published) == [
        ("bob", "notebook_deleted", "nb2"),
        ("carol", "notebook", "ready: status ready"),
    ]
    feed.notebook_changed("DELETED", notebook("nb2", "carol", "u2", "ready"))
    # A relist that misses nb1: it was deleted while nobody watched.
    feed.replace_notebooks([])
    assert messages(published) == [
        ("carol", "notebook_deleted", "nb2"),
        ("alice", "notebook_deleted", "nb1"),
    ]


def test_relisted_events_give_the_newest_progress():
    published = Published()
    feed = NotebookFeed(published)
    feed.replace_notebooks([notebook("nb1", "alice", "u1", "starting")])
    feed.replace_events(
        [
            event("nb1", "u1", "second", "2026-01-02T03:02:00Z"),
            event("nb1", "u1", "first", "2026-01-02T03:01:00Z"),
        ]
    )
    assert messages(published)[-1] == ("alice", "notebook", "starting: second")


# -- identity -----------------------------------------------------------------------------------


class User:
    username = "jupyter-user"


def test_identity_from_the_identity_provider_unless_a_proxy_header_is_trusted():
    headers = {"kubeflow-userid": "mallory"}
    assert calling_user(User(), headers, trust_header=False, header="kubeflow-userid") == (
        "jupyter-user"
    ), "an untrusted header is ignored"
    trusted = {"trust_header": True, "header": "kubeflow-userid"}
    assert calling_user(User(), {"kubeflow-userid": "alice@x.org"}, **trusted) == "alice@x.org"
    assert (
        calling_user(
            User(),
            {"kubeflow-userid": "accounts.google.com:alice@x.org"},
            **trusted,
            prefix="accounts.google.com:",
        )
        == "alice@x.org"
    )
    for headers in ({}, {"kubeflow-userid": " "}, {"kubeflow-userid": "accounts.google.com:"}):
        with pytest.raises(IdentityError, match="kubeflow-userid"):
            calling_user(User(), headers, **trusted, prefix="accounts.google.com:")
    with pytest.raises(IdentityError, match="prefix"):
        calling_user(User(), {"kubeflow-userid": "alice"}, **trusted, prefix="accounts.google.com:")


# -- REST without a cluster ---------------------------------------------------------------------


async def test_without_a_cluster_notebook_routes_answer_503_after_checking_input(api):
    for method, path, body in [
        ("GET", ("notebooks",), None),
        ("POST", ("notebooks",), {"name": "nb1", "cpu": 1}),
        ("GET", ("notebooks", "nb1"), None),
        ("DELETE", ("notebooks", "nb1"), None),
        ("POST", ("notebooks", "nb1", "stop"), None),
        ("POST", ("notebooks", "nb1", "start"), None),
    ]:
        status, error, _ = await api(method, *path, body=body)
        assert status == 503, (method, path, status, error)
        assert error["message"].startswith(NO_CLUSTER) and "kubeconfig" in error["message"]
    # Bad input is refused as such, cluster or not, in the controller's own words.
    status, error, _ = await api("POST", "notebooks", body={"name": "Bad_Name"})
    assert status == 400 and error["message"] == f"name: {notebook_name_error('Bad_Name')}"
    status, error, _ = await api("POST", "notebooks", body={"name": "nb1", "memory": "4GB"})
    assert status == 400 and "memory" in error["message"]
    status, error, _ = await api("POST", "notebooks", "x" * 53, "stop")
    assert status == 400 and error["message"] == notebook_name_error("x" * 53)
    status, error, _ = await api("GET", "notebooks", "ab\n")
    assert status == 400 and error["message"] == notebook_name_error("ab\n")
