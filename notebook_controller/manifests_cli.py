"""``mlcluster manifests``: what a platform team applies, from its options (traitlets).

Every option reaches what it prints (no option is silently ignored: the CLI refuses unknown
ones, cli._unknown_options); bad values are refused before anything is printed.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from traitlets import Bool, Dict, List, TraitError, Unicode, validate
from traitlets.config import Application

from .admission import DEFAULT_ALLOWED_TOLERATIONS
from .ingress import IngressAuth
from .manifests import NOTEBOOK_SERVICE_ACCOUNT, SERVER_SERVICE_ACCOUNT, all_manifests
from .objects import namespace_error, owner_error
from .scheduling_policy import DEFAULT_SCHEDULER, SchedulingAllowList


class ManifestsApp(Application):
    name = "mlcluster-manifests"
    description = "Print what a platform team applies: CRD, RBAC, controller Deployment, Gateway."
    aliases = {
        "namespace": "ManifestsApp.namespace",
        "image": "ManifestsApp.image",
        "gateway": "ManifestsApp.gateway",
        "host": "ManifestsApp.host",
        "owner-header": "ManifestsApp.owner_header",
        "user-namespace": "ManifestsApp.user_namespaces",
        "namespace-owner": "ManifestsApp.namespace_owners",
        "notebook-service-account": "ManifestsApp.notebook_service_account",
        "server-namespace": "ManifestsApp.server_namespace",
        "server-service-account": "ManifestsApp.server_service_account",
        "oidc-issuer": "ManifestsApp.oidc_issuer",
        "jwks-uri": "ManifestsApp.jwks_uri",
        "audience": "ManifestsApp.audiences",
        "user-claim": "ManifestsApp.user_claim",
        "tls-secret": "ManifestsApp.tls_secret",
        "allowed-toleration": "ManifestsApp.allowed_tolerations",
        "allowed-storage-class": "ManifestsApp.allowed_storage_classes",
        "priority-class": "ManifestsApp.kubernetes_priority_classes",
        "scheduler-name": "ManifestsApp.scheduler_name",
        "allowed-runtime-class": "ManifestsApp.allowed_runtime_classes",
        "allowed-queue": "ManifestsApp.allowed_queues",
        "route-namespace": "ManifestsApp.route_namespaces",
    }
    flags = {
        "no-gateway": (
            {"ManifestsApp": {"include_gateway": False}},
            "Leave out the Gateway and its authentication.",
        ),
        "insecure-header-trust": (
            {"ManifestsApp": {"insecure_header_trust": True}},
            (
                "Without --oidc-issuer, print the shared Jupyter server anyway: it then "
                "believes the identity header with no JWT check (only the mesh policy that "
                "admits the gateway alone stands between a forged header and any user)."
            ),
        ),
        "monitoring": (
            {"ManifestsApp": {"monitoring": True}},
            (
                "Also serve the controller's /metrics, and print a Service and ServiceMonitor "
                "(Prometheus Operator) for it and a Grafana dashboard ConfigMap."
            ),
        ),
    }
    namespace = Unicode("mlcluster-system", config=True, help="The controller's namespace.")
    image = Unicode("", config=True, help="Controller image (default: the release image).")
    gateway = Unicode(
        "istio-system/mlcluster-gateway", config=True, help="Istio Gateway of the routes."
    )
    host = Unicode("*", config=True, help="Host the notebook routes answer on.")
    owner_header = Unicode("kubeflow-userid", config=True, help="Header with the user's identity.")
    include_gateway = Bool(
        True,
        config=True,
        help="Include the Istio Gateway with its JWT verification (needs --oidc-issuer).",
    )
    oidc_issuer = Unicode(
        "",
        config=True,
        help="The platform's OIDC issuer (the 'iss' of its JWTs, e.g. https://dex.example.com). "
        "Without it no Gateway is printed: nothing could verify who a request comes from.",
    )
    jwks_uri = Unicode(
        "",
        config=True,
        help="URL of the issuer's signing keys (empty: found from the issuer's "
        "/.well-known/openid-configuration).",
    )
    audiences = List(
        Unicode(),
        config=True,
        help="Accepted 'aud' values of the JWTs (repeat the option); required with "
        "--oidc-issuer: a token its issuer minted for another application must not pass.",
    )
    user_claim = Unicode(
        "email",
        config=True,
        help="The JWT claim that names the user; copied into the identity header.",
    )
    tls_secret = Unicode(
        "",
        config=True,
        help="Secret (in the gateway's namespace) with the host's TLS certificate; with it the "
        "Gateway serves HTTPS and redirects HTTP.",
    )
    allowed_tolerations = List(
        Unicode(),
        default_value=list(DEFAULT_ALLOWED_TOLERATIONS),
        config=True,
        help="Taint keys users' notebook and job pods may tolerate (repeat the option; given, "
        "it replaces the default, the GPU taint nvidia.com/gpu). A toleration of any other key, "
        "or without a key, is refused by the admission policy: no user pod on a control-plane "
        "or otherwise reserved node.",
    )
    allowed_storage_classes = List(
        Unicode(),
        config=True,
        help="Storage classes users' ephemeral volumes and StatefulSet claim templates may ask "
        "for (repeat the option; empty: any class). A claim template naming a "
        "PersistentVolume (volumeName) is refused either way.",
    )
    kubernetes_priority_classes = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="The PriorityClass of each job priority, as MLClusterConfig."
        "kubernetes_priority_classes maps them (repeat: --priority-class 10=training-high): "
        "their names are the only priorityClassName users' pod templates may carry (none "
        "without this option). The system classes (system-node-critical, "
        "system-cluster-critical) preempt every tenant and are refused here; each "
        "--user-namespace also gets a ResourceQuota admitting no pod of them.",
    )
    scheduler_name = Unicode(
        DEFAULT_SCHEDULER,
        config=True,
        help="The one schedulerName users' pod templates may carry ('volcano' with "
        "MLClusterConfig.kubernetes_gang = volcano); another would step around the gang "
        "scheduler and its queues. Pods naming none get the cluster's default scheduler.",
    )
    allowed_runtime_classes = List(
        Unicode(),
        config=True,
        help="RuntimeClasses users' pod templates may name (repeat the option; empty, the "
        "default: none, every pod runs on the nodes' default runtime).",
    )
    allowed_queues = List(
        Unicode(),
        config=True,
        help="Volcano queues users' jobs and PodGroups may name besides 'default' (repeat the "
        "option; MLClusterConfig.kubernetes_queue and each queue users pass with --queue). "
        "Volcano queues are cluster-wide: a queue not given here is another team's.",
    )
    insecure_header_trust = Bool(
        False,
        config=True,
        help="Without --oidc-issuer, print the shared Jupyter server anyway, believing the "
        "identity header with no JWT check. Off: without an issuer the server is not printed.",
    )
    monitoring = Bool(
        False,
        config=True,
        help="Serve the controller's /metrics and print its ServiceMonitor and a Grafana "
        "dashboard (label grafana_dashboard: '1', for Grafana's dashboard sidecar).",
    )
    user_namespaces = List(
        Unicode(),
        config=True,
        help="Namespaces where users' notebooks run (repeat the option for several): each gets "
        "the service account notebook pods run as, allowed to run `%%distributed --backend "
        "kubernetes` jobs in that namespace and nothing more.",
    )
    route_namespaces = List(
        Unicode(),
        config=True,
        help="Namespaces besides the shared server's and each --user-namespace whose "
        "VirtualServices may bind to the Gateway (repeat the option): Kubeflow Profiles' "
        "namespaces where notebooks run (the controller makes each notebook's route in its "
        "namespace). The Gateway's hosts are <namespace>/<host> for these only: a route of "
        "any other namespace could set the identity header to anyone.",
    )
    namespace_owners = Dict(
        value_trait=Unicode(),
        key_trait=Unicode(),
        config=True,
        help="The user owning each --user-namespace (repeat: --namespace-owner team-a=alice@"
        "example.com), as the identity header names them: the namespace is annotated "
        "mlcluster.io/owner and the controller refuses notebooks there for anyone else. A "
        "namespace without an owner (or a Kubeflow Profile) is one users share.",
    )
    notebook_service_account = Unicode(
        NOTEBOOK_SERVICE_ACCOUNT,
        config=True,
        help="The service account notebook pods run as in the user namespaces.",
    )

    server_namespace = Unicode(
        "",
        config=True,
        help="Namespace the shared Jupyter server (the mlcluster extension, with per-user "
        "namespaces) runs in, where its service account is printed ('' = --namespace). Its "
        "RBAC is least privilege: cluster-wide reads of Profiles, Notebooks, Events, "
        "ClusterTrainingRuntimes and Nodes; Notebooks and jobs only in each --user-namespace.",
    )
    server_service_account = Unicode(
        SERVER_SERVICE_ACCOUNT,
        config=True,
        help="The service account the shared Jupyter server runs as.",
    )

    @validate("namespace", "server_namespace")
    def _valid_namespace(self, proposal: Any) -> str:
        if proposal["trait"].name == "server_namespace" and not proposal["value"]:
            return ""
        problem = namespace_error(proposal["value"])
        if problem:
            raise TraitError(f"--{proposal['trait'].name.replace('_', '-')}: {problem}")
        return proposal["value"]

    @validate("user_namespaces", "route_namespaces")
    def _valid_user_namespaces(self, proposal: Any) -> list[str]:
        for name in proposal["value"]:
            problem = namespace_error(name)
            if problem:
                raise TraitError(f"--{proposal['trait'].name[:-1].replace('_', '-')}: {problem}")
        return proposal["value"]

    @validate("namespace_owners")
    def _valid_namespace_owners(self, proposal: Any) -> dict[str, str]:
        for namespace, owner in proposal["value"].items():
            problem = owner_error(owner)
            if problem:
                raise TraitError(f"--namespace-owner {namespace}: {problem}")
        return proposal["value"]

    def start(self) -> None:
        unknown = sorted(set(self.namespace_owners) - set(self.user_namespaces))
        if unknown:  # checked here: traitlets sets the two options in no set order
            raise TraitError(f"--namespace-owner: {', '.join(unknown)} not a --user-namespace")
        options: dict[str, Any] = {
            "namespace": self.namespace,
            "gateway": self.gateway,
            "host": self.host,
            "owner_header": self.owner_header,
            "include_gateway": self.include_gateway,
            "user_namespaces": self.user_namespaces,
            "namespace_owners": dict(self.namespace_owners),
            "notebook_service_account": self.notebook_service_account,
            "tls_secret": self.tls_secret,
            "server_namespace": self.server_namespace,
            "server_service_account": self.server_service_account,
            "allowed_tolerations": list(self.allowed_tolerations),
            "allowed_storage_classes": list(self.allowed_storage_classes),
            "route_namespaces": list(self.route_namespaces),
        }
        try:
            options["scheduling"] = SchedulingAllowList(
                priority_classes=sorted(set(self.kubernetes_priority_classes.values())),
                scheduler=self.scheduler_name,
                runtime_classes=list(self.allowed_runtime_classes),
                queues=list(self.allowed_queues),
            )
        except ValueError as exc:
            raise TraitError(
                "--priority-class, --scheduler-name, --allowed-runtime-class, --allowed-queue: "
                f"{exc}"
            ) from None
        if self.oidc_issuer and not [a for a in self.audiences if a]:
            raise TraitError(
                "--oidc-issuer needs --audience (the 'aud' your OIDC provider puts in this "
                "application's tokens; repeat for several): without it the gateway and the "
                "shared server would accept a token the issuer minted for any other application"
            )
        if self.oidc_issuer and self.insecure_header_trust:
            raise TraitError(
                "--insecure-header-trust is for a layout without --oidc-issuer; with an issuer "
                "the shared server verifies the JWT"
            )
        if self.oidc_issuer:
            options["ingress_auth"] = IngressAuth(
                issuer=self.oidc_issuer,
                jwks_uri=self.jwks_uri,
                audiences=tuple(self.audiences),
                user_claim=self.user_claim,
                owner_header=self.owner_header,
            )
        elif self.include_gateway:
            sys.stderr.write(
                f"{self.name}: no Gateway printed: without --oidc-issuer nothing verifies who a "
                "request comes from, and anyone reaching the ingress could send the identity "
                "header of any user. Give --oidc-issuer (and --jwks-uri, --audience) of your "
                "platform's OIDC provider, or --no-gateway to bring your own.\n"
            )
        if not self.oidc_issuer:
            if self.insecure_header_trust:
                options["insecure_header_trust"] = True
            else:
                sys.stderr.write(
                    f"{self.name}: no shared Jupyter server printed: without --oidc-issuer it "
                    "would believe the identity header with no JWT check. Give --oidc-issuer and "
                    "--audience, or --insecure-header-trust to print it that way anyway.\n"
                )
        if self.image:
            options["image"] = self.image
        documents = []
        if self.monitoring:
            from .monitoring import METRICS_PORT, monitoring_manifests

            options["extra_args"] = [f"--ControllerConfig.metrics_port={METRICS_PORT}"]
            documents = monitoring_manifests(self.namespace)
        documents = all_manifests(**options) + documents
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
