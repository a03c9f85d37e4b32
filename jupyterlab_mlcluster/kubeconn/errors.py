"""What went wrong with a Kubernetes API call, in one readable form: `KubeError` (the API
server answered no), `ClusterUnavailable` (none configured, or not reached), and the tests
callers make of them (`is_not_found`, `is_already_exists`, `status_of`)."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

NO_CLUSTER = "no Kubernetes cluster is configured"


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
