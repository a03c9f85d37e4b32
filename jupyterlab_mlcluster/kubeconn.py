"""The one way this product reaches a Kubernetes cluster: where it is, which namespace, what
went wrong (in one readable form), and when to try again.

Three users stand on it: the Kubernetes backend (blocking: supervisors, and submitting front
ends off their event loop), the server extension (blocking, in executor and watch threads)
and the notebook-controller (asyncio). Each keeps only what is its own (the backend's kinds
and discovery, the server's Notebook calls, the controller's children); configuration,
namespace, errors, paths and the retry policy are here, once.

Which cluster, the way kubectl finds it: a kubeconfig given explicitly (an argument, or
`$KUBECONFIG`, a list of files joined by `os.pathsep` and merged), else the pod's service
account when running inside a cluster, else `~/.kube/config`. Read at every call:
the `kubernetes` package reads `$KUBECONFIG` only once, when first imported.

Requests go through the client's `ApiClient` (auth, token refresh, TLS, connection pool) by
path, as its DynamicClient does, and answer plain JSON dicts: the typed API classes cost
seconds of import (pydantic models) and need a class per kind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import json
import logging
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .jobs.backoff import Backoff

log = logging.getLogger("jupyterlab_mlcluster.kubernetes")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"
NO_CLUSTER = "no Kubernetes cluster is configured"
MERGE_PATCH = "application/merge-patch+json"

T = TypeVar("T")


# --- errors -------------------------------------------------------------------------------------


class KubeError(RuntimeError):
    """A Kubernetes API call that failed, in words meant for a person.

    `status` is the HTTP status when the API server answered (None: it was not reached),
    `reason` its Status reason (NotFound, AlreadyExists, Conflict, ...), `message` its own
    words, `retry_after` the seconds it asked us to wait (429/503 `Retry-After`)."""

    def __init__(
        self,
        text: str,
        *,
        status: int | None = None,
        reason: str = "",
        message: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason
        self.message = message or text
        self.retry_after = retry_after


class ClusterUnavailable(KubeError):
    """No usable cluster: none is configured (the text starts with NO_CLUSTER), or its API
    server cannot be reached."""


def unreachable(host: str, cause: BaseException) -> ClusterUnavailable:
    """The one form of "cannot reach the API server", the same at every attempt."""
    text = f"the Kubernetes API server at {host} cannot be reached: {root_cause(cause)}"
    return ClusterUnavailable(text, message=root_cause(cause))


def refused(status: int, body: Any, headers: Any = None) -> KubeError:
    """An answer other than 2xx: the API server's Status, in one form."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    message = str(body.get("message", "")) if isinstance(body, dict) else str(body or "").strip()
    message = message[:1000] or reason or f"HTTP {status}"
    return KubeError(
        f"the Kubernetes API refused the request: {status} {message}",
        status=status,
        reason=reason,
        message=message,
        retry_after=_retry_after(headers),
    )


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def root_cause(exc: BaseException) -> str:
    """The innermost reason of a connection failure ("[Errno 111] Connection refused"), not
    urllib3's or aiohttp's wrappers, whose words carry object addresses that differ at every
    attempt."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "reason", None)
        if not isinstance(inner, BaseException):
            inner = getattr(exc, "os_error", None)  # aiohttp's ClientConnectorError
        inner = inner if isinstance(inner, BaseException) else exc.__cause__
        if inner is None:
            break
        exc = inner
    return (str(exc) or type(exc).__name__).splitlines()[0][:300]


def as_kube_error(exc: BaseException, host: str) -> BaseException:
    """A client, transport or socket failure as a KubeError; anything else as it is."""
    if isinstance(exc, KubeError):
        return exc
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "body"):  # the clients' ApiException
        return refused(
            status, exc.body or getattr(exc, "reason", ""), getattr(exc, "headers", None)
        )
    if _is_transport_error(exc):
        return unreachable(host, exc)
    return exc


def _is_transport_error(exc: BaseException) -> bool:
    import urllib3

    if isinstance(exc, (OSError, urllib3.exceptions.HTTPError)):
        return True
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp comes with kubernetes.aio
        return False
    return isinstance(exc, aiohttp.ClientError)


def status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, KubeError) else None


def is_not_found(exc: BaseException) -> bool:
    return status_of(exc) == 404


def is_already_exists(exc: BaseException) -> bool:
    return status_of(exc) == 409 and getattr(exc, "reason", "") == "AlreadyExists"


# --- where the cluster is -------------------------------------------------------------------------


def in_cluster(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    """Whether this process runs in a pod with a service account token."""
    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and (service_account_dir / "token").is_file()
    )


def kubeconfig_files(kubeconfig: str = "") -> list[str]:
    """The kubeconfig files that exist among those named (an argument, else $KUBECONFIG,
    else ~/.kube/config; a list joined by os.pathsep)."""
    named = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [Path(p).expanduser() for p in named.split(os.pathsep) if p]
    return [str(p) for p in paths if p.is_file()]


def _uses_kubeconfig(kubeconfig: str, service_account_dir: Path) -> bool:
    return bool(kubeconfig or os.environ.get("KUBECONFIG")) or not in_cluster(service_account_dir)


def _no_kubeconfig(kubeconfig: str) -> ClusterUnavailable:
    where = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return ClusterUnavailable(
        f"{NO_CLUSTER}: not running in a cluster and no kubeconfig ({where} not found)"
    )


@dataclasses.dataclass
class ClusterConfig:
    """A loaded client configuration (`kubernetes.client` or `kubernetes.aio.client`)."""

    configuration: Any
    in_cluster: bool
    context_namespace: str | None  # the kubeconfig's current context's namespace
    service_account_dir: Path

    @property
    def host(self) -> str:
        return self.configuration.host

    def namespace(self, configured: str = "") -> str:
        """The configured namespace, else the pod's own, else the kubeconfig context's, else
        'default' (what kubectl would use): jobs, notebooks and the controller agree."""
        if configured:
            return configured
        if self.in_cluster:
            try:
                own = (self.service_account_dir / "namespace").read_text().strip()
            except OSError:
                own = ""
            if own:
                return own
        return self.context_namespace or "default"


def _config_errors() -> tuple[type[BaseException], ...]:
    from kubernetes.config.config_exception import ConfigException

    return (ConfigException, OSError, TypeError, ValueError, KeyError)


def _context_namespace(files: str) -> str | None:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(config_file=files)
    return ((current or {}).get("context") or {}).get("namespace")


def _unusable(files: str, exc: BaseException) -> ClusterUnavailable:
    source = f"the kubeconfig {files}" if files else "the pod's service account"
    return ClusterUnavailable(f"{NO_CLUSTER}: {source} cannot be used ({exc})")


@contextlib.contextmanager
def _unusable_on_error(files: str) -> Iterator[None]:
    try:
        yield
    except _config_errors() as exc:
        raise _unusable(files, exc) from None


def _resolve_config(
    client_module: Any, config_module: Any, kubeconfig: str, service_account_dir: Path
) -> tuple[Any, ClusterConfig | None, str]:
    """A fresh client Configuration, with the in-cluster settings already loaded when no
    kubeconfig applies, else the kubeconfig files to load (os.pathsep-joined). Shared by the
    blocking and the asyncio loaders, whose modules differ only in load_kube_config being async."""
    configuration = client_module.Configuration()
    with _unusable_on_error(""):
        if not _uses_kubeconfig(kubeconfig, service_account_dir):
            config_module.incluster_config.InClusterConfigLoader(
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
            ).load_and_set(configuration)
            return configuration, ClusterConfig(configuration, True, None, service_account_dir), ""
        files = os.pathsep.join(kubeconfig_files(kubeconfig))
    if not files:
        raise _no_kubeconfig(kubeconfig)
    return configuration, None, files


def _from_kubeconfig(configuration: Any, files: str, service_account_dir: Path) -> ClusterConfig:
    with _unusable_on_error(files):
        return ClusterConfig(configuration, False, _context_namespace(files), service_account_dir)


def load_config(
    kubeconfig: str = "", service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The blocking client's configuration; ClusterUnavailable (NO_CLUSTER ...) if none."""
    from kubernetes import client, config

    configuration, ready, files = _resolve_config(client, config, kubeconfig, service_account_dir)
    if ready is None:
        with _unusable_on_error(files):
            config.load_kube_config(
                config_file=files, client_configuration=configuration, persist_config=False
            )
        ready = _from_kubeconfig(configuration, files, service_account_dir)
    # No hidden retries under ours: urllib3 would otherwise retry each failed request three
    # times at once, logging a warning each time (an outage's log noise), before our one
    # backoff policy even sees the failure.
    ready.configuration.retries = 0
    return ready


