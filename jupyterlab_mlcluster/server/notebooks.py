"""Per-user notebook servers: the calling user's `Notebook` objects (notebooks.mlcluster.io).

`NotebookService` is what the REST handlers call (synchronously, from the server's
executor). Without a Kubernetes cluster every call raises `ClusterUnavailable` (503 with the
reason); with one, it manages the user's Notebook custom objects, which the notebook-controller
turns into a StatefulSet, Service and Istio routes. The Notebook itself and what is shown of it
come from the pure builders the controller uses too (`jupyterlab_mlcluster/notebook_resource.py`),
so the REST API, the sidebar and `kubectl get nb` never disagree.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..kubeconn import NO_CLUSTER, ClusterUnavailable, KubeConnection, KubeError
from ..notebook_resource import (
    GROUP,
    PLURAL,
    VERSION,
    InvalidNotebook,
    guarded_stop_patch,
    is_stopped,
    notebook_name_error,
    notebook_resource,
    notebook_status_summary,
)
from .user_namespace import (
    DEFAULT_TEMPLATE,
    PROFILE_GROUP,
    PROFILE_PLURAL,
    PROFILE_VERSION,
    check_template,
    namespaces_to_read,
    user_namespace,
)

__all__ = [
    "NO_CLUSTER",
    "OWNER_LABEL",
    "ClusterUnavailable",
    "InvalidNotebook",
    "KubeError",
    "NotebookExists",
    "NotebookNotFound",
    "NotebookService",
    "QuotaExceeded",
    "UserNamespaces",
    "is_spawning",
    "notebook_name_error",
    "notebook_view",
    "owner_label",
    "spawn_arguments",
]

# Narrows list and watch queries to the notebooks spawned through this API (and to one user's);
# the exact owner is spec.owner, which is what decides.
OWNER_LABEL = "mlcluster.io/owner"


class NotebookNotFound(KeyError):
    def __str__(self) -> str:
        return f"you have no notebook server named {self.args[0]!r}"


class NotebookExists(RuntimeError):
    pass


class QuotaExceeded(RuntimeError):
    """The user has as many notebook servers as MLClusterApp.notebook_quota allows."""


# -- pure functions ----------------------------------------------------------------------------


def owner_label(user: str) -> str:
    """A label value for a user name (labels allow 63 chars of [A-Za-z0-9-_.])."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", user).strip("-_.")[:40]
    digest = hashlib.sha256(user.encode()).hexdigest()[:10]
    return f"{slug}-{digest}" if slug else digest


