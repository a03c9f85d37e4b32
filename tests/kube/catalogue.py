"""Which resources the emulated API server serves: built-ins and installed CRDs.

Built-in resources come from kmock's bundled discovery documents (a real cluster's
``/api/v1`` and ``/apis/<group>/<version>`` answers), limited to the groups below.
Custom resources appear when a CustomResourceDefinition is created through the API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kmock

BUILTIN_GROUP_VERSIONS = (
    "v1",
    "apps/v1",
    "batch/v1",
    "events.k8s.io/v1",
    "rbac.authorization.k8s.io/v1",
    "networking.k8s.io/v1",
    "policy/v1",
    "apiextensions.k8s.io/v1",
    "coordination.k8s.io/v1",
    "scheduling.k8s.io/v1",
    "storage.k8s.io/v1",
    "node.k8s.io/v1",
    "discovery.k8s.io/v1",
    "autoscaling/v2",
    "autoscaling/v1",
)
# Listed in discovery by real servers but not stored objects (create-only or proxies).
_VIRTUAL = {"bindings", "componentstatuses"}

_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
# Field selectors the kube-apiserver supports per resource (pkg/registry/*/strategy.go).
_FIELD_SELECTORS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("events.k8s.io", "events"): frozenset(
        {
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "type",
            "reportingController",
        }
    ),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
    ("apps", "replicasets"): frozenset({"status.replicas"}),
}
# Resources the API server itself gives special behaviour.
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")
PODS = ("", "pods")
_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key of kube-aware version ordering: GA > beta > alpha, higher numbers first."""
    match = _VERSION_RE.match(version)
    if not match:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[match.group(2)]
    return (stage, -int(match.group(1)), -int(match.group(3) or 0), "")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    verbs: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    crd_name: str | None = None
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    selectable_fields: frozenset[str] = frozenset()
    printer_columns: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> tuple[str, str]:
        """Objects live per group+resource: every served version sees the same objects."""
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified_name(self) -> str:
        """The 'plural.group' form used in API error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def field_selectors(self) -> frozenset[str]:
        extra = _FIELD_SELECTORS.get(self.group_resource, frozenset())
        return _COMMON_FIELDS | extra | self.selectable_fields

    def discovery_entries(self) -> list[dict[str, Any]]:
        entry = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": sorted(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        subs = [
            {
                "name": f"{self.plural}/{sub}",
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind
                if sub == "status"
                else ("Scale" if sub == "scale" else self.kind),
                "verbs": ["get", "patch", "update"] if sub in ("status", "scale") else ["get"],
            }
            for sub in sorted(self.subresources)
        ]
        return [entry, *subs]


_CR_VERBS = frozenset(
    {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
)


def resource_types_of_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    spec = crd["spec"]
    names = spec["names"]
    result = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = frozenset((version.get("subresources") or {}).keys())
        selectable = frozenset(
            sf["jsonPath"].lstrip(".") for sf in version.get("selectableFields") or []
        )
        result.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=_CR_VERBS,
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=subresources,
                crd_name=crd["metadata"]["name"],
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                selectable_fields=selectable,
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            )
        )
    return result


def _builtin_types() -> list[ResourceType]:
    bundled = kmock.ResourcesArray()
    bundled.load_bundled()
    result = []
    for resource in bundled:
        gv = f"{resource.group}/{resource.version}" if resource.group else resource.version
        info = bundled[resource]
        if gv not in BUILTIN_GROUP_VERSIONS or resource.plural in _VIRTUAL:
            continue
        if "list" not in info.verbs:
            continue
        result.append(
            ResourceType(
                group=resource.group,
                version=resource.version,
                plural=resource.plural,
                kind=info.kind,
                singular=info.singular or info.kind.lower(),
                namespaced=bool(info.namespaced),
                verbs=frozenset(info.verbs),
                short_names=tuple(sorted(info.shortnames)),
                categories=tuple(sorted(info.categories)),
                subresources=frozenset(info.subresources),
            )
        )
    return result


class Catalogue:
    """The served resources, indexed the ways the API server needs them."""

    def __init__(self) -> None:
        self._by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self._by_gvk: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in _builtin_types():
            self._add(rtype)

    def _add(self, rtype: ResourceType) -> None:
        self._by_gvr[(rtype.group, rtype.version, rtype.plural)] = rtype
        self._by_gvk[(rtype.group, rtype.version, rtype.kind)] = rtype

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_gvr.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return self._by_gvk.get((group, version, kind))

    def all(self) -> Iterable[ResourceType]:
        return list(self._by_gvr.values())

    def versions_of(self, group_resource: tuple[str, str]) -> list[ResourceType]:
        return [r for r in self._by_gvr.values() if r.group_resource == group_resource]

    def groups(self) -> dict[str, list[str]]:
        """Group -> served versions, preferred (highest priority) first."""
        result: dict[str, set[str]] = {}
        for rtype in self._by_gvr.values():
            result.setdefault(rtype.group, set()).add(rtype.version)
        return {group: sorted(versions, key=version_priority) for group, versions in result.items()}

    def install_crd(self, crd: Mapping[str, Any]) -> list[ResourceType]:
        self.remove_crd(crd["metadata"]["name"])
        types = resource_types_of_crd(crd)
        for rtype in types:
            self._add(rtype)
        return types

    def remove_crd(self, crd_name: str) -> None:
        for key, rtype in list(self._by_gvr.items()):
            if rtype.crd_name == crd_name:
                del self._by_gvr[key]
                del self._by_gvk[(rtype.group, rtype.version, rtype.kind)]
