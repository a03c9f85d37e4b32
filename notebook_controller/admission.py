"""A ValidatingAdmissionPolicy for the pod templates users hand to the cluster (pure).

Pod Security Admission checks pods in the user namespaces; this policy refuses the same
escalations one step earlier and in places Pod Security does not look: a Notebook's
`spec.template` (in any namespace: the controller turns it into a StatefulSet) and the pod
templates of Jobs, CronJobs, PyTorchJobs, TFJobs, TrainJobs (runtime patches, and older
Trainers' pod overrides) and StatefulSets in user namespaces. Refused: privileged containers,
added capabilities beyond Pod Security baseline's list, hostNetwork/hostPID/hostIPC, volumes
other than `ALLOWED_VOLUME_TYPES` (so no hostPath, nfs, iscsi, csi...), `nodeName` and its
equivalents (a `kubernetes.io/hostname` nodeSelector or node-affinity term, a `metadata.name`
field match), tolerations of taints outside an allow-list (default: the GPU taint only, so no
pod lands on a control-plane node), `runAsUser: 0` and root's group (`runAsGroup`, `fsGroup`,
`supplementalGroups` 0) on the pod or any container, ephemeral or StatefulSet claim templates
naming a PersistentVolume (`volumeName`: bind any Available volume) or, with an allow-list, a
storage class outside it, service accounts other than the notebook one (or default), and what
a pod may ask of the scheduler (scheduling_policy.py: priority and runtime classes and the
scheduler from allow-lists, no affinity terms across namespaces); and for job kinds, any
Secret (volume, projected source, env or envFrom) other than the job's own
(`JOB_SECRET_NAMES`: the names its builders give the Secrets they create).

Two more policies for the user namespaces: Secrets that the namespace's own service accounts
(its pods) create must be `Opaque` (a `kubernetes.io/service-account-token` Secret with an
allowed name would mint a token of any service account there), and Services may not be
NodePort or LoadBalancer nor carry `externalIPs` (a way in around the gateway's JWT check;
CVE-2020-8554); and one for their VirtualServices, which may not write the identity headers
(route_policy.py).

User namespaces: those labelled `mlcluster.io/user-namespace=true` (`mlcluster manifests
--user-namespace`) and Kubeflow Profiles' (`app.kubernetes.io/part-of=kubeflow-profile`, the
label the profile controller sets): each user-namespace binding is made once per label.

`runAsNonRoot: true` is not required: users name their job images (`--image python:3.11`,
root by default), and the kubelet would refuse to start those; Pod Security baseline allows
root without privileges, and the rules above keep root away from the node.

The expressions are CEL, evaluated by the API server (admissionregistration.k8s.io/v1,
Kubernetes >= 1.30); the tests evaluate the same expressions with a CEL interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .crd import GROUP, PLURAL
from .ingress import PAYLOAD_HEADER
from .namespaces import PROFILE_NAMESPACE_LABELS, USER_NAMESPACE_LABEL
from .route_policy import (
    MESH_CHECKS,
    MESH_POLICY_NAME,
    MESH_RESOURCES,
    ROUTE_RESOURCES,
    ROUTES_POLICY_NAME,
    route_checks,
)
from .scheduling_policy import (
    DEFAULT_SCHEDULING,
    GROUP_POLICY_NAME,
    GROUP_RESOURCES,
    KUBEFLOW_JOB_KINDS,
    SchedulingAllowList,
    group_checks,
    replica_specs,
    scheduling_checks,
)

POLICY_NAME = "mlcluster-pod-templates"
SECRETS_POLICY_NAME = "mlcluster-user-secrets"
SERVICES_POLICY_NAME = "mlcluster-user-services"
# Taints a user's pod may tolerate unless the platform says otherwise: GPU nodes' (the NVIDIA
# GPU operator's taint), never the control plane's.
DEFAULT_ALLOWED_TOLERATIONS = ["nvidia.com/gpu"]
# Node-name pinning by label or field: what `nodeName` does, through the scheduler.
NODE_NAME_LABEL = "kubernetes.io/hostname"
NODE_NAME_FIELD = "metadata.name"
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
# Every kind whose pod templates a notebook's service account (or the shared server, or a
# schedule's CronJob) puts into a user namespace. Pods themselves are Pod Security's: the mesh's
# sidecar injection adds a root init container with NET_ADMIN to every pod, which no
# template-level rule here should have to know about.
JOB_KINDS = ["Job", "CronJob", *KUBEFLOW_JOB_KINDS, "TrainJob"]
JOB_RESOURCES = [
    {"apiGroups": ["batch"], "apiVersions": ["*"], "resources": ["jobs", "cronjobs"]},
    {
        "apiGroups": ["kubeflow.org"],
        "apiVersions": ["*"],
        "resources": [k.lower() + "s" for k in KUBEFLOW_JOB_KINDS],
    },
    {"apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["*"], "resources": ["trainjobs"]},
    {
        "apiGroups": ["apps"],
        "apiVersions": ["*"],
        "resources": ["statefulsets", "deployments", "replicasets", "daemonsets"],
    },
]
NOTEBOOK_RESOURCES = [{"apiGroups": [GROUP], "apiVersions": ["*"], "resources": [PLURAL]}]
_OPERATIONS = ["CREATE", "UPDATE"]
# The volume types a pod of a job or notebook may use: its own data and the cluster's
# objects in its namespace. Not nfs/iscsi/csi/hostPath/...: storage outside the namespace's
# control, mounted with whatever uid the pod claims.
ALLOWED_VOLUME_TYPES = [
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "ephemeral",
]
# The Secrets a job's pods may read: those its own builders create, recognisable by name.
# Payload Secrets: `<object>-<20 hex of HMAC(job key)>-payload-<NNN>`
# (backends/kubernetes/objects.payload_secret_prefix, payload_secrets); a schedule's:
# `mlcluster-<schedule>-<16 hex>` (backends/kubernetes/schedules.new_secret_name). Both names
# are unguessable and created create-only by the job's supervisor or the schedule, so no
# Secret the platform put in the namespace (credentials, tokens, pull secrets) has one.
JOB_SECRET_NAMES = [
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{20}-payload-[0-9]{3}$",
    r"^mlcluster-[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{16}$",
]


def _rules(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**rule, "operations": list(_OPERATIONS)} for rule in resources]


def _quoted(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


# CEL over one pod spec `s`: its containers of every sort.
_CONTAINERS = (
    "((has(s.containers) ? s.containers : []) + "
    "(has(s.initContainers) ? s.initContainers : []) + "
    "(has(s.ephemeralContainers) ? s.ephemeralContainers : []))"
)


def _secret_name_ok(name: str) -> str:
    return "(" + " || ".join(f"{name}.matches('{p}')" for p in JOB_SECRET_NAMES) + ")"


def _env_secrets_ok(env_list: str) -> str:
    return (
        f"(!has({env_list}) || {env_list}.all(e, !has(e.valueFrom) || "
        "!has(e.valueFrom.secretKeyRef) || "
        "(has(e.valueFrom.secretKeyRef.name) && "
        f"{_secret_name_ok('e.valueFrom.secretKeyRef.name')})))"
    )


# Per pod spec `s`: (CEL that must hold, message).
_BASE_POD_SPEC_CHECKS: list[tuple[str, str]] = [
    (
        f"{_CONTAINERS}.all(c, !has(c.securityContext) || "
        "!has(c.securityContext.privileged) || c.securityContext.privileged == false)",
        "privileged containers are not allowed",
    ),
    (
        f"{_CONTAINERS}.all(c, !has(c.securityContext) || "
        "!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || "
        f"c.securityContext.capabilities.add.all(a, a in {_quoted(BASELINE_CAPABILITIES)}))",
        "adding capabilities beyond Pod Security baseline is not allowed",
    ),
    ("!has(s.volumes) || s.volumes.all(v, !has(v.hostPath))", "hostPath volumes are not allowed"),
    (
        "!has(s.volumes) || s.volumes.all(v, "
        + " || ".join(f"has(v.{t})" for t in ALLOWED_VOLUME_TYPES)
        + ")",
        f"volumes may only be of the types {', '.join(ALLOWED_VOLUME_TYPES)}",
    ),
    (
        "(!has(s.hostNetwork) || s.hostNetwork == false) && "
        "(!has(s.hostPID) || s.hostPID == false) && (!has(s.hostIPC) || s.hostIPC == false)",
        "hostNetwork, hostPID and hostIPC are not allowed",
    ),
    (
        "!has(s.nodeName) || s.nodeName == ''",
        "nodeName is not allowed (the scheduler places pods)",
    ),
    (
        "(!has(s.securityContext) || !has(s.securityContext.runAsUser) || "
        "s.securityContext.runAsUser != 0) && "
        f"{_CONTAINERS}.all(c, !has(c.securityContext) || !has(c.securityContext.runAsUser) || "
        "c.securityContext.runAsUser != 0)",
        "runAsUser 0 (root) is not allowed",
    ),
]


def _term_pins_no_node(term: str) -> str:
    return (
        f"(!has({term}.matchExpressions) || {term}.matchExpressions.all(e, "
        f"e.key != '{NODE_NAME_LABEL}')) && "
        f"(!has({term}.matchFields) || {term}.matchFields.all(e, e.key != '{NODE_NAME_FIELD}'))"
    )


_NODE_AFFINITY = "s.affinity.nodeAffinity"
_REQUIRED = f"{_NODE_AFFINITY}.requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = f"{_NODE_AFFINITY}.preferredDuringSchedulingIgnoredDuringExecution"
_NO_NODE_PINNING = (
    f"(!has(s.nodeSelector) || !('{NODE_NAME_LABEL}' in s.nodeSelector)) && "
    f"(!has(s.affinity) || !has({_NODE_AFFINITY}) || ("
    f"(!has({_REQUIRED}) || !has({_REQUIRED}.nodeSelectorTerms) || "
    f"{_REQUIRED}.nodeSelectorTerms.all(t, {_term_pins_no_node('t')})) && "
    f"(!has({_PREFERRED}) || {_PREFERRED}.all(p, !has(p.preference) || "
    f"{_term_pins_no_node('p.preference')}))))"
)
_NO_ROOT_GROUP = (
    "(!has(s.securityContext) || ("
    "(!has(s.securityContext.runAsGroup) || s.securityContext.runAsGroup != 0) && "
    "(!has(s.securityContext.fsGroup) || s.securityContext.fsGroup != 0) && "
    "(!has(s.securityContext.supplementalGroups) || "
    "!(0 in s.securityContext.supplementalGroups)))) && "
    f"{_CONTAINERS}.all(c, !has(c.securityContext) || !has(c.securityContext.runAsGroup) || "
    "c.securityContext.runAsGroup != 0)"
)


def _claim_spec_ok(spec: str, storage_classes: Sequence[str]) -> str:
    """A claim template's spec binds no chosen PersistentVolume (and, with an allow-list,
    asks only for those storage classes)."""
    ok = f"(!has({spec}.volumeName) || {spec}.volumeName == '')"
    if storage_classes:
        ok += (
            f" && (!has({spec}.storageClassName) || "
            f"{spec}.storageClassName in {_quoted(storage_classes)})"
        )
    return ok


def _pod_spec_checks(
    tolerations: Sequence[str], storage_classes: Sequence[str]
) -> list[tuple[str, str]]:
    template = "v.ephemeral.volumeClaimTemplate"
    classes = (
        f" or a storage class other than {', '.join(storage_classes)}" if storage_classes else ""
    )
    return [
        *_BASE_POD_SPEC_CHECKS,
        (
            _NO_NODE_PINNING,
            f"pinning a pod to a node ({NODE_NAME_LABEL} nodeSelector or node affinity, "
            f"{NODE_NAME_FIELD} field) is not allowed (the scheduler places pods)",
        ),
        (
            "!has(s.tolerations) || s.tolerations.all(t, has(t.key) && "
            f"t.key in {_quoted(tolerations)})",
            "pods may tolerate only the taints "
            + (", ".join(tolerations) if tolerations else "(none)")
            + " (a toleration without a key tolerates every taint)",
        ),
        (
            _NO_ROOT_GROUP,
            "runAsGroup, fsGroup or supplementalGroups 0 (root's group) is not allowed",
        ),
        (
            f"!has(s.volumes) || s.volumes.all(v, !has(v.ephemeral) || "
            f"!has({template}) || !has({template}.spec) || "
            f"({_claim_spec_ok(template + '.spec', storage_classes)}))",
            f"an ephemeral volume may not name a PersistentVolume (volumeName){classes}",
        ),
    ]


def _service_account_check(service_accounts: Sequence[str]) -> tuple[str, str]:
    return (
        f"(!has(s.serviceAccountName) || s.serviceAccountName in {_quoted(service_accounts)}) && "
        f"(!has(s.serviceAccount) || s.serviceAccount in {_quoted(service_accounts)})",
        f"pods may run only as the service accounts {', '.join(service_accounts)}",
    )


# Job kinds only: every Secret a pod spec names is one of the job's own.
_JOB_SECRETS_CHECK = (
    "!(object.kind in " + _quoted(JOB_KINDS) + ") || ("
    "(!has(s.volumes) || s.volumes.all(v, "
    "(!has(v.secret) || (has(v.secret.secretName) && "
    + _secret_name_ok("v.secret.secretName")
    + ")) && "
    "(!has(v.projected) || !has(v.projected.sources) || v.projected.sources.all(p, "
    "!has(p.secret) || (has(p.secret.name) && " + _secret_name_ok("p.secret.name") + "))))) && "
    f"{_CONTAINERS}.all(c, {_env_secrets_ok('c.env')} && "
    "(!has(c.envFrom) || c.envFrom.all(f, !has(f.secretRef) || "
    "(has(f.secretRef.name) && " + _secret_name_ok("f.secretRef.name") + ")))))",
    "a job's pods may use only the Secrets the job itself created (its payload Secrets, "
    "or its schedule's)",
)


def validations(
    service_accounts: Sequence[str],
    tolerations: Sequence[str] = tuple(DEFAULT_ALLOWED_TOLERATIONS),
    storage_classes: Sequence[str] = (),
    scheduling: SchedulingAllowList = DEFAULT_SCHEDULING,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(variables, validations) of the policy: every pod spec the object carries, then checks
    that each of them must pass (`scheduling`: scheduling_policy.py's allow-lists)."""
    variables = [
        {
            # Every pod spec in the object, whatever its kind (TrainJob: its runtime patches
            # come in a list of lists, `patchedPodSpecs`; older Trainers' overrides here).
            "name": "podSpecs",
            "expression": (
                f"object.kind in {KUBEFLOW_JOB_KINDS} ? ("
                + replica_specs(".map(r, r.template.spec)")
                + ") : "
                "object.kind == 'CronJob' ? "
                "(has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && "
                "has(object.spec.jobTemplate.spec.template) && "
                "has(object.spec.jobTemplate.spec.template.spec) ? "
                "[object.spec.jobTemplate.spec.template.spec] : []) : "
                "object.kind == 'TrainJob' ? "
                "((has(object.spec.podSpecOverrides) ? object.spec.podSpecOverrides : []) + "
                "(has(object.spec.podTemplateOverrides) ? object.spec.podTemplateOverrides"
                ".filter(o, has(o.spec)).map(o, o.spec) : [])) : "
                "(has(object.spec.template) && has(object.spec.template.spec) ? "
                "[object.spec.template.spec] : [])"
            ),
        },
        {
            # TrainJob (Trainer v2.3): runtimePatches[].trainingRuntimeSpec.template.spec
            # .replicatedJobs[].template.spec.template.spec, one list per patch.
            "name": "patchedPodSpecs",
            "expression": (
                "object.kind == 'TrainJob' && has(object.spec.runtimePatches) ? "
                "object.spec.runtimePatches.map(p, has(p.trainingRuntimeSpec) && "
                "has(p.trainingRuntimeSpec.template) && has(p.trainingRuntimeSpec.template.spec) "
                "&& has(p.trainingRuntimeSpec.template.spec.replicatedJobs) ? "
                "p.trainingRuntimeSpec.template.spec.replicatedJobs.filter(r, has(r.template) && "
                "has(r.template.spec) && has(r.template.spec.template) && "
                "has(r.template.spec.template.spec)).map(r, r.template.spec.template.spec) : []) "
                ": []"
            ),
        },
    ]
    checks = [
        *_pod_spec_checks(tolerations, storage_classes),
        _service_account_check(service_accounts),
        _JOB_SECRETS_CHECK,
        *scheduling_checks(scheduling),
    ]
    rendered = [
        (
            f"variables.podSpecs.all(s, {check}) && "
            f"variables.patchedPodSpecs.all(g, g.all(s, {check}))",
            message,
        )
        for check, message in checks
    ]
    # A TrainJob's trainer container env (merged into the runtime's node container), and its
    # initializers' env and secretRef (the Trainer mounts that Secret into their pods).
    rendered.append(
        (
            "object.kind != 'TrainJob' || !has(object.spec.trainer) || "
            + _env_secrets_ok("object.spec.trainer.env"),
            _JOB_SECRETS_CHECK[1],
        )
    )
    for part in ("dataset", "model"):
        where = f"object.spec.initializer.{part}"
        rendered.append(
            (
                "object.kind != 'TrainJob' || !has(object.spec.initializer) || "
                f"!has({where}) || ((!has({where}.secretRef) || "
                f"(has({where}.secretRef.name) && {_secret_name_ok(where + '.secretRef.name')}))"
                f" && {_env_secrets_ok(where + '.env')})",
                _JOB_SECRETS_CHECK[1],
            )
        )
    # A StatefulSet's own claim templates bind a chosen PersistentVolume as surely.
    rendered.append(
        (
            "object.kind != 'StatefulSet' || !has(object.spec.volumeClaimTemplates) || "
            "object.spec.volumeClaimTemplates.all(t, !has(t.spec) || ("
            + _claim_spec_ok("t.spec", storage_classes)
            + "))",
            "a StatefulSet's claim templates may not name a PersistentVolume (volumeName)"
            + (
                f" or a storage class other than {', '.join(storage_classes)}"
                if storage_classes
                else ""
            ),
        )
    )
    return variables, [
        {"expression": expression, "message": message, "reason": "Forbidden"}
        for expression, message in rendered
    ]