async def load_config_async(
    kubeconfig: str = "", service_account_dir: Path = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The same, for the asyncio client (`kubernetes.aio`)."""
    from kubernetes.aio import client, config

    configuration, ready, files = _resolve_config(client, config, kubeconfig, service_account_dir)
    if ready is not None:
        return ready
    with _unusable_on_error(files):
        await config.load_kube_config(
            config_file=files, client_configuration=configuration, persist_config=False
        )
    return _from_kubeconfig(configuration, files, service_account_dir)


def configuration_problem(kubeconfig: str = "") -> str | None:
    """Why no cluster can be tried (NO_CLUSTER ...), or None if one is configured."""
    try:
        load_config(kubeconfig)
    except ClusterUnavailable as exc:
        return str(exc)
    return None


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a resource collection, object or subresource."""
    path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    if namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name:
        path += f"/{name}"
    return f"{path}/{subresource}" if subresource else path


def _query(query: dict[str, Any] | None) -> list[tuple[str, str]]:
    def text(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    return [(k, text(v)) for k, v in (query or {}).items() if v is not None]


def _decode(data: bytes | None) -> Any:
    if not data:
        return {}
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


# --- the blocking front end ----------------------------------------------------------------


@dataclasses.dataclass
class Connection:
    """A blocking API client for one cluster and namespace; every failure is a KubeError."""

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
        (a watch, a followed log)."""
        try:
            serialized = self.api.param_serialize(
                method,
                path,
                query_params=_query(query),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
            )
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


# --- the asyncio front end -----------------------------------------------------------------


class AsyncConnection:
    """A `kubernetes.aio` client with plain-dict REST; every failure is a KubeError."""

    def __init__(self, api: Any, host: str) -> None:
        self.api = api
        self.host = host

    @classmethod
    async def connect(
        cls, kubeconfig: str = "", connections: int = 32, user_agent: str = ""
    ) -> AsyncConnection:
        from kubernetes.aio import client

        loaded = await load_config_async(kubeconfig)
        loaded.configuration.connection_pool_maxsize = connections
        api = client.ApiClient(loaded.configuration)
        if user_agent:
            api.user_agent = user_agent
        return cls(api, loaded.host)

    async def close(self) -> None:
        await self.api.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        try:
            method_, url, headers, payload, post = await self.api.param_serialize(
                method,
                path,
                query_params=_query(params),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
            )
            response = await self.api.call_api(method_, url, headers, payload, post)
            data = await response.read()
        except Exception as exc:
            converted = as_kube_error(exc, self.host)
            if converted is exc:
                raise
            raise converted from None
        if response.status >= 400:
            raise refused(response.status, data, response.headers)
        return _decode(data) if data else None


# --- when to try again ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BackoffSchedule:
    """`attempts` waits of a Backoff, drawn anew each time it is iterated: the form kopf's
    `settings.networking.error_backoffs` takes (a sized iterable it walks per request), so
    the controller's own API calls back off like every other caller's."""

    policy: Backoff
    attempts: int

    def __iter__(self) -> Iterator[float]:
        return (self.policy.delay(n) for n in range(self.attempts))

    def __len__(self) -> int:
        return self.attempts


class RepeatFilter(logging.Filter):
    """For log records that others' code emits per attempt (kopf logs every failed request
    of every watch at ERROR): the first of a kind passes, repeats within `every` seconds are
    dropped, and the next to pass says how many were. A kind is the
    message with its numbers taken out (attempt counters, resource versions, ports); only
    the loggers under `prefix` are limited."""

    def __init__(
        self, prefix: str = "", every: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.prefix, self.every, self.clock = prefix, every, clock
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}  # -> last shown, dropped since
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.prefix):
            return True
        kind = (record.name, _DIGITS.sub("#", record.getMessage()))
        now = self.clock()
        with self._lock:
            if len(self._shown) > 1000:  # bounded: kinds of a long-gone outage are forgotten
                self._shown = {k: v for k, v in self._shown.items() if now - v[0] < self.every}
            shown, dropped = self._shown.get(kind, (-float("inf"), 0))
            if now - shown < self.every:
                self._shown[kind] = (shown, dropped + 1)
                return False
            self._shown[kind] = (now, 0)
        if dropped:
            record.msg = f"{record.getMessage()} (and {dropped} more like it in {now - shown:.0f}s)"
            record.args = None
        return True


_DIGITS = re.compile(r"\d+")


def backoff_from_env() -> Backoff:
    """The policy; `MLCLUSTER_KUBE_BACKOFF=first,cap` (seconds) changes its scale (tests)."""
    value = os.environ.get("MLCLUSTER_KUBE_BACKOFF", "")
    try:
        first, cap = (float(v) for v in value.split(","))
    except ValueError:
        return Backoff()
    return Backoff(first=max(first, 0.001), cap=max(cap, first))


def retryable(exc: BaseException) -> bool:
    """Worth trying again: unreachable, throttled (429), a server error (5xx), or a write
    conflict (409 Conflict: the caller re-reads). Never AlreadyExists or other client
    errors: the same request would fail the same way."""
    if isinstance(exc, ClusterUnavailable):
        return not str(exc).startswith(NO_CLUSTER)
    if isinstance(exc, KubeError):
        status = exc.status
        if status is None:
            return True
        if status == 409:
            return exc.reason != "AlreadyExists"
        return status == 429 or status >= 500
    return _is_transport_error(exc)


class FailureLog:
    """Logs a repeated failure once, then a count now and then ("... (x37 in 60s)"), so an
    outage costs a few lines, not a traceback per attempt."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, what: str, exc: BaseException, level: int = logging.WARNING) -> None:
        now = self.clock()
        key = f"{what}: {exc}"
        with self._lock:
            count = self._count[key] = self._count.get(key, 0) + 1
            if key not in self._last:
                self._first[key] = self._last[key] = now
            elif now - self._last[key] >= self.every:
                self._last[key] = now
            else:
                return
            since = now - self._first[key]
        if count == 1:
            self.logger.log(level, "%s", key)
        else:
            self.logger.log(level, "%s (x%d in %.0fs)", key, count, since)

    def recovered(self, what: str) -> None:
        """The failures of `what` are over: the next one is logged at once again."""
        with self._lock:
            keys = [k for k in self._count if k.startswith(f"{what}: ")]
            over = [(k, self._count[k]) for k in keys]
            for key in keys:
                for table in (self._first, self._last, self._count):
                    table.pop(key, None)
        for key, count in over:
            if count > 1:
                self.logger.info("%s (x%d, over)", key, count)


CALL_FAILURES = FailureLog(log)  # retried calls without a log of their own


class _Retries:
    """The retry decision `call` and `call_async` share: after a failure, how long to wait
    before the next attempt, or re-raise (not retryable, or past `give_up_after`)."""

    def __init__(self, what, policy, give_up_after, failures, on_retry) -> None:
        self.what, self.give_up_after = what, give_up_after
        self.policy = policy or backoff_from_env()
        self.failures, self.on_retry = failures, on_retry
        self.started = time.monotonic()

    def wait_after(self, exc: Exception, attempt: int) -> float:
        if not retryable(exc):
            raise exc
        wait = self.policy.delay(attempt, getattr(exc, "retry_after", None))
        elapsed = time.monotonic() + wait - self.started
        if self.give_up_after is not None and elapsed > self.give_up_after:
            raise exc
        (self.failures or CALL_FAILURES).failed(self.what, exc, logging.INFO)
        if self.on_retry is not None:
            self.on_retry(exc)
        return wait

    def succeeded(self, attempt: int) -> None:
        if self.failures is not None and attempt:
            self.failures.recovered(self.what)


def call(
    action: Callable[[], T],
    what: str,
    *,
    policy: Backoff | None = None,
    give_up_after: float | None = 120.0,
    sleep: Callable[[float], Any] = time.sleep,
    failures: FailureLog | None = None,
    on_retry: Callable[[BaseException], Any] | None = None,
) -> T:
    """Run `action` (which must re-read what it depends on) until it succeeds, retrying
    what `retryable` allows with `policy`; after `give_up_after` seconds (None: never) the
    last failure is raised. `sleep` may raise to stop waiting (a supervisor told to exit).
    `on_retry(exc)` is told of each failure about to be retried (the controller counts them)."""
    retries = _Retries(what, policy, give_up_after, failures, on_retry)
    attempt = 0
    while True:
        try:
            result = action()
        except Exception as exc:  # noqa: BLE001 - wait_after re-raises what is not retried
            sleep(retries.wait_after(exc, attempt))
            attempt += 1
            continue
        retries.succeeded(attempt)
        return result


async def call_async(
    action: Callable[[], Awaitable[T]],
    what: str,
    *,
    policy: Backoff | None = None,
    give_up_after: float | None = 120.0,
    failures: FailureLog | None = None,
    on_retry: Callable[[BaseException], Any] | None = None,
) -> T:
    """`call` for coroutines (the controller)."""
    import asyncio

    retries = _Retries(what, policy, give_up_after, failures, on_retry)
    attempt = 0
    while True:
        try:
            result = await action()
        except Exception as exc:  # noqa: BLE001 - wait_after re-raises what is not retried
            await asyncio.sleep(retries.wait_after(exc, attempt))
            attempt += 1
            continue
        retries.succeeded(attempt)
        return result


# --- list, then watch ---------------------------------------------------------------------------


class Gone(Exception):
    """410: the resourceVersion is too old to watch from; list again."""


class ListWatch:
    """One resource's list-then-watch loop (run `run` in a thread of its own): list and hand
    the items to `on_list`, watch from the list's resourceVersion (bookmarks move it on) and
    hand each change to `on_change(type, obj)`, resume from the last resourceVersion seen
    when a connection drops or a watch request ends, list again after 410 Gone or a refusal.

    Every failure waits the one backoff policy (a watch that ends at once counts as one: it
    never spins), is logged once with a count (`FailureLog`) and goes to `on_error`. A
    subclass says how to list (`list_items`) and open a watch (`open_watch`)."""

    MIN_WATCH_SECONDS = 1.0  # a watch shorter than this ended "at once"
    NOT_CONFIGURED_DELAY = 10.0  # no cluster is configured: look again this often

    def __init__(
        self,
        what: str,
        on_list: Callable[[list[dict[str, Any]]], Any],
        on_change: Callable[[str, dict[str, Any]], Any],
        stopping: threading.Event,
        *,
        watch_timeout: int = 300,
        policy: Backoff | None = None,
        failures: FailureLog | None = None,
        on_error: Callable[[BaseException], Any] | None = None,
    ):
        self.what = what
        self.on_list = on_list
        self.on_change = on_change
        self.stopping = stopping
        self.watch_timeout = watch_timeout
        self.policy = policy or backoff_from_env()
        self.failures = failures or FailureLog(log)
        self.on_error = on_error
        self.lists = 0  # how many times it listed (a relist after 410 counts)
        self.failed = 0  # failures so far (tests and figures)
        self._lock = threading.Lock()
        self._response: Any = None

    # what a subclass provides
    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        """(items, the list's resourceVersion); raise to fail."""
        raise NotImplementedError

    def open_watch(self, resource_version: str) -> Any:
        """The open streaming response (urllib3) of a watch from `resource_version`."""
        raise NotImplementedError

    def host(self) -> str:
        return "(unknown)"

    def closed(self) -> None:
        """The loop ended: release what it held."""

    def run(self) -> None:
        resource_version: str | None = None
        attempt = 0
        try:
            while not self.stopping.is_set():
                retry_after = None
                try:
                    if resource_version is None:
                        items, resource_version = self.list_items()
                        self.lists += 1
                        self.on_list(items)
                    started = time.monotonic()
                    resource_version = self._watch(resource_version)
                    if time.monotonic() - started > self.MIN_WATCH_SECONDS:
                        if attempt:
                            self.failures.recovered(f"following {self.what}")
                        attempt = 0
                        continue
                    # A watch the server ends at once, again and again, must not spin.
                except Gone as exc:
                    log.info("listing %s again (%s)", self.what, exc)
                    resource_version = None
                except Exception as exc:  # noqa: BLE001 - whatever it was, the loop goes on
                    if self.stopping.is_set():
                        break
                    error = as_kube_error(exc, self.host())
                    if isinstance(error, KubeError) and error.status is not None:
                        resource_version = None  # refused: the watch may have missed changes
                    if isinstance(error, ClusterUnavailable) and str(error).startswith(NO_CLUSTER):
                        resource_version = None  # it may be another cluster when one comes
                        self.failures.failed(f"following {self.what}", error, logging.DEBUG)
                        self.stopping.wait(self.NOT_CONFIGURED_DELAY)
                        continue
                    self.failed += 1
                    retry_after = getattr(error, "retry_after", None)
                    self.failures.failed(f"following {self.what}", error)
                    if self.on_error is not None:
                        self.on_error(error)
                self.stopping.wait(self.policy.delay(attempt, retry_after))
                attempt += 1
        finally:
            self.closed()

    def _watch(self, resource_version: str) -> str:
        """Changes from `resource_version` until the server ends the request; the last
        resourceVersion seen."""
        from kubernetes.watch.watch import iter_resp_lines

        response = self.open_watch(resource_version)
        with self._lock:
            self._response = response
        try:
            if self.stopping.is_set():
                return resource_version  # stop came before it could shut this one down
            for line in iter_resp_lines(response):
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(obj.get("message") or "410 Gone")
                    raise refused(int(obj.get("code") or 500), obj)
                resource_version = obj["metadata"].get("resourceVersion") or resource_version
                if kind != "BOOKMARK":
                    self.on_change(kind, obj)
        finally:
            with self._lock:
                self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()
        return resource_version

    def interrupt(self) -> None:
        """Shut the open watch response down, so a blocked read returns at once."""
        with self._lock:
            response = self._response
        if response is not None:
            shutdown_response(response)


def shutdown_response(response: Any) -> None:
    """Unblock a thread reading a streaming urllib3 response (its socket is shut down)."""
    shutdown = getattr(response, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):
            shutdown()
            return
    import socket

    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class ConnectionListWatch(ListWatch):
    """A ListWatch of one collection path over a blocking `Connection`."""

    def __init__(self, conn: Connection, path: str, query: dict[str, Any], *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = conn
        self.path = path
        self.query = query

    def host(self) -> str:
        return self.conn.host

    def list_items(self) -> tuple[list[dict[str, Any]], str]:
        listing = self.conn.request("GET", self.path, query=self.query)
        return listing.get("items") or [], str(listing["metadata"]["resourceVersion"])

    def open_watch(self, resource_version: str) -> Any:
        query = {
            **self.query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout,
        }
        # A connection that died silently shows as a read timeout past the server's own.
        timeout = (self.conn.request_timeout, self.watch_timeout + 30)
        return self.conn.request("GET", self.path, query=query, stream=True, timeout=timeout)
