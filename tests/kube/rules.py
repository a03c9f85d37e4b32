"""Per-kind rules a real API server enforces beyond the schemas.

Names, label and annotation syntax, server-side defaults on create, immutable fields.
Each function is pure: objects in, objects or error causes out.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Mapping
from typing import Any

from .validation import Cause

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

_LABEL_NAMED = {("", "namespaces"), ("", "services")}  # DNS labels, not subdomains
_SERVICE_IPS = (
    str(ip) for ip in itertools.islice(ipaddress.ip_network("10.96.0.0/12").hosts(), 1, None)
)


def name_errors(group_resource: tuple[str, str], name: str) -> list[str]:
    if group_resource == ("", "services"):
        if len(name) > 63 or not _DNS1035_LABEL.match(name):
            return [
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
                "start with an alphabetic character, and end with an alphanumeric character"
            ]
        return []
    if group_resource in _LABEL_NAMED:
        if len(name) > 63 or not _DNS1123_LABEL.match(name):
            return [
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                "or '-', and must start and end with an alphanumeric character"
            ]
        return []
    if group_resource in (("", "events"), ("events.k8s.io", "events")):
        return []  # event names are only length-checked by the real server
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character"
        ]
    return []


def _qualified_key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        errors.append(f"prefix part of {key!r} must be a DNS-1123 subdomain")
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        errors.append(
            f"name part of {key!r} must consist of alphanumeric characters, '-', '_' or "
            "'.', and must start and end with an alphanumeric character (63 max)"
        )
    return errors


def metadata_errors(group_resource: tuple[str, str], meta: Mapping[str, Any]) -> list[Cause]:
    causes = [
        Cause("metadata.name", msg) for msg in name_errors(group_resource, meta.get("name", ""))
    ]
    for key, value in (meta.get("labels") or {}).items():
        causes += [Cause("metadata.labels", msg) for msg in _qualified_key_errors(key)]
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                Cause(
                    "metadata.labels",
                    f"Invalid value: {value!r}: a valid label must "
                    "be an empty string or consist of alphanumeric characters, "
                    "'-', '_' or '.' (63 characters max)",
                )
            )
    annotations = meta.get("annotations") or {}
    for key in annotations:
        causes += [Cause("metadata.annotations", msg) for msg in _qualified_key_errors(key)]
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        causes.append(Cause("metadata.annotations", "Too long: must have at most 262144 bytes"))
    return causes


def apply_create_defaults(group_resource: tuple[str, str], obj: dict[str, Any]) -> None:
    """Fill what a real server fills on create (a small, commonly relied-upon subset)."""
    spec = obj.get("spec")
    if group_resource == ("", "namespaces"):
        obj["spec"] = {"finalizers": ["kubernetes"], **(spec or {})}
        obj["status"] = {"phase": "Active"}
    elif group_resource == ("", "pods"):
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif group_resource == ("", "services") and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if spec.get("clusterIP") is None and spec["type"] != "ExternalName":
            spec["clusterIP"] = next(_SERVICE_IPS)
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
    elif group_resource == ("apps", "statefulsets") and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault(
            "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
        )
    elif group_resource == ("batch", "jobs") and isinstance(spec, dict):
        spec.setdefault("parallelism", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
    elif group_resource == ("", "persistentvolumeclaims") and isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}


_TEMPLATE_KINDS = {
    ("apps", "statefulsets"),
    ("apps", "deployments"),
    ("apps", "replicasets"),
    ("apps", "daemonsets"),
    ("batch", "jobs"),
}


def _probe_defaults(probe: dict[str, Any]) -> None:
    for key, value in (
        ("timeoutSeconds", 1),
        ("periodSeconds", 10),
        ("successThreshold", 1),
        ("failureThreshold", 3),
    ):
        probe.setdefault(key, value)
    if isinstance(probe.get("httpGet"), dict):
        probe["httpGet"].setdefault("scheme", "HTTP")


def _pod_spec_defaults(spec: dict[str, Any], restart_policy: str) -> None:
    spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        if not isinstance(container, dict):
            continue
        image = str(container.get("image", ""))
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        container.setdefault(
            "imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent"
        )
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if isinstance(container.get(probe), dict):
                _probe_defaults(container[probe])


def apply_defaults(group_resource: tuple[str, str], obj: dict[str, Any]) -> None:
    """Field defaults the apiserver fills on every write (a subset), so stored objects carry
    more than clients sent, as on a real cluster (controllers must not see that as drift)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if group_resource == ("", "pods"):
        _pod_spec_defaults(spec, "Always")
    elif group_resource in _TEMPLATE_KINDS and isinstance(
        (spec.get("template") or {}).get("spec"), dict
    ):
        _pod_spec_defaults(
            spec["template"]["spec"], "Never" if group_resource == ("batch", "jobs") else "Always"
        )
        if group_resource == ("apps", "statefulsets"):
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault(
                "persistentVolumeClaimRetentionPolicy",
                {"whenDeleted": "Retain", "whenScaled": "Retain"},
            )
    elif group_resource == ("", "services"):
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))


_CONTAINER_VALUES = {
    "imagePullPolicy": ("Always", "IfNotPresent", "Never"),
    "terminationMessagePolicy": ("File", "FallbackToLogsOnError"),
}
_POD_VALUES = {
    "restartPolicy": ("Always", "OnFailure", "Never"),
    "dnsPolicy": ("ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"),
}
_PROTOCOLS = ("TCP", "UDP", "SCTP")


