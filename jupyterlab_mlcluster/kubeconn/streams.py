"""A long-lived GET (a followed pod log) of a blocking `Connection`, read by asyncio.

Many streams of a process are read by one event loop (aiohttp) while their `Connection`s
stay blocking (urllib3). What the blocking client would do for the request is taken from the
connection itself, so both agree: its URL, query and headers (bearer token, refreshed by the
client's hook when it expires; user agent) come from the client's own `param_serialize`;
TLS (CA, client certificate, verification, SNI) and the proxy from its `Configuration`, read
the way its urllib3 pool manager reads them.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import threading
from typing import Any

from .blocking import Connection
from .errors import KubeError
from .rest import _query


@dataclasses.dataclass(frozen=True)
class Transport:
    """What a connection to the API server depends on: streams with equal ones can share a
    session (its connections and TLS context); the bearer token travels in each request."""

    host: str
    verify: bool
    ca_file: str | None
    ca_data: str | None
    cert_file: str | None
    key_file: str | None
    check_hostname: bool
    # The files' (mtime, size): a rotated certificate is a new transport, read again.
    stamps: tuple[tuple[int, int] | None, ...] = ()

    @property
    def tls(self) -> bool:
        return self.host.lower().startswith("https:")


@dataclasses.dataclass(frozen=True)
class StreamRequest:
    """One prepared GET: where, with which headers, through which proxy."""

    url: str
    headers: dict[str, str]
    transport: Transport
    proxy: str | None
    proxy_headers: dict[str, str] | None
    server_hostname: str | None  # the name TLS expects (None: the URL's)


def prepare_get(conn: Connection, path: str, query: dict[str, Any]) -> StreamRequest:
    """The request the blocking client would send (in the caller's thread: a token refresh
    hook may block). KubeError when the connection's settings cannot be streamed here."""
    api = conn.api
    configuration = api.configuration
    _, url, headers, _, _ = api.param_serialize(
        "GET",
        path,
        query_params=_query(query),
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    # The bytes as written (the blocking stream read them undecoded).
    headers = {**headers, "Accept-Encoding": "identity"}
    assert_hostname = configuration.assert_hostname
    files = (configuration.ssl_ca_cert, configuration.cert_file, configuration.key_file)
    transport = Transport(
        host=configuration.host,
        verify=bool(configuration.verify_ssl),
        ca_file=configuration.ssl_ca_cert,
        ca_data=getattr(configuration, "ca_cert_data", None),
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        check_hostname=assert_hostname is not False,
        stamps=tuple(_stamp(f) for f in files),
    )
    proxy, proxy_headers = _proxy(configuration)
    server_hostname = configuration.tls_server_name or (
        assert_hostname if isinstance(assert_hostname, str) else None
    )
    return StreamRequest(url, headers, transport, proxy, proxy_headers, server_hostname)


def _stamp(path: str | None) -> tuple[int, int] | None:
    try:
        status = os.stat(path) if path else None
    except OSError:
        return None
    return (status.st_mtime_ns, status.st_size) if status else None


def _proxy(configuration: Any) -> tuple[str | None, dict[str, str] | None]:
    """The proxy urllib3 would use (the configuration's, unless its no_proxy covers the host)."""
    from kubernetes.client.rest import is_socks_proxy_url, should_bypass_proxies

    proxy = configuration.proxy
    if not proxy or should_bypass_proxies(configuration.host, configuration.no_proxy or ""):
        return None, None
    if is_socks_proxy_url(proxy):
        raise KubeError(f"a SOCKS proxy ({proxy}) cannot carry pod log streams; use an HTTP one")
    headers = configuration.proxy_headers
    return proxy, dict(headers) if headers else None


_contexts: dict[Transport, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def ssl_context(transport: Transport) -> ssl.SSLContext | None:
    """The TLS context of a transport (made once per process: it reads the CA and the
    client certificate files), None for plain HTTP."""
    if not transport.tls:
        return None
    with _contexts_lock:
        context = _contexts.get(transport)
        if context is None:
            context = ssl.create_default_context(cafile=transport.ca_file, cadata=transport.ca_data)
            if transport.cert_file:
                context.load_cert_chain(transport.cert_file, keyfile=transport.key_file)
            if not transport.verify or not transport.check_hostname:
                context.check_hostname = False
            if not transport.verify:
                context.verify_mode = ssl.CERT_NONE
            _contexts[transport] = context
        return context