def admission_policy(
    service_accounts: Sequence[str],
    tolerations: Sequence[str] = tuple(DEFAULT_ALLOWED_TOLERATIONS),
    storage_classes: Sequence[str] = (),
    scheduling: SchedulingAllowList = DEFAULT_SCHEDULING,
) -> dict[str, Any]:
    variables, checks = validations(service_accounts, tolerations, storage_classes, scheduling)
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


def user_namespace_selectors() -> list[tuple[str, dict[str, Any]]]:
    """(binding name suffix, namespaceSelector) for each way a namespace is a user's: ours
    (`--user-namespace`), and Kubeflow Profiles'. A selector cannot say "either label", so
    each policy bound to user namespaces has one binding per selector."""
    return [
        ("", {"matchLabels": {USER_NAMESPACE_LABEL: "true"}}),
        ("-profiles", {"matchLabels": dict(PROFILE_NAMESPACE_LABELS)}),
    ]


def _binding(name: str, policy: str, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy, "validationActions": ["Deny"], "matchResources": match},
    }


def admission_bindings() -> list[dict[str, Any]]:
    """Notebooks everywhere (the controller runs their template); job kinds in user
    namespaces (elsewhere they belong to the platform, not to users)."""
    return [
        _binding(
            f"{POLICY_NAME}-notebooks", POLICY_NAME, {"resourceRules": _rules(NOTEBOOK_RESOURCES)}
        ),
        *(
            _binding(
                f"{POLICY_NAME}-jobs{suffix}",
                POLICY_NAME,
                {"namespaceSelector": selector, "resourceRules": _rules(JOB_RESOURCES)},
            )
            for suffix, selector in user_namespace_selectors()
        ),
    ]