def _supported(causes: list[Cause], path: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        causes.append(
            Cause(
                path,
                f"Unsupported value: {value!r}: supported values: "
                + ", ".join(f'"{v}"' for v in allowed),
                "FieldValueNotSupported",
            )
        )


def _pod_spec_value_errors(spec: Mapping[str, Any], path: str) -> list[Cause]:
    causes: list[Cause] = []
    for key, allowed in _POD_VALUES.items():
        _supported(causes, f"{path}.{key}", spec.get(key), allowed)
    for group in ("containers", "initContainers"):
        for index, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{index}]"
            for key, allowed in _CONTAINER_VALUES.items():
                _supported(causes, f"{where}.{key}", container.get(key), allowed)
            for number, port in enumerate(container.get("ports") or []):
                _supported(
                    causes, f"{where}.ports[{number}].protocol", port.get("protocol"), _PROTOCOLS
                )
    return causes


def value_errors(group_resource: tuple[str, str], obj: Mapping[str, Any]) -> list[Cause]:
    """Enumerated fields the apiserver checks in code (the OpenAPI schemas only describe them)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return []
    causes: list[Cause] = []
    if group_resource == ("", "pods"):
        causes += _pod_spec_value_errors(spec, "spec")
    elif group_resource in _TEMPLATE_KINDS and isinstance(
        (spec.get("template") or {}).get("spec"), Mapping
    ):
        causes += _pod_spec_value_errors(spec["template"]["spec"], "spec.template.spec")
    if group_resource == ("", "services"):
        _supported(
            causes,
            "spec.type",
            spec.get("type"),
            ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"),
        )
        for number, port in enumerate(spec.get("ports") or []):
            _supported(causes, f"spec.ports[{number}].protocol", port.get("protocol"), _PROTOCOLS)
    if group_resource == ("", "persistentvolumeclaims"):
        for number, mode in enumerate(spec.get("accessModes") or []):
            _supported(
                causes,
                f"spec.accessModes[{number}]",
                mode,
                ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"),
            )
    if group_resource == ("apps", "statefulsets"):
        _supported(
            causes,
            "spec.podManagementPolicy",
            spec.get("podManagementPolicy"),
            ("OrderedReady", "Parallel"),
        )
    if group_resource == ("batch", "jobs"):
        _supported(
            causes, "spec.completionMode", spec.get("completionMode"), ("NonIndexed", "Indexed")
        )
    return causes


# Kind -> spec fields that may change after create (everything else in spec is immutable).
_MUTABLE_SPEC = {
    ("apps", "statefulsets"): {
        "replicas",
        "template",
        "updateStrategy",
        "minReadySeconds",
        "persistentVolumeClaimRetentionPolicy",
        "ordinals",
        "revisionHistoryLimit",
    },
    ("", "persistentvolumeclaims"): {"resources", "volumeAttributesClassName"},
}
# Kind -> individual spec fields that are immutable (the rest of spec may change).
_IMMUTABLE_FIELDS = {
    ("", "services"): {"clusterIP"},
    ("batch", "jobs"): {"selector", "completionMode"},
    ("apps", "deployments"): {"selector"},
    ("apps", "replicasets"): {"selector"},
}


def immutable_errors(
    group_resource: tuple[str, str], old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[Cause]:
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    causes = []
    if group_resource in _MUTABLE_SPEC:
        allowed = _MUTABLE_SPEC[group_resource]
        changed = {
            k
            for k in set(old_spec) | set(new_spec)
            if k not in allowed and old_spec.get(k) != new_spec.get(k)
        }
        if changed:
            causes.append(
                Cause(
                    "spec",
                    f"Forbidden: updates to {group_resource[1]} spec for fields "
                    f"other than {sorted(allowed)} are forbidden (changed: {sorted(changed)})",
                )
            )
    for key in _IMMUTABLE_FIELDS.get(group_resource, ()):
        if key in old_spec and old_spec.get(key) != new_spec.get(key):
            causes.append(Cause(f"spec.{key}", "field is immutable"))
    if group_resource == ("batch", "jobs") and not old_spec.get("suspend"):
        if old_spec.get("template") != new_spec.get("template"):
            causes.append(Cause("spec.template", "field is immutable"))
    if group_resource == ("", "pods"):
        old_cmp = {
            k: v for k, v in old_spec.items() if k not in ("activeDeadlineSeconds", "tolerations")
        }
        new_cmp = {
            k: v for k, v in new_spec.items() if k not in ("activeDeadlineSeconds", "tolerations")
        }
        old_images = [c.get("image") for c in old_spec.get("containers", [])]
        for containers in (old_cmp, new_cmp):
            containers["containers"] = [
                {k: v for k, v in c.items() if k != "image"}
                for c in containers.get("containers", [])
            ]
        if old_cmp != new_cmp or len(old_images) != len(new_spec.get("containers", [])):
            causes.append(
                Cause(
                    "spec",
                    "Forbidden: pod updates may not change fields other than "
                    "`spec.containers[*].image`, `spec.activeDeadlineSeconds` and "
                    "`spec.tolerations` (only additions to existing tolerations)",
                )
            )
    return causes
