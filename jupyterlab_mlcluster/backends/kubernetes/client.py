"""The Kubernetes backend's calls: the kinds it manages, discovery, and create / get / patch /
delete / list as plain dicts (what `objects.py` builds and `status.py` reads).

The connection itself (configuration, namespace, errors, the retry policy) is
`jupyterlab_mlcluster.kubeconn`'s; here its failures become `SpecError`s for the user where
a submission needs a cluster. `MLClusterConfig.kubernetes_namespace` overrides the namespace.

Everything here is blocking: callers are the job's own supervisor process, or a submitting
front end that already runs submit off its event loop.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ... import kubeconn
from ...jobs.model import SpecError
from ...kubeconn import (
    Connection,
    KubeError,
    is_already_exists,
    is_not_found,
    resource_path,
    status_of,
)

__all__ = [
    "Connection",
    "KubeError",
    "is_already_exists",
    "is_not_found",
    "status_of",
]

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

MERGE_PATCH = kubeconn.MERGE_PATCH
FOREGROUND = "Foreground"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One resource type the backend touches: apiVersion, kind, plural."""

    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        return resource_path(self.api_version, self.plural, namespace, name, subresource)


KINDS = {
    (k.api_version, k.kind): k
    for k in (
        Kind("v1", "Pod", "pods"),
        Kind("v1", "Node", "nodes"),
        Kind("v1", "Secret", "secrets"),
        Kind("v1", "Service", "services"),
        Kind("batch/v1", "Job", "jobs"),
        Kind("batch/v1", "CronJob", "cronjobs"),
        Kind("trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs"),
        Kind("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes"),
        Kind("kueue.x-k8s.io/v1beta1", "Workload", "workloads"),
        Kind("kueue.x-k8s.io/v1beta1", "LocalQueue", "localqueues"),
        Kind("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
        Kind("kubeflow.org/v1", "TFJob", "tfjobs"),
        Kind("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups"),
        Kind("metrics.k8s.io/v1beta1", "PodMetrics", "pods"),
    )
}


def kind_of(obj_or_api_version: dict[str, Any] | str, kind: str | None = None) -> Kind:
    if isinstance(obj_or_api_version, dict):
        key = (obj_or_api_version["apiVersion"], obj_or_api_version["kind"])
    else:
        key = (obj_or_api_version, kind or "")
    try:
        return KINDS[key]
    except KeyError:
        raise ValueError(f"mlcluster does not manage {key[1]} ({key[0]}) objects") from None


# --- connection -----------------------------------------------------------------------------


def connect(
    *,
    namespace: str = "",
    request_timeout: float = 10.0,
    pool_size: int | None = None,
    probe: bool = True,
) -> Connection:
    """A client for the cluster this process is configured for; SpecError if there is none
    or it does not answer (`probe`: one GET /version)."""
    try:
        conn = kubeconn.connect(
            namespace=namespace, request_timeout=request_timeout, pool_size=pool_size
        )
    except kubeconn.ClusterUnavailable as exc:
        raise SpecError(f"{exc}; the kubernetes backend needs one") from None
    if probe:
        try:
            check_reachable(conn)
        except SpecError:
            conn.close()
            raise
    return conn


def check_reachable(conn: Connection) -> None:
    """One GET /version; SpecError if the API server does not answer."""
    try:
        kubeconn.check_reachable(conn)
    except kubeconn.ClusterUnavailable as exc:
        raise SpecError(str(exc)) from None


# --- errors and retries -----------------------------------------------------------------------


def reason_of(exc: BaseException) -> str | None:
    """The Status reason of a failed call (AlreadyExists, Conflict, NotFound...)."""
    return getattr(exc, "reason", None) or None if isinstance(exc, KubeError) else None


def message_of(exc: BaseException) -> str:
    """What went wrong, in the API server's words when it answered."""
    if isinstance(exc, KubeError):
        return exc.message
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


def with_retries(action: Callable[[], T], what: str, give_up_after: float | None = None) -> T:
    """Run `action` (which must re-read what it depends on) until it succeeds, retrying
    conflicts and transient failures with the one backoff policy (kubeconn.call)."""
    if give_up_after is None:
        return kubeconn.call(action, what)
    return kubeconn.call(action, what, give_up_after=give_up_after)


# --- generic calls on the kinds we manage -------------------------------------------------------


class Resources:
    """create / get / patch / delete / list for the KINDS, in one namespace, as dicts."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.namespace = conn.namespace

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.conn.request("POST", kind_of(obj).path(self.namespace), body=obj)

    def get(self, kind: Kind, name: str) -> dict[str, Any] | None:
        """The object, or None if there is none."""
        try:
            return self.conn.request("GET", kind.path(self.namespace, name))
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise

    def patch(self, kind: Kind, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch."""
        return self.conn.request(
            "PATCH", kind.path(self.namespace, name), body=patch, content_type=MERGE_PATCH
        )

    def delete(self, kind: Kind, name: str, propagation: str = FOREGROUND) -> bool:
        """Delete (foreground by default: the object stays until its dependents are gone).
        False if it was not there."""
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            self.conn.request("DELETE", kind.path(self.namespace, name), body=options)
        except Exception as exc:
            if is_not_found(exc):
                return False
            raise
        return True

    def holds(self, kind: Kind, name: str, uid: str) -> bool:
        """Whether `name` is still the object with this uid: a dry-run delete with a uid
        precondition (needs only the delete right, reads nothing, changes nothing)."""
        options = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "dryRun": ["All"],
            "preconditions": {"uid": uid},
        }
        try:
            self.conn.request("DELETE", kind.path(self.namespace, name), body=options)
        except Exception as exc:
            if is_not_found(exc) or (status_of(exc) == 409 and reason_of(exc) == "Conflict"):
                return False
            raise
        return True

    def list(self, kind: Kind, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.list_function(kind)(self.namespace, label_selector=label_selector).items

    def list_function(self, kind: Kind) -> Lister:
        """A list function in the generated client's shape, giving plain dicts."""
        return Lister(self.conn, kind)


class Lister:
    """A list call shaped like the generated client's: keyword arguments in the client's
    snake_case; a list answers with `.items` (dicts) and `.metadata.resource_version`; a
    watch (`watch=True`) with the open streaming response."""

    def __init__(self, conn: Connection, kind: Kind):
        self._conn = conn
        self._kind = kind

    def __call__(self, namespace: str | None = None, **kwargs: Any) -> Any:
        timeout = kwargs.pop("_request_timeout", None)
        kwargs.pop("_preload_content", None)
        query = {_camel(k): v for k, v in kwargs.items()}
        path = self._kind.path(namespace)
        if kwargs.get("watch"):
            return self._conn.request(
                "GET", path, query=query, stream=True, timeout=timeout or (10.0, None)
            )
        return _Listing(self._conn.request("GET", path, query=query, timeout=timeout))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class _Listing:
    def __init__(self, listing: dict[str, Any]):
        self.items: list[dict[str, Any]] = listing.get("items") or []
        self.metadata = _ListMeta((listing.get("metadata") or {}).get("resourceVersion"))


@dataclasses.dataclass
class _ListMeta:
    resource_version: str | None


# --- discovery -------------------------------------------------------------------------------


def served_kinds(conn: Connection, group_version: str) -> set[str]:
    """Kinds the cluster serves at `group_version` (API discovery); empty if none."""
    group, _, version = group_version.rpartition("/")
    try:
        resources = conn.request("GET", f"/apis/{group}/{version}" if group else f"/api/{version}")
    except Exception as exc:
        if status_of(exc) in (404, 503):  # 503: an aggregated API that is registered but down
            return set()
        raise
    return {r["kind"] for r in resources.get("resources", []) if "/" not in r.get("name", "")}


def own_pod(conn: Connection) -> dict[str, Any] | None:
    """The pod this process runs in (POD_NAME from the downward API, else HOSTNAME inside a
    cluster, where it is the pod's name), or None outside a pod."""
    name = os.environ.get("POD_NAME") or (os.environ.get("HOSTNAME") if conn.in_cluster else None)
    if not name:
        return None
    try:
        return conn.request("GET", kind_of("v1", "Pod").path(conn.namespace, name))
    except Exception as exc:  # noqa: BLE001 - 404 or 403: we just do not know our image
        log.debug("cannot read our own pod %s: %s", name, message_of(exc))
        return None


def pod_image(pod: dict[str, Any]) -> str | None:
    """The image of a notebook pod's main container (the first; sidecars come after it)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return containers[0].get("image") if containers else None