def _user_namespace_policy(
    name: str,
    resource_rules: list[dict[str, Any]],
    checks: list[tuple[str, str]],
    match_conditions: list[dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """A policy on one kind in the user namespaces, and its bindings."""
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": resource_rules},
        "validations": [
            {"expression": expression, "message": message, "reason": "Forbidden"}
            for expression, message in checks
        ],
    }
    if match_conditions:
        spec["matchConditions"] = match_conditions
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }
    return [
        policy,
        *(
            _binding(
                f"{name}{suffix}",
                name,
                {"namespaceSelector": selector, "resourceRules": resource_rules},
            )
            for suffix, selector in user_namespace_selectors()
        ),
    ]


def secrets_policy() -> list[dict[str, Any]]:
    """Secrets made by the namespace's own service accounts (its pods: notebooks, jobs, a
    schedule's CronJob) are Opaque. A `kubernetes.io/service-account-token` Secret names a
    service account by annotation and the API server fills in its token: any account of the
    namespace, with whatever it is bound to, behind a name the pod rules allow. The platform's
    controllers and people (kubectl) are not matched: they may make pull secrets and the like."""
    return _user_namespace_policy(
        SECRETS_POLICY_NAME,
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["secrets"],
                "operations": ["CREATE"],
            }
        ],
        [
            (
                "!has(object.type) || object.type == 'Opaque'",
                "a pod's service account may create only Opaque Secrets (no service-account "
                "tokens, no other types)",
            )
        ],
        [
            {
                "name": "made-by-a-service-account-of-the-namespace",
                "expression": "request.userInfo.username.startsWith("
                "'system:serviceaccount:' + request.namespace + ':')",
            }
        ],
    )


