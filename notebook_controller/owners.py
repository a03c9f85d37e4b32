"""Who owns each namespace the controller serves, read from the cluster and believed for a
while: a Notebook whose owner is not its namespace's gets no children (handlers.refusal).

Reading a namespace and its Profile for each reconcile would be a third of the controller's
busy time at 10,000 Notebooks: the answer is kept for NAMESPACE_OWNER_TTL seconds, and the
reconciles of a burst in one namespace wait for one read together.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .kube import KubeClient
from .namespaces import namespace_ownership

# How long a namespace's owner (its Profile or annotation) is believed before it is read again.
NAMESPACE_OWNER_TTL = 30.0
PROFILE_API_VERSION = "kubeflow.org/v1"


class NamespaceOwners:
    """namespace -> (owner or None, why its Profile does not decide that), cached."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        # namespace -> (owner or None, monotonic time read): see NAMESPACE_OWNER_TTL.
        self._known: dict[str, tuple[tuple[str | None, str], float]] = {}
        self._reads: dict[str, asyncio.Future[tuple[str | None, str]]] = {}

    async def owner_of(self, namespace: str) -> tuple[str | None, str]:
        """Who owns `namespace`, and why its Profile does not decide that ("" if it does or
        there is none): namespaces.namespace_ownership, read at most every
        NAMESPACE_OWNER_TTL seconds."""
        known = self._known.get(namespace)
        now = asyncio.get_running_loop().time()
        if known is not None and now - known[1] < NAMESPACE_OWNER_TTL:
            return known[0]
        # One read at a time per namespace: the reconciles of a burst of Notebooks there
        # wait for it together, instead of each reading the namespace and its Profile.
        reading = self._reads.get(namespace)
        if reading is None:
            reading = asyncio.ensure_future(self._read(namespace, now))
            self._reads[namespace] = reading
            reading.add_done_callback(lambda done: self._read_done(namespace, done))
        return await asyncio.shield(reading)  # a waiter cancelled leaves the read to the rest

    async def _read(self, namespace: str, now: float) -> tuple[str | None, str]:
        namespace_obj = await self.kube.get("v1", "Namespace", None, namespace)
        profile = await self.kube.get(PROFILE_API_VERSION, "Profile", None, namespace)
        ownership = namespace_ownership(namespace_obj, profile)
        self._known[namespace] = (ownership, now)
        return ownership

    def _read_done(self, namespace: str, done: asyncio.Future[Any]) -> None:
        if self._reads.get(namespace) is done:
            del self._reads[namespace]
        if not done.cancelled():
            done.exception()  # its waiters (if any are left) raise it; never "not retrieved"
