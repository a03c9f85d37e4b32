"""The blocking front end: `Connection` (plain-JSON calls by path through the client's
`ApiClient`: auth, token refresh, TLS, connection pool), `connect`, `check_reachable`, and
the server's re-probed `KubeConnection`."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .config import SERVICE_ACCOUNT_DIR, configuration_problem, in_cluster, load_config
from .errors import ClusterUnavailable, KubeError, as_kube_error, refused
from .rest import _decode, _query


@dataclasses.dataclass
class Connection:
    """A blocking API client for one cluster and namespace; every failure is a KubeError."""

    api: Any  # kubernetes.client.ApiClient
    namespace: str
    in_cluster: bool
    host: str
    request_timeout: float
    # At most this many ordinary calls (streams are not counted) at once through the
    # connections sharing it; the others wait here for their turn, which their timeout
    # does not count. None: no limit.
    in_flight: threading.BoundedSemaphore | None = None

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
        (a watch, a followed log)."""
        in_flight = None if stream else self.in_flight
        turn = in_flight if in_flight is not None else contextlib.nullcontext()
        try:
            serialized = self.api.param_serialize(
                method,
                path,
                query_params=_query(query),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
            )
            with turn:
                response = self.api.call_api(
                    *serialized, _request_timeout=timeout or self.request_timeout
                )
                if not 200 <= response.status <= 299:
                    raise refused(response.status, response.read(), response.headers)
                if stream:
                    return response.response
                return _decode(response.read())
        except Exception as exc:
            converted = as_kube_error(exc, self.host)
            if converted is exc:
                raise
            raise converted from None

    def close(self) -> None:
        self.api.close()


def connect(
    *,
    namespace: str = "",
    kubeconfig: str = "",
    request_timeout: float = 10.0,
    pool_size: int | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> Connection:
    """A blocking client for the configured cluster (ClusterUnavailable if there is none);
    `pool_size`: connections kept (one per streaming log and watch, plus ordinary calls)."""
    from kubernetes import client

    loaded = load_config(kubeconfig, service_account_dir)
    if pool_size:
        loaded.configuration.connection_pool_maxsize = pool_size
    return Connection(
        api=client.ApiClient(loaded.configuration),
        namespace=loaded.namespace(namespace),
        in_cluster=loaded.in_cluster,
        host=loaded.host,
        request_timeout=request_timeout,
    )


def check_reachable(conn: Connection) -> None:
    """One GET /version; ClusterUnavailable if the API server does not answer."""
    timeout = conn.request_timeout
    try:
        conn.request("GET", "/version", timeout=(min(3.0, timeout), timeout))
    except KubeError as exc:
        if isinstance(exc, ClusterUnavailable):
            raise
        raise ClusterUnavailable(
            f"the Kubernetes API server at {conn.host} cannot be used: {exc.message}"
        ) from None


class KubeConnection:
    """The server's cluster: looked for again now and then (a cluster configured after the
    server started is picked up), with typed-client `ApiClient`s for its calls."""

    PROBE_TTL = 10.0

    def __init__(self, namespace: str = ""):
        self.configured_namespace = namespace
        self._lock = threading.Lock()
        self._probed = 0.0
        self._problem: str | None = None
        self._client: Any = None
        self._host = ""

    def problem(self) -> str | None:
        """Why there is no cluster (looked for again after PROBE_TTL seconds), or None."""
        with self._lock:
            if time.monotonic() - self._probed > self.PROBE_TTL:
                self._probed = time.monotonic()
                self._problem = configuration_problem()
                self._client = None
            return self._problem

    def api_client(self) -> Any:
        """The shared `kubernetes.client.ApiClient` for short requests."""
        problem = self.problem()
        if problem:
            raise ClusterUnavailable(problem)
        with self._lock:
            if self._client is None:
                self._client = self.new_api_client()
            return self._client

    def new_api_client(self) -> Any:
        """An ApiClient of its own (its own connections), e.g. for a long-running watch."""
        from kubernetes import client

        loaded = load_config()
        self._host = loaded.host
        return client.ApiClient(loaded.configuration)

    def connection(self, request_timeout: float = 10.0) -> Connection:
        """A plain-JSON Connection with an ApiClient of its own (close it when done)."""
        api = self.new_api_client()
        return Connection(api, self.namespace(), in_cluster(), self._host, request_timeout)

    def forget(self) -> None:
        """Look for the cluster again at the next call (it could not be reached)."""
        with self._lock:
            self._probed = 0.0

    def namespace(self) -> str:
        """See ClusterConfig.namespace."""
        if self.configured_namespace:
            return self.configured_namespace
        try:
            return load_config().namespace()
        except ClusterUnavailable:
            return "default"

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Client failures -> KubeError; ClusterUnavailable (and the cluster looked for again
        at the next call) when the API server cannot be reached."""
        try:
            yield
        except Exception as exc:
            converted = as_kube_error(exc, self._host or "(unknown)")
            if converted is exc:
                raise
            if isinstance(converted, ClusterUnavailable):
                self.forget()
            raise converted from None
