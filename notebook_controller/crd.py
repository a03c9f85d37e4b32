"""The Notebook custom resource: ``notebooks.mlcluster.io``, version ``v1alpha1``."""

from __future__ import annotations

from typing import Any

from jupyterlab_mlcluster import patterns
from jupyterlab_mlcluster.notebook_resource import (  # noqa: F401 - the controller's names
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
)

CRD_NAME = f"{PLURAL}.{GROUP}"

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
    },
}

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["owner", "template"],
    "properties": {
        "owner": {
            "type": "string",
            "minLength": 1,
            "maxLength": 253,
            # One identity, never a pattern or a list: it becomes the one header value the
            # notebook's AuthorizationPolicy admits (Istio reads '*' there as a wildcard).
            "pattern": patterns.IDENTITY,
            "description": "Identity of the user this notebook server belongs to, as the "
            "identity header carries it. Only this user is let through. One identity: no "
            "'*', whitespace, ',' or ';'.",
        },
        "template": {
            "type": "object",
            "required": ["spec"],
            "description": "Pod template of the notebook server (like Kubeflow's Notebook).",
            "properties": {
                "metadata": {
                    "type": "object",
                    "properties": {"labels": _STRING_MAP, "annotations": _STRING_MAP},
                },
                "spec": {
                    "type": "object",
                    "required": ["containers"],
                    "x-kubernetes-preserve-unknown-fields": True,
                    "description": "A core/v1 PodSpec; the first container runs JupyterLab.",
                    "properties": {
                        "containers": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "name": {"type": "string"},
                                    "image": {"type": "string"},
                                },
                            },
                        }
                    },
                },
            },
        },
        "workspace": {
            "type": "object",
            "required": ["size"],
            "description": "A persistent workspace volume (kept while the notebook is stopped).",
            "properties": {
                "size": {
                    "type": "string",
                    "pattern": patterns.WORKSPACE_SIZE,
                    "description": "Requested storage, e.g. 10Gi.",
                },
                "storageClassName": {"type": "string"},
                "mountPath": {"type": "string", "default": "/home/jovyan"},
            },
        },
    },
}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "description": "starting, ready, stopped or 'error: <why>'"},
        "message": {"type": "string"},
        "url": {"type": "string"},
        "ready": {"type": "boolean"},
        "readyReplicas": {"type": "integer"},
        "observedGeneration": {"type": "integer"},
        "lastActivity": {"type": "string", "format": "date-time"},
        "conditions": {
            "type": "array",
            "items": _CONDITION,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        "containerState": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def notebook_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "jupyterlab-mlcluster"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "notebook",
                "shortNames": ["nb"],
                "categories": ["mlcluster"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "selectableFields": [{"jsonPath": ".spec.owner"}],
                    "additionalPrinterColumns": [
                        {"name": "Owner", "type": "string", "jsonPath": ".spec.owner"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                        {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 1},
                        {
                            "name": "Message",
                            "type": "string",
                            "jsonPath": ".status.message",
                            "priority": 1,
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A per-user JupyterLab server behind Istio.",
                            "properties": {"spec": SPEC_SCHEMA, "status": STATUS_SCHEMA},
                            # Names become a Service (DNS-1035) and '<name>-0' pods with a
                            # controller-revision-hash label (63 max): the API refuses others.
                            "x-kubernetes-validations": [
                                {
                                    "rule": "self.metadata.name.size() <= 52 && self.metadata"
                                    ".name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                                    "message": "notebook names are at most 52 lower-case "
                                    "letters, digits and '-', starting with a letter",
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }
