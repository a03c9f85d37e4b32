"""Every setting of the notebook-controller, as traitlets (config files, CLI, env-free)."""

from __future__ import annotations

from traitlets import Bool, Float, Integer, List, Unicode
from traitlets.config import Configurable

from .ingress import GATEWAY_PRINCIPAL


class ControllerConfig(Configurable):
    """The notebook-controller's settings (``--ControllerConfig.<name>=...`` or a config file)."""

    namespaces = List(
        Unicode(),
        default_value=[],
        config=True,
        help="Namespaces to serve; empty serves every namespace (cluster-wide).",
    )
    kubeconfig = Unicode(
        "",
        config=True,
        help="Path of a kubeconfig file; empty uses $KUBECONFIG, else the "
        "in-cluster service account.",
    )

    # Routing and access (Istio).
    use_istio = Bool(
        True,
        config=True,
        help="Create an Istio VirtualService and AuthorizationPolicy per notebook.",
    )
    gateway = Unicode(
        "istio-system/mlcluster-gateway",
        config=True,
        help="Istio Gateway (namespace/name) the notebook routes are bound to.",
    )
    host = Unicode(
        "*", config=True, help="Host the notebook routes answer on (VirtualService hosts)."
    )
    owner_header = Unicode(
        "kubeflow-userid",
        config=True,
        help="Request header carrying the authenticated user's identity, set "
        "by the auth proxy in front of the gateway.",
    )
    owner_header_prefix = Unicode(
        "",
        config=True,
        help="Prefix the auth proxy puts before the identity in the "
        "header (Kubeflow's userid-prefix, e.g. 'accounts.google.com:').",
    )
    gateway_principal = Unicode(
        GATEWAY_PRINCIPAL,
        config=True,
        help="mTLS identity of the ingress gateway; only it may forward user requests, so the "
        "identity header cannot be forged from inside the mesh.",
    )
    controller_principal = Unicode(
        "cluster.local/ns/mlcluster-system/sa/notebook-controller",
        config=True,
        help="mTLS identity of this controller, allowed to read a notebook's activity endpoints "
        "for culling.",
    )

    # Notebook pods.
    default_image = Unicode(
        "quay.io/jupyter/scipy-notebook:latest",
        config=True,
        help="Image of notebooks whose template names none.",
    )
    image_pull_policy = Unicode(
        "IfNotPresent", config=True, help="imagePullPolicy of the JupyterLab container when unset."
    )
    service_account = Unicode(
        "",
        config=True,
        help="Service account of notebook pods when the template sets none "
        "(empty: the namespace's default).",
    )
    workspace_mount_path = Unicode(
        "/home/jovyan", config=True, help="Where the workspace volume is mounted when not set."
    )
    storage_class = Unicode(
        "", config=True, help="Storage class of workspace volumes when not set (empty: default)."
    )
    shm_size = Unicode(
        "1Gi",
        config=True,
        help="Size of /dev/shm (memory-backed) for data loader workers; empty: none.",
    )

    # Culling.
    culling_enabled = Bool(True, config=True, help="Stop notebooks that stay idle.")
    cull_idle_time = Float(
        24 * 3600.0,
        config=True,
        help="Seconds without activity (kernels, terminals, API use) before a notebook is stopped.",
    )
    cull_check_period = Float(60.0, config=True, help="Seconds between activity checks.")
    cull_connected = Bool(
        False,
        config=True,
        help="Also stop notebooks that have open connections (browser tabs); "
        "by default a connected notebook is never culled.",
    )
    notebook_url_template = Unicode(
        "http://{name}.{namespace}.svc.cluster.local/notebook/{namespace}/{name}/",
        config=True,
        help="Base URL where the controller reads a notebook's activity, with {name} and "
        "{namespace}; tests point it at a local server.",
    )
    probe_timeout = Float(5.0, config=True, help="Seconds to wait for a notebook's activity API.")

    # Metrics.
    metrics_port = Integer(
        0,
        config=True,
        help="Port of the controller's Prometheus /metrics (notebooks by phase, culled, "
        "reconcile latency and errors); 0: none.",
    )
    metrics_address = Unicode(
        "0.0.0.0", config=True, help="Address the /metrics endpoint listens on."
    )

    # Reconciling.
    resync_period = Float(
        600.0,
        config=True,
        help="Seconds between full re-checks of each notebook (drift repair "
        "for changes a watch missed).",
    )
    retry_delay = Float(
        5.0, config=True, help="Seconds before retrying a notebook whose reconcile failed."
    )
    mirror_events = Bool(
        True,
        config=True,
        help="Re-issue events of notebook pods on their Notebook (spawn progress).",
    )
    # Leader election: any number of controllers may run; one (the Lease's holder) reconciles.
    leader_election = Bool(
        True,
        config=True,
        help="Reconcile only while holding the Lease, so two replicas (or a second controller "
        "run from a kubeconfig) never fight; off: reconcile at once, alone.",
    )
    leader_election_namespace = Unicode(
        "",
        config=True,
        help="Namespace of the Lease; empty: this pod's namespace, else the first served "
        "namespace, else 'default'.",
    )
    leader_election_lease = Unicode(
        "notebook-controller", config=True, help="Name of the Lease (coordination.k8s.io/v1)."
    )
    leader_election_identity = Unicode(
        "",
        config=True,
        help="This controller's name in the Lease; empty: $POD_NAME, else the host name "
        "(a restarted container reclaims its own lease at once).",
    )
    lease_duration = Float(
        15.0,
        config=True,
        help="Seconds a Lease not renewed stays valid; a standby takes over after that.",
    )
    lease_renew_period = Float(5.0, config=True, help="Seconds between renewals by the leader.")
    lease_retry_period = Float(
        2.0, config=True, help="Seconds between a standby's attempts to take the Lease."
    )
    api_connections = Integer(
        32, config=True, help="Maximum concurrent connections to the Kubernetes API."
    )
    max_concurrent_reconciles = Integer(
        64,
        config=True,
        help="Reconciles (and status writes) in progress at once; the rest wait their turn "
        "before they read or build anything, so a burst of Notebooks holds a bounded "
        "amount of work in flight and each finishes in turn.",
    )
    log_level = Unicode("INFO", config=True, help="Logging level of the controller.")