def _cpu_quantity(cpu: Any) -> Any:
    """JSON numbers as Kubernetes quantities (0.5 -> '500m'); strings are left to the builder."""
    if isinstance(cpu, bool) or not isinstance(cpu, (int, float)):
        return cpu
    millis = max(1, round(cpu * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def spawn_arguments(request: Mapping[str, Any], default_image: str) -> dict[str, Any]:
    """`notebook_resource` keyword arguments from a `POST /notebooks` body."""
    gpus = request.get("gpus", 0)
    if isinstance(gpus, float) and gpus.is_integer():
        gpus = int(gpus)  # JSON has no integers of its own: 2.0 is 2
    return {
        "image": request.get("image") or default_image or None,  # None: the controller's default
        "cpu": _cpu_quantity(request.get("cpu")),
        "memory": request.get("memory"),
        "gpus": gpus,
        "workspace_size": request.get("workspace_size"),
    }


def is_spawning(obj: Mapping[str, Any]) -> bool:
    """On its way up: neither stopped, deleted, ready nor failed (pod events are its progress)."""
    phase = (obj.get("status") or {}).get("phase") or ""
    return not (
        is_stopped(obj)
        or obj["metadata"].get("deletionTimestamp")
        or phase == "ready"
        or phase.startswith("error")
    )


def notebook_view(
    obj: Mapping[str, Any], progress: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What the REST API and /events show of a Notebook: the controller's summary, with the
    latest pod event re-issued on it as the message while it spawns (`progress`)."""
    view = notebook_status_summary(obj)
    if progress is not None and is_spawning(obj):
        view["message"] = progress["message"]
    return view


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# -- where each user's notebooks live ---------------------------------------------------------


class UserNamespaces:
    """User -> namespace on the cluster (`user_namespace.py`'s rule), with the cluster's
    Profiles, and the Namespaces that decide whether a Profile counts, read at most every
    `ttl` seconds. Blocking: call from an executor thread."""

    def __init__(
        self, connection: KubeConnection, template: str = DEFAULT_TEMPLATE, ttl: float = 30.0
    ):
        self.connection = connection
        self.template = check_template(template)
        self.ttl = ttl
        self._lock = threading.Lock()
        self._profiles: list[dict[str, Any]] | None = None
        self._read_at = -float("inf")
        # name -> (the Namespace, or None where there is none; when it was read)
        self._namespaces: dict[str, tuple[dict[str, Any] | None, float]] = {}

    def _read_profiles(self) -> list[dict[str, Any]] | None:
        """The cluster's Profiles; None where the Profile CRD is not served.

        Discovery first (open to every authenticated client): a server whose service account
        may not list Profiles gets 403 for them whether or not they exist, and only where they
        do is that 403 an error."""
        from kubernetes import client

        api = client.CustomObjectsApi(self.connection.api_client())
        try:
            with self.connection.errors():
                served = api.get_api_resources(PROFILE_GROUP, PROFILE_VERSION)
        except KubeError as exc:
            if exc.status == 404:
                return None  # no kubeflow.org/v1 at all
            raise
        if not any(r.name == PROFILE_PLURAL for r in served.resources or []):
            return None
        with self.connection.errors():
            # A 403 here raises: guessing a namespace could put notebooks in the wrong one.
            found = api.list_cluster_custom_object(PROFILE_GROUP, PROFILE_VERSION, PROFILE_PLURAL)
        # (the client's annotation says `object`; a list of custom objects is a dict)
        return list(cast(dict[str, Any], found).get("items") or [])

    def _read_namespace(self, name: str) -> dict[str, Any] | None:
        """The Namespace `name` (its metadata is what counts), None where there is none. A
        403 raises: a Profile must not count for want of reading what would refuse it."""
        from kubernetes import client

        api = client.CoreV1Api(self.connection.api_client())
        try:
            with self.connection.errors():
                found = api.read_namespace(name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], api.api_client.sanitize_for_serialization(found))

    def _namespaces_of(self, names: list[str]) -> dict[str, dict[str, Any] | None]:
        now, read = time.monotonic(), {}
        for name in names:
            known = self._namespaces.get(name)
            if known is None or now - known[1] > self.ttl:
                known = (self._read_namespace(name), time.monotonic())
                self._namespaces[name] = known
            read[name] = known[0]
        return read

    def __call__(self, user: str) -> str:
        with self._lock:
            if time.monotonic() - self._read_at > self.ttl:
                self._profiles = self._read_profiles()
                self._read_at = time.monotonic()
            profiles = self._profiles
            namespaces = (
                self._namespaces_of(namespaces_to_read(user, profiles, self.template))
                if profiles is not None
                else {}
            )
        return user_namespace(user, profiles, self.template, namespaces)


# -- the service -------------------------------------------------------------------------------


class NotebookService:
    """The calling user's notebook servers. Blocking: call from an executor thread.

    `progress` gives the spawn progress the server's watch knows of a Notebook (or None).
    `namespace_of` says where a user's notebooks live (`UserNamespaces`); without it, all in
    the connection's namespace. Every call reads and writes only in the caller's namespace:
    no request names one.
    """

    def __init__(
        self,
        connection: KubeConnection,
        *,
        image: str = "",
        quota: int = 0,
        progress: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
        namespace_of: Callable[[str], str] | None = None,
    ):
        self.connection = connection
        self.namespace_of = namespace_of or (lambda _user: connection.namespace())
        self.image = image
        self.quota = quota
        self._progress = progress
        self._lock = threading.Lock()
        self._user_locks: dict[str, threading.Lock] = {}

    def _custom_objects(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.connection.api_client())

    def _view(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        return notebook_view(obj, self._progress(obj) if self._progress else None)

    def _user_lock(self, user: str) -> threading.Lock:
        """Serialises one user's creates in this server, so two at once cannot both pass the
        quota."""
        with self._lock:
            return self._user_locks.setdefault(user, threading.Lock())

    def _owned(self, api: Any, user: str) -> list[dict[str, Any]]:
        with self.connection.errors():
            found = api.list_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace_of(user),
                PLURAL,
                label_selector=f"{OWNER_LABEL}={owner_label(user)}",
            )
        return [o for o in found.get("items", []) if o.get("spec", {}).get("owner") == user]

    def _get_owned(self, user: str, name: str) -> dict[str, Any]:
        api = self._custom_objects()
        try:
            with self.connection.errors():
                obj = api.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace_of(user), PLURAL, name
                )
        except KubeError as exc:
            if exc.status == 404:
                raise NotebookNotFound(name) from None
            raise
        if obj.get("spec", {}).get("owner") != user:
            raise NotebookNotFound(name)  # someone else's: as if it did not exist
        return obj

    def list(self, user: str) -> list[dict[str, Any]]:
        owned = self._owned(self._custom_objects(), user)
        return [self._view(o) for o in sorted(owned, key=lambda o: o["metadata"]["name"])]

    def get(self, user: str, name: str) -> dict[str, Any]:
        return self._view(self._get_owned(user, name))

    def create(self, user: str, request: Mapping[str, Any]) -> dict[str, Any]:
        name = request["name"]
        body = notebook_resource(  # InvalidNotebook before anything is asked of the cluster
            name,
            "",
            user,
            **spawn_arguments(request, self.image),
            labels={OWNER_LABEL: owner_label(user)},
        )
        api = self._custom_objects()
        namespace = body["metadata"]["namespace"] = self.namespace_of(user)
        with self._user_lock(user):
            if self.quota:
                live = [
                    o for o in self._owned(api, user) if not o["metadata"].get("deletionTimestamp")
                ]
                if len(live) >= self.quota:
                    raise QuotaExceeded(
                        f"you have {len(live)} notebook servers, the most allowed "
                        f"(MLClusterApp.notebook_quota = {self.quota}); delete one first"
                    )
            try:
                with self.connection.errors():
                    created = api.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, body
                    )
            except KubeError as exc:
                if exc.status != 409:
                    raise
                raise NotebookExists(
                    f"a notebook server named {name!r} exists in namespace {namespace!r}"
                ) from None
        return self._view(created)

    def delete(self, user: str, name: str) -> None:
        from kubernetes import client

        obj = self._get_owned(user, name)
        options = client.V1DeleteOptions(
            propagation_policy="Foreground",  # the Notebook goes after what it owns
            # Only the notebook that was checked: not one of the same name made since.
            preconditions=client.V1Preconditions(uid=obj["metadata"]["uid"]),
        )
        try:
            with self.connection.errors():
                self._custom_objects().delete_namespaced_custom_object(
                    GROUP, VERSION, obj["metadata"]["namespace"], PLURAL, name, body=options
                )
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
            raise NotebookNotFound(name) from None  # gone, or replaced, meanwhile

    def stop(self, user: str, name: str) -> dict[str, Any]:
        return self._set_stopped(user, name, True)

    def start(self, user: str, name: str) -> dict[str, Any]:
        return self._set_stopped(user, name, False)

    def _set_stopped(self, user: str, name: str, stopped: bool) -> dict[str, Any]:
        """Stop or start the caller's notebook, exactly the one checked: the JSON patch tests
        its uid and resourceVersion, so a notebook replaced (or changed) between the owner
        check and the write is never touched; a change meanwhile is read and checked again."""
        for _attempt in range(5):
            obj = self._get_owned(user, name)
            if is_stopped(obj) == stopped:
                return self._view(obj)  # already so: a stopped one keeps its original stop time
            try:
                with self.connection.errors():
                    patched = self._custom_objects().patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        obj["metadata"]["namespace"],
                        PLURAL,
                        name,
                        guarded_stop_patch(obj, stopped, _now()),
                        _content_type="application/json-patch+json",
                    )
            except KubeError as exc:
                if exc.status == 404:
                    raise NotebookNotFound(name) from None
                if exc.status in (409, 422):
                    continue  # changed or replaced since it was read: look again
                raise
            return self._view(patched)
        raise KubeError(f"notebook server {name!r} keeps changing; try again", status=409)
