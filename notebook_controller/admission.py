"""A ValidatingAdmissionPolicy for the pod templates users hand to the cluster (pure).

Pod Security Admission checks pods in the user namespaces; this policy refuses the same
escalations one step earlier and in places Pod Security does not look: a Notebook's
`spec.template` (in any namespace: the controller turns it into a StatefulSet) and the pod
templates of Jobs, PyTorchJobs and TFJobs in user namespaces. Refused: privileged
containers, hostPath volumes, hostNetwork/hostPID/hostIPC, added capabilities beyond
Pod Security baseline's list, and service accounts other than the notebook one (or default).

The expressions are CEL, evaluated by the API server (admissionregistration.k8s.io/v1,
Kubernetes >= 1.30); the tests evaluate the same expressions with a CEL interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .crd import GROUP, PLURAL
from .namespaces import USER_NAMESPACE_LABEL

POLICY_NAME = "mlcluster-pod-templates"
# Pod Security baseline allows adding only these capabilities.
BASELINE_CAPABILITIES = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
]
JOB_RESOURCES = [
    {"apiGroups": ["batch"], "apiVersions": ["*"], "resources": ["jobs"]},
    {"apiGroups": ["kubeflow.org"], "apiVersions": ["*"], "resources": ["pytorchjobs", "tfjobs"]},
]
NOTEBOOK_RESOURCES = [{"apiGroups": [GROUP], "apiVersions": ["*"], "resources": [PLURAL]}]
_OPERATIONS = ["CREATE", "UPDATE"]


def _rules(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**rule, "operations": list(_OPERATIONS)} for rule in resources]


def _quoted(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def validations(
    service_accounts: Sequence[str],
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(variables, validations) of the policy: every pod spec the object carries, then checks."""
    variables = [
        {
            # Every pod spec in the object, whatever its kind.
            "name": "podSpecs",
            "expression": (
                "object.kind == 'PyTorchJob' ? "
                "(has(object.spec.pytorchReplicaSpecs) ? object.spec.pytorchReplicaSpecs.map("
                "r, object.spec.pytorchReplicaSpecs[r].template.spec) : []) : "
                "object.kind == 'TFJob' ? "
                "(has(object.spec.tfReplicaSpecs) ? object.spec.tfReplicaSpecs.map("
                "r, object.spec.tfReplicaSpecs[r].template.spec) : []) : "
                "(has(object.spec.template) && has(object.spec.template.spec) ? "
                "[object.spec.template.spec] : [])"
            ),
        },
        {
            "name": "containers",
            "expression": (
                "variables.podSpecs.map(s, (has(s.containers) ? s.containers : []) + "
                "(has(s.initContainers) ? s.initContainers : []))"
            ),
        },
    ]
    checks = [
        (
            (
                "variables.containers.all(cs, cs.all(c, !has(c.securityContext) || "
                "!has(c.securityContext.privileged) || c.securityContext.privileged == false))"
            ),
            "privileged containers are not allowed",
        ),
        (
            (
                "variables.containers.all(cs, cs.all(c, !has(c.securityContext) || "
                "!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || "
                f"c.securityContext.capabilities.add.all(a, a in {_quoted(BASELINE_CAPABILITIES)})))"
            ),
            "adding capabilities beyond Pod Security baseline is not allowed",
        ),
        (
            "variables.podSpecs.all(s, !has(s.volumes) || s.volumes.all(v, !has(v.hostPath)))",
            "hostPath volumes are not allowed",
        ),
        (
            (
                "variables.podSpecs.all(s, (!has(s.hostNetwork) || s.hostNetwork == false) && "
                "(!has(s.hostPID) || s.hostPID == false) && (!has(s.hostIPC) || s.hostIPC == false))"
            ),
            "hostNetwork, hostPID and hostIPC are not allowed",
        ),
        (
            (
                "variables.podSpecs.all(s, "
                f"(!has(s.serviceAccountName) || s.serviceAccountName in {_quoted(service_accounts)}) && "
                f"(!has(s.serviceAccount) || s.serviceAccount in {_quoted(service_accounts)}))"
            ),
            f"pods may run only as the service accounts {', '.join(service_accounts)}",
        ),
    ]
    return variables, [
        {"expression": expression, "message": message, "reason": "Forbidden"}
        for expression, message in checks
    ]


def admission_policy(service_accounts: Sequence[str]) -> dict[str, Any]:
    variables, checks = validations(service_accounts)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": _rules(NOTEBOOK_RESOURCES + JOB_RESOURCES)},
            "variables": variables,
            "validations": checks,
        },
    }


def admission_bindings() -> list[dict[str, Any]]:
    """Notebooks everywhere (the controller runs their template); job kinds in user
    namespaces (elsewhere they belong to the platform, not to users)."""

    def binding(name: str, match: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": POLICY_NAME,
                "validationActions": ["Deny"],
                "matchResources": match,
            },
        }

    return [
        binding(f"{POLICY_NAME}-notebooks", {"resourceRules": _rules(NOTEBOOK_RESOURCES)}),
        binding(
            f"{POLICY_NAME}-jobs",
            {
                "namespaceSelector": {"matchLabels": {USER_NAMESPACE_LABEL: "true"}},
                "resourceRules": _rules(JOB_RESOURCES),
            },
        ),
    ]


def admission_objects(service_accounts: Sequence[str]) -> list[dict[str, Any]]:
    return [admission_policy(service_accounts), *admission_bindings()]