def services_policy() -> list[dict[str, Any]]:
    """No NodePort, LoadBalancer or externalIPs in user namespaces: each opens a way to the
    namespace's pods around the gateway and its JWT check (externalIPs also intercept traffic
    for those addresses cluster-wide: CVE-2020-8554). ClusterIP (headless too) is what the
    controller and the job builders make."""
    return _user_namespace_policy(
        SERVICES_POLICY_NAME,
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["services"],
                "operations": list(_OPERATIONS),
            }
        ],
        [
            (
                "!has(object.spec.type) || !(object.spec.type in ['NodePort', 'LoadBalancer'])",
                "Services of type NodePort or LoadBalancer are not allowed in user namespaces "
                "(a way in around the gateway)",
            ),
            (
                "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
                "Services may not carry externalIPs in user namespaces",
            ),
        ],
    )


def admission_objects(
    service_accounts: Sequence[str],
    tolerations: Sequence[str] = tuple(DEFAULT_ALLOWED_TOLERATIONS),
    storage_classes: Sequence[str] = (),
    scheduling: SchedulingAllowList = DEFAULT_SCHEDULING,
    identity_header: str = "kubeflow-userid",
    gateway: str = "istio-system/mlcluster-gateway",
    host: str = "*",
) -> list[dict[str, Any]]:
    return [
        admission_policy(service_accounts, tolerations, storage_classes, scheduling),
        *admission_bindings(),
        *secrets_policy(),
        *services_policy(),
        # Group-level priority and queue fields (scheduling_policy.py).
        *_user_namespace_policy(GROUP_POLICY_NAME, GROUP_RESOURCES, group_checks(scheduling)),
        # Routes in user namespaces write no identity (route_policy.py).
        *_user_namespace_policy(
            ROUTES_POLICY_NAME,
            ROUTE_RESOURCES,
            route_checks([identity_header, PAYLOAD_HEADER], gateway, host),
        ),
        # No mesh configuration of users' own (route_policy.py).
        *_user_namespace_policy(MESH_POLICY_NAME, MESH_RESOURCES, MESH_CHECKS),
    ]
