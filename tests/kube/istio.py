"""Istio CRDs to install into the emulator, with the versions a test chooses.

The schemas cover the fields of VirtualService, Gateway and AuthorizationPolicy that
in-house code uses. They follow Istio's API reference
(https://istio.io/latest/docs/reference/config/networking/virtual-service/,
.../networking/gateway/, .../security/authorization-policy/) and the structure of Istio's
generated CRDs (manifests/charts/base/files/crd-all.gen.yaml in istio/istio): structural
schemas with no ``x-kubernetes-preserve-unknown-fields`` on ``spec``, so a real cluster would
silently prune a mistyped field; ``status`` is open and a status subresource exists.
Fields outside this subset are pruned here as well; extend the schemas when you use more.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

_STR = {"type": "string"}
_STRINGS = {"type": "array", "items": _STR}
_STRING_MAP = {"type": "object", "additionalProperties": _STR}
_STRING_MATCH = {"type": "object", "properties": {"exact": _STR, "prefix": _STR, "regex": _STR}}
_PORT_SELECTOR = {
    "type": "object",
    "properties": {"number": {"type": "integer", "minimum": 0, "maximum": 4294967295}},
}
_HEADER_OPS = {
    "type": "object",
    "properties": {"set": _STRING_MAP, "add": _STRING_MAP, "remove": _STRINGS},
}
_HEADERS = {"type": "object", "properties": {"request": _HEADER_OPS, "response": _HEADER_OPS}}
_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"}

HTTP_ROUTE = {
    "type": "object",
    "properties": {
        "name": _STR,
        "match": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": _STR,
                    "uri": _STRING_MATCH,
                    "scheme": _STRING_MATCH,
                    "method": _STRING_MATCH,
                    "authority": _STRING_MATCH,
                    "headers": {"type": "object", "additionalProperties": _STRING_MATCH},
                    "port": {"type": "integer", "minimum": 0, "maximum": 4294967295},
                    "gateways": _STRINGS,
                    "ignoreUriCase": {"type": "boolean"},
                },
            },
        },
        "route": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["destination"],
                "properties": {
                    "destination": {
                        "type": "object",
                        "required": ["host"],
                        "properties": {"host": _STR, "subset": _STR, "port": _PORT_SELECTOR},
                    },
                    "weight": {"type": "integer", "format": "int32"},
                    "headers": _HEADERS,
                },
            },
        },
        "rewrite": {"type": "object", "properties": {"uri": _STR, "authority": _STR}},
        "timeout": _DURATION,
        "retries": {
            "type": "object",
            "properties": {
                "attempts": {"type": "integer", "format": "int32"},
                "perTryTimeout": _DURATION,
                "retryOn": _STR,
            },
        },
        "headers": _HEADERS,
    },
}
VIRTUAL_SERVICE_SPEC = {
    "type": "object",
    "description": "Configuration affecting label/content routing, sni routing, etc.",
    "properties": {
        "hosts": _STRINGS,
        "gateways": _STRINGS,
        "exportTo": _STRINGS,
        "http": {"type": "array", "items": HTTP_ROUTE},
    },
}
GATEWAY_SPEC = {
    "type": "object",
    "properties": {
        "selector": _STRING_MAP,
        "servers": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["port", "hosts"],
                "properties": {
                    "port": {
                        "type": "object",
                        "required": ["number", "protocol", "name"],
                        "properties": {
                            "number": {"type": "integer", "minimum": 0, "maximum": 4294967295},
                            "protocol": _STR,
                            "name": _STR,
                            "targetPort": {"type": "integer"},
                        },
                    },
                    "hosts": _STRINGS,
                    "bind": _STR,
                    "name": _STR,
                    "tls": {
                        "type": "object",
                        "properties": {
                            "httpsRedirect": {"type": "boolean"},
                            "mode": {
                                "type": "string",
                                "enum": [
                                    "PASSTHROUGH",
                                    "SIMPLE",
                                    "MUTUAL",
                                    "AUTO_PASSTHROUGH",
                                    "ISTIO_MUTUAL",
                                    "OPTIONAL_MUTUAL",
                                ],
                            },
                            "credentialName": _STR,
                        },
                    },
                },
            },
        },
    },
}
AUTHORIZATION_POLICY_SPEC = {
    "type": "object",
    "description": "Configuration for access control on workloads.",
    "properties": {
        "action": {"type": "string", "enum": ["ALLOW", "DENY", "AUDIT", "CUSTOM"]},
        "selector": {
            "type": "object",
            "properties": {
                "matchLabels": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "maxLength": 63},
                }
            },
        },
        "rules": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "from": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "source": {
                                    "type": "object",
                                    "properties": {
                                        key: _STRINGS
                                        for key in (
                                            "principals",
                                            "notPrincipals",
                                            "requestPrincipals",
                                            "notRequestPrincipals",
                                            "namespaces",
                                            "notNamespaces",
                                            "ipBlocks",
                                            "notIpBlocks",
                                            "remoteIpBlocks",
                                            "notRemoteIpBlocks",
                                        )
                                    },
                                }
                            },
                        },
                    },
                    "to": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "operation": {
                                    "type": "object",
                                    "properties": {
                                        key: _STRINGS
                                        for key in (
                                            "hosts",
                                            "notHosts",
                                            "ports",
                                            "notPorts",
                                            "methods",
                                            "notMethods",
                                            "paths",
                                            "notPaths",
                                        )
                                    },
                                }
                            },
                        },
                    },
                    "when": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["key"],
                            "properties": {"key": _STR, "values": _STRINGS, "notValues": _STRINGS},
                        },
                    },
                },
            },
        },
    },
}

_KINDS = {
    # plural: (group, kind, singular, short names, categories, spec schema)
    "virtualservices": (
        "networking.istio.io",
        "VirtualService",
        "virtualservice",
        ["vs"],
        ["istio-io", "networking-istio-io"],
        VIRTUAL_SERVICE_SPEC,
    ),
    "gateways": (
        "networking.istio.io",
        "Gateway",
        "gateway",
        ["gw"],
        ["istio-io", "networking-istio-io"],
        GATEWAY_SPEC,
    ),
    "authorizationpolicies": (
        "security.istio.io",
        "AuthorizationPolicy",
        "authorizationpolicy",
        ["ap"],
        ["istio-io", "security-istio-io"],
        AUTHORIZATION_POLICY_SPEC,
    ),
}
SPEC_SCHEMAS = {kind[1]: kind[5] for kind in _KINDS.values()}


def istio_crd(plural: str, versions: Sequence[str] = ("v1", "v1beta1")) -> dict[str, Any]:
    group, kind, singular, short, categories, spec = _KINDS[plural]
    storage = "v1beta1" if "v1beta1" in versions else versions[0]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"app": "istio-pilot"}},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short,
                "categories": categories,
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": version == storage,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": copy.deepcopy(spec),
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
                for version in versions
            ],
        },
    }


def istio_crds(
    networking: Sequence[str] = ("v1", "v1beta1"), security: Sequence[str] = ("v1", "v1beta1")
) -> list[dict[str, Any]]:
    """CRDs for VirtualService, Gateway (networking) and AuthorizationPolicy (security)."""
    return [
        istio_crd("virtualservices", networking),
        istio_crd("gateways", networking),
        istio_crd("authorizationpolicies", security),
    ]


def strict_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAPI schema as a JSON Schema that rejects unknown fields instead of pruning them.

    Unit tests use it: a field the cluster would silently prune is a bug in the builder.
    """
    result = {
        k: strict_json_schema(v) if isinstance(v, Mapping) else v
        for k, v in schema.items()
        if not k.startswith("x-kubernetes-")
    }
    if "properties" in schema:
        result["properties"] = {k: strict_json_schema(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            result.setdefault("additionalProperties", False)
    return result
