"""The settings of a server shared by many users behind an authenticating proxy: whom a
request comes from (the identity header, a JWT), where each user's notebooks live, the
quotas and TensorBoard places of one user, and whether local jobs run at all. They are
MLClusterApp's traitlets (`c.MLClusterApp.trust_identity_header = True`), with what they
imply."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, HasTraits, Int, List, TraitError, Unicode, validate

from .user_namespace import DEFAULT_TEMPLATE, BadTemplate, check_template

# A shared server's per-user quotas on the job store unless the operator sets them.
SHARED_JOB_QUOTA = 200
SHARED_STORE_QUOTA_MIB = 1024


class SharedServerSettings(HasTraits):
    """Mixed into MLClusterApp: its traitlets, configured and shown in `--help-all` as the
    app's own (a HasTraits, not a Configurable, has no config section of its own)."""

    notebook_namespace = Unicode(
        "",
        help="One namespace for every user's Notebook objects (a single-namespace install: "
        "users are then told apart only by spec.owner). '' (the default): with "
        "trust_identity_header, each user's notebooks live in the user's own namespace "
        "(user_namespace_template); without it (one user per server), in "
        "MLClusterConfig.kubernetes_namespace, else this pod's namespace, else 'default'.",
    ).tag(config=True)

    user_namespace_template = Unicode(
        DEFAULT_TEMPLATE,
        help="Where a user's notebooks live when each user has their own namespace (see "
        "notebook_namespace): the namespace of a Kubeflow Profile the user owns "
        "(kubeflow.org/v1, spec.owner {kind: User, name: <user>}) where the Profile CRD is "
        "served, else this template with {user} replaced, made a DNS-1123 label (lowercase, "
        "other characters '-', at most 63; a hash of the name is appended whenever that "
        "changes it, so two users never share one). Keep a prefix: '{user}' alone would let a "
        "user named 'kube-system' spawn there. The namespace must exist (`mlcluster manifests "
        "--user-namespace NS`).",
    ).tag(config=True)

    trust_identity_header = Bool(
        False,
        help="Take the caller's identity (the owner of the notebook servers it sees and spawns) "
        "from `identity_header` instead of the Jupyter Server identity provider. Only for a "
        "server that sits behind an authenticating proxy which sets that header on every "
        "request (and drops any the client sent): anyone who reaches the server some other way "
        "could claim any identity. A request without the header is refused (403). Such a "
        "server is shared by many users and runs as one Unix user, so it then serves only "
        "JupyterLab's page (and the reads it makes) and the mlcluster API: kernels, "
        "terminals, contents, sessions and every write of Jupyter's own answer 403 "
        "(server/confinement.py lists what is served).",
    ).tag(config=True)

    allow_local_jobs_when_shared = Bool(
        False,
        help="Run local-backend and Slurm jobs (every backend whose ranks run as this server's "
        "account: Backend.ranks_inherit_environment) submitted through the REST API on a "
        "server shared by many users (per_user_namespaces: trust_identity_header and no "
        "notebook_namespace). Every such job runs as this server's one Unix user (on its "
        "machine, or in a Slurm allocation of its account), so one user's job code "
        "can read another's job files, environment (tokens, keys) and processes, and the "
        "server's own. Off (the default), as JupyterHub never runs two users' code as one Unix "
        "user: such a job is refused (403, nothing stored or started), a request naming no "
        "backend gets kubernetes (the user's own namespace) whatever "
        "MLClusterConfig.default_backend says, the warm pool is not prestarted and this server "
        "fires no local schedules. Turn on only for a single-tenant deployment that still "
        "trusts the header. Jobs from kernels and the CLI in a user's own notebook pod run in "
        "that pod and are not affected either way.",
    ).tag(config=True)

    identity_header = Unicode(
        "kubeflow-userid",
        help="Request header carrying the authenticated user's identity when "
        "trust_identity_header is on (Kubeflow's default; the notebook-controller's "
        "ControllerConfig.owner_header must name the same header).",
    ).tag(config=True)

    identity_header_prefix = Unicode(
        "",
        help="Prefix the proxy puts before the identity in identity_header (Kubeflow's "
        "userid-prefix, e.g. 'accounts.google.com:'); removed to give the owner, as the "
        "notebook-controller's ControllerConfig.owner_header_prefix adds it back.",
    ).tag(config=True)

    watched_namespaces = List(
        Unicode(),
        help="With per-user namespaces: the user namespaces whose Notebooks and events this "
        "server follows (for /events), each on its own, so that its RBAC grants those reads "
        "there only (`mlcluster manifests --user-namespace` sets it and prints that RBAC). "
        "Empty: one watch of every namespace, which needs cluster-wide reads (user namespaces "
        "not known in advance, e.g. Kubeflow Profiles).",
    ).tag(config=True)

    jwt_issuer = Unicode(
        "",
        help="With trust_identity_header: the OIDC issuer whose JWT (Authorization: Bearer, "
        "which the gateway forwards) must name the caller; the identity header alone is then "
        "never enough (server/jwt_identity.py). Empty: the header is believed as it is.",
    ).tag(config=True)

    jwt_jwks_uri = Unicode(
        "",
        help="URL of jwt_issuer's signing keys; empty: found from the issuer's "
        "/.well-known/openid-configuration.",
    ).tag(config=True)

    jwt_audiences = List(
        Unicode(),
        help="Accepted 'aud' values of the JWTs; required with jwt_issuer (the server refuses "
        "to start without them: a token minted for another application must not log in).",
    ).tag(config=True)

    jwt_payload_header = Unicode(
        "",
        help="With jwt_issuer: the header in which the gateway passes on the payload of the JWT "
        "it verified (Istio's outputPayloadToHeader), for requests that carry no bearer token "
        "(the printed gateway drops the raw token, so that no other route on it receives it). "
        "Its claims are checked (issuer, audience, expiry, user claim, email_verified), not a "
        "signature (it has none): believe it only where nothing but the gateway reaches this "
        "server. Empty: a bearer token is required.",
    ).tag(config=True)

    jwt_user_claim = Unicode(
        "email",
        help="The JWT claim naming the user (the gateway copies the same one). With 'email' the "
        "token must also carry email_verified: true.",
    ).tag(config=True)

    tensorboard_user_dir = Unicode(
        "",
        help="On a server shared through trust_identity_header: the directory under which a "
        "caller's jobs may name TensorBoard directories (`tensorboard` in POST /jobs, or "
        "MLCLUSTER_TENSORBOARD_DIR in their env), `{user}` being the caller's identity, e.g. "
        "'/mnt/tensorboard/{user}' on a volume the ranks share. Checked by realpath (no symlink "
        "or '..' leads out, nor any symlink inside the directory: its tree is walked, bounded), "
        "at submit (400, nothing stored) and again whenever TensorBoard is opened (403). "
        "'': only the job's own directory in the store, the operator's "
        "MLClusterConfig.tensorboard_dir and tensorboard_allowed_uris. A server not shared "
        "reads whatever its user names.",
    ).tag(config=True)

    tensorboard_allowed_uris = List(
        Unicode(),
        default_value=[],
        help="On a server shared through trust_identity_header: URI prefixes a caller's job "
        "may name as its TensorBoard directory (TensorBoard reads them with this server's "
        "credentials, for everyone), `{user}` being the caller's identity, e.g. "
        "['s3://team-runs/{user}/']. Empty (the default): no URI but the operator's "
        "MLClusterConfig.tensorboard_dir.",
    ).tag(config=True)

    owner_job_quota = Int(
        -1,
        help="On a server shared through trust_identity_header: most jobs one user may keep in "
        "the job store (every state; purged ones do not count). Submitting one more is refused "
        "(403, nothing stored) saying so and how to purge. -1: 200 on a shared server, no "
        "limit otherwise; 0: no limit.",
    ).tag(config=True)

    owner_store_quota_mib = Int(
        -1,
        help="On a server shared through trust_identity_header: most MiB one user's kept jobs "
        "may hold in the job store (their directories: logs, results, payloads, default "
        "TensorBoard data). Checked when a job is submitted: at or over it, the submission is "
        "refused (403, nothing stored). A job already accepted still runs to its own caps "
        "(MLClusterConfig.max_log_mib, max_result_mib). -1: 1024 on a shared server, no limit "
        "otherwise; 0: no limit.",
    ).tag(config=True)

    @property
    def per_user_namespaces(self) -> bool:
        """Each user's notebooks in their own namespace: identity from the trusted header
        (many users on this server) and no single namespace forced (notebook_namespace)."""
        return self.trust_identity_header and not self.notebook_namespace

    @property
    def refuses_local_jobs(self) -> bool:
        """Local jobs would run as this server's one Unix user for many users: refused (see
        allow_local_jobs_when_shared)."""
        return self.per_user_namespaces and not self.allow_local_jobs_when_shared

    @property
    def job_quota(self) -> int:
        """Most jobs one user may keep (owner_job_quota resolved; 0: no limit)."""
        if self.owner_job_quota >= 0:
            return self.owner_job_quota
        return SHARED_JOB_QUOTA if self.trust_identity_header else 0

    @property
    def store_quota_bytes(self) -> int:
        """Most bytes one user's kept jobs may hold (owner_store_quota_mib resolved; 0: none)."""
        mib = self.owner_store_quota_mib
        if mib < 0:
            mib = SHARED_STORE_QUOTA_MIB if self.trust_identity_header else 0
        return mib * 1024 * 1024

    @validate("user_namespace_template")
    def _valid_template(self, proposal: Any) -> str:
        try:
            return check_template(proposal["value"])
        except BadTemplate as exc:
            raise TraitError(str(exc)) from None
