"""Talking to the Kubernetes API: connection, namespace, discovery, and the few calls the
backend makes, as plain dicts (what `objects.py` builds and `status.py` reads).

Connection: inside a pod (a service account token and KUBERNETES_SERVICE_HOST), the
in-cluster config and the pod's own namespace; elsewhere the kubeconfig ($KUBECONFIG or
~/.kube/config) and its current context's namespace. `MLClusterConfig.kubernetes_namespace`
overrides either. Every problem reaching the cluster is a `SpecError` for the user.

Everything here is blocking (the sync `kubernetes` client): callers are the job's own
supervisor process, or a submitting front end that already runs submit off its event loop.

Requests go through the client's `ApiClient` (configuration, auth, token refresh, TLS,
`ApiException`s) by path, as its DynamicClient does, not through the generated typed API
classes: the first use of one of those imports a module of pydantic-annotated methods
(CoreV1Api: about 2 s of CPU), in every kernel and supervisor; and the objects here are the
plain JSON dicts that objects.py builds and status.py reads, not typed models.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...jobs.model import SpecError

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
FOREGROUND = "Foreground"

T = TypeVar("T")

# Retry budget for one API call that failed in a way worth retrying (see `with_retries`).
RETRY_ATTEMPTS = 6
RETRY_FIRST_DELAY = 0.05
RETRY_MAX_DELAY = 2.0


class KubeError(RuntimeError):
    """An API call failed for good (after retries); the message is meant for the user."""


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
        path = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        if namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        if name:
            path += f"/{name}"
        return f"{path}/{subresource}" if subresource else path


KINDS = {
    (k.api_version, k.kind): k
    for k in (
        Kind("v1", "Pod", "pods"),
        Kind("v1", "Node", "nodes"),
        Kind("v1", "Secret", "secrets"),
        Kind("v1", "Service", "services"),
        Kind("batch/v1", "Job", "jobs"),
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


@dataclasses.dataclass
class Connection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str
    in_cluster: bool
    host: str
    request_timeout: float

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: Any = None,
    ) -> Any:
        """One API call: the decoded JSON answer, or with `stream` the open urllib3 response
        (a watch, a followed log). Failures raise the client's ApiException (with .status)."""
        from kubernetes.client.exceptions import ApiException

        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        serialized = self.api.param_serialize(
            method,
            path,
            query_params=params,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=timeout or self.request_timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        if stream:
            return response.response
        response.read()
        return json.loads(response.data) if response.data else {}


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def in_cluster(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and (service_account_dir / "token").is_file()
    )


def resolve_namespace(
    configured: str, *, service_account_dir: Path | None, context_namespace: str | None
) -> str:
    """The configured namespace, else the pod's own, else the kubeconfig context's, else
    'default' (what kubectl would use)."""
    if configured:
        return configured
    if service_account_dir is not None:
        try:
            own = (service_account_dir / "namespace").read_text().strip()
        except OSError:
            own = ""
        if own:
            return own
    return context_namespace or "default"


def connect(
    *,
    namespace: str = "",
    request_timeout: float = 10.0,
    pool_size: int | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    probe: bool = True,
) -> Connection:
    """A client for the cluster this process is configured for; SpecError if there is none
    or it does not answer (`probe`: one GET /version)."""
    import kubernetes.client
    import kubernetes.config
    from kubernetes.config.config_exception import ConfigException

    configuration = kubernetes.client.Configuration()
    inside = in_cluster(service_account_dir)
    context_namespace = None
    try:
        if inside:
            kubernetes.config.incluster_config.InClusterConfigLoader(
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
            ).load_and_set(configuration)
        else:
            # Passed explicitly: the default location is read once, when `kubernetes` is
            # first imported, which may be long before (a warm pool) or with another $KUBECONFIG.
            config_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
            kubernetes.config.load_kube_config(
                config_file=config_file, client_configuration=configuration, persist_config=False
            )
            _, current = kubernetes.config.list_kube_config_contexts(config_file=config_file)
            context_namespace = ((current or {}).get("context") or {}).get("namespace")
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise SpecError(
            "no Kubernetes cluster is configured for the kubernetes backend: not running in a "
            f"pod with a service account, and no usable kubeconfig ({exc})"
        ) from None
    if pool_size:
        # One connection per streaming log and watch, plus room for ordinary calls.
        configuration.connection_pool_maxsize = pool_size
    api = kubernetes.client.ApiClient(configuration)
    conn = Connection(
        api=api,
        namespace=resolve_namespace(
            namespace,
            service_account_dir=service_account_dir if inside else None,
            context_namespace=context_namespace,
        ),
        in_cluster=inside,
        host=configuration.host,
        request_timeout=request_timeout,
    )
    if probe:
        try:
            check_reachable(conn)
        except SpecError:
            api.close()
            raise
    return conn


def check_reachable(conn: Connection) -> None:
    """One GET /version; SpecError if the API server does not answer."""
    timeout = conn.request_timeout
    try:
        conn.request("GET", "/version", timeout=(min(3.0, timeout), timeout))
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable cluster
        raise SpecError(
            f"cannot reach the Kubernetes API server at {conn.host}: {_short(exc)}"
        ) from None


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the socket error
    return str(reason or exc).splitlines()[0][:300]


# --- errors and retries -----------------------------------------------------------------------


def status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status", None) if _is_api_exception(exc) else None


def reason_of(exc: BaseException) -> str | None:
    """The Status reason of a failed call (AlreadyExists, Conflict, NotFound...)."""
    import json

    body = getattr(exc, "body", None)
    if not body:
        return None
    try:
        return json.loads(body).get("reason")
    except (ValueError, AttributeError, TypeError):
        return None


def message_of(exc: BaseException) -> str:
    import json

    body = getattr(exc, "body", None)
    if body:
        try:
            return json.loads(body).get("message") or _short(exc)
        except (ValueError, AttributeError, TypeError):
            pass
    return _short(exc)


def _is_api_exception(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException)


def is_not_found(exc: BaseException) -> bool:
    return status_of(exc) == 404


def is_already_exists(exc: BaseException) -> bool:
    return status_of(exc) == 409 and reason_of(exc) == "AlreadyExists"


def _retryable(exc: BaseException) -> bool:
    """A write conflict (409 Conflict: re-read and re-apply), throttling, a server error or a
    dropped connection. Never AlreadyExists or other client errors: retrying cannot help."""
    import urllib3

    status = status_of(exc)
    if status is not None:
        if status == 409:
            return reason_of(exc) != "AlreadyExists"
        return status == 429 or status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def with_retries(action: Callable[[], T], what: str, attempts: int = RETRY_ATTEMPTS) -> T:
    """Run `action` (which must re-read what it depends on) until it succeeds, retrying
    conflicts and transient failures with exponential backoff."""
    delay = RETRY_FIRST_DELAY
    for attempt in range(attempts):
        try:
            return action()
        except Exception as exc:
            if not _retryable(exc) or attempt == attempts - 1:
                raise
            log.debug("%s: %s; retrying in %.2fs", what, _short(exc), delay)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)
    raise AssertionError("unreachable")


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

    def list(self, kind: Kind, label_selector: str | None = None) -> list[dict[str, Any]]:
        return self.list_function(kind)(self.namespace, label_selector=label_selector).items

    def list_function(self, kind: Kind) -> Lister:
        """A list-and-watch function for `kubernetes.informer.SharedInformer` and
        `kubernetes.watch.Watch`, giving plain dicts."""
        return Lister(self.conn, kind)


class Lister:
    """A list call shaped like the generated client's, for the informer and `Watch.stream`:
    keyword arguments in the client's snake_case; a list answers with `.items` (dicts) and
    `.metadata.resource_version`; a watch (`watch=True`) with the open response, whose
    events `Watch` decodes, into dicts (there is no return type here to decode into)."""

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
        log.debug("cannot read our own pod %s: %s", name, _short(exc))
        return None


def pod_image(pod: dict[str, Any]) -> str | None:
    """The image of a notebook pod's main container (the first; sidecars come after it)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return containers[0].get("image") if containers else None
