"""The asyncio front end (the notebook-controller): `AsyncConnection`, a `kubernetes.aio`
client with plain-dict REST."""

from __future__ import annotations

from typing import Any

from .config import load_config_async
from .errors import as_kube_error, refused
from .rest import _decode, _query


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
        _proxy_once(loaded.configuration, loaded.host)
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


def _proxy_once(configuration: Any, host: str) -> None:
    """The environment's proxy for the API server (HTTPS_PROXY, NO_PROXY, ...), read once
    here: the client's session would read it, and ~/.netrc, on every request, each in a
    thread of its own (two thread hops per call, most of a burst's overhead under load).
    A proxy that needs credentials is left to the session as before."""
    import aiohttp.helpers
    import yarl

    if configuration.proxy is None:
        try:
            proxy, auth = aiohttp.helpers.get_env_proxy_for_url(yarl.URL(host))
        except LookupError:  # none, or the API server is in NO_PROXY
            proxy, auth = None, None
        if auth is not None:
            return
        if proxy is not None:
            configuration.proxy = str(proxy)
    extra = getattr(configuration, "client_session_kwargs", None) or {}
    configuration.client_session_kwargs = {**extra, "trust_env": False}
