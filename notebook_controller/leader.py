"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

Any number of controllers may run; the one holding the Lease reconciles, the others wait.
The holder renews every `renew_period`; a standby takes the Lease over once it has seen no
renewal for `lease_duration` seconds, measured on its own monotonic clock from the moment it
last saw the Lease change (so clocks of different nodes never need to agree). Every write
carries the resourceVersion it read: of two standbys racing for an expired Lease, one wins,
the other gets 409 and keeps waiting. A leader that cannot renew before its Lease would expire
steps down (the caller stops reconciling and exits; the Deployment restarts it as a standby).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import time
from typing import Any

from .kube import KubeClient, KubeError

log = logging.getLogger("notebook_controller.leader")
API_VERSION = "coordination.k8s.io/v1"


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed in time, or another controller holds it now."""


def _micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElection:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_period: float = 5.0,
        retry_period: float = 2.0,
        clock: Any = time.monotonic,
    ) -> None:
        if not renew_period < lease_duration:
            raise ValueError("the renew period must be shorter than the lease duration")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_period = renew_period
        self.retry_period = retry_period
        self._clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when we last renewed, while leader

    def _lease(self, spec: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this controller holds the Lease afterwards."""
        now = datetime.datetime.now(datetime.UTC)
        stamp = _micro_time(now)
        ours = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "renewTime": stamp,
        }
        current = await self.kube.get(API_VERSION, "Lease", self.namespace, self.name)
        if current is None:
            try:
                await self.kube.create(
                    self._lease({**ours, "acquireTime": stamp, "leaseTransitions": 0})
                )
            except KubeError as exc:
                if exc.status == 409:
                    return False  # another controller created it first
                raise
            self._renewed_at = self._clock()
            return True
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, spec.get("renewTime") or "")
        if seen != self._observed:
            self._observed, self._observed_at = seen, self._clock()
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and self._clock() - self._observed_at < duration:
            return False  # held, and renewed recently as far as we have seen
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}
        }
        if holder == self.identity:
            patch["spec"] = ours
        else:
            transitions = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
            patch["spec"] = {**ours, "acquireTime": stamp, "leaseTransitions": transitions}
        try:
            await self.kube.patch(API_VERSION, "Lease", self.namespace, self.name, patch)
        except KubeError as exc:
            if exc.status in (404, 409):
                return False  # changed (or went) under us: look again next time
            raise
        self._renewed_at = self._clock()
        return True

    async def acquire(self) -> None:
        """Wait (as a standby) until this controller holds the Lease."""
        announced = False
        while True:
            try:
                if await self.try_acquire_or_renew():
                    log.info("Became the leader (Lease %s/%s)", self.namespace, self.name)
                    return
            except (TimeoutError, KubeError, OSError) as exc:
                log.warning("Could not read the Lease %s/%s: %s", self.namespace, self.name, exc)
            if not announced:
                log.info(
                    "Standing by: %s holds the Lease %s/%s",
                    (self._observed or ("?",))[0],
                    self.namespace,
                    self.name,
                )
                announced = True
            await asyncio.sleep(self.retry_period * random.uniform(0.8, 1.2))

    async def hold(self) -> None:
        """Renew until leadership is lost; then raise LeadershipLost (never returns otherwise).

        A renewal that fails is retried every `retry_period`, until the Lease we last renewed
        would have expired for the others; then another controller may lead, so we must not."""
        while True:
            await asyncio.sleep(self.renew_period)
            while True:
                try:
                    if await self.try_acquire_or_renew():
                        break
                    raise LeadershipLost(f"{self._observed and self._observed[0]} holds the Lease")
                except (TimeoutError, KubeError, OSError) as exc:
                    assert self._renewed_at is not None
                    left = self.lease_duration - (self._clock() - self._renewed_at)
                    if left <= self.retry_period:
                        raise LeadershipLost(f"could not renew the Lease: {exc}") from exc
                    log.warning("Could not renew the Lease (%s); retrying", exc)
                    await asyncio.sleep(self.retry_period)

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown, so a standby takes over at once."""
        try:
            current = await self.kube.get(API_VERSION, "Lease", self.namespace, self.name)
            if (
                current is None
                or (current.get("spec") or {}).get("holderIdentity") != self.identity
            ):
                return
            await self.kube.patch(
                API_VERSION,
                "Lease",
                self.namespace,
                self.name,
                {
                    "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
                },
            )
        except (TimeoutError, KubeError, OSError) as exc:
            log.warning("Could not release the Lease (it expires by itself): %s", exc)
