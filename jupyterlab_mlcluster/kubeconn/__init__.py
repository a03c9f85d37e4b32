"""The one way this product reaches a Kubernetes cluster: where it is, which namespace, what
went wrong (in one readable form), and when to try again.

Three users stand on it: the Kubernetes backend (blocking: supervisors, and submitting front
ends off their event loop), the server extension (blocking, in executor and watch threads)
and the notebook-controller (asyncio). Each keeps only what is its own (the backend's kinds
and discovery, the server's Notebook calls, the controller's children); configuration,
namespace, errors, paths and the retry policy are here, once.

Which cluster, the way kubectl finds it: a kubeconfig given explicitly (an argument, or
`$KUBECONFIG`, a list of files joined by `os.pathsep` and merged), else the pod's service
account when running inside a cluster, else `~/.kube/config`. Read at every call:
the `kubernetes` package reads `$KUBECONFIG` only once, when first imported.

Requests go through the client's `ApiClient` (auth, token refresh, TLS, connection pool) by
path, as its DynamicClient does, and answer plain JSON dicts: the typed API classes cost
seconds of import (pydantic models) and need a class per kind.

What is where (import from the package; these names are re-exported here):
- `errors.py`: `KubeError`, `ClusterUnavailable`, `NO_CLUSTER`, `refused`, `unreachable`,
  `as_kube_error`, `root_cause`, `status_of`, `is_not_found`, `is_already_exists`;
- `config.py`: which cluster and namespace (`load_config`, `load_config_async`,
  `ClusterConfig`, `in_cluster`, `kubeconfig_files`, `configuration_problem`);
- `rest.py`: `resource_path`, `MERGE_PATCH`, the request encoding both front ends share;
- `blocking.py`: `Connection`, `connect`, `check_reachable`, the server's `KubeConnection`;
- `aio.py`: `AsyncConnection` (the controller);
- `retry.py`: `call`, `call_async`, `retryable`, `backoff_from_env`, `FailureLog`,
  `CALL_FAILURES`, `BackoffSchedule`, `RepeatFilter` (and `Backoff`, from `jobs/backoff.py`);
- `listwatch.py`: `ListWatch`, `ConnectionListWatch`, `Gone`, `shutdown_response`.
"""

from ..jobs.backoff import Backoff
from .aio import AsyncConnection
from .blocking import Connection, KubeConnection, check_reachable, connect
from .config import (
    DEFAULT_KUBECONFIG,
    SERVICE_ACCOUNT_DIR,
    ClusterConfig,
    configuration_problem,
    in_cluster,
    kubeconfig_files,
    load_config,
    load_config_async,
)
from .errors import (
    NO_CLUSTER,
    ClusterUnavailable,
    KubeError,
    as_kube_error,
    is_already_exists,
    is_not_found,
    refused,
    root_cause,
    status_of,
    unreachable,
)
from .listwatch import ConnectionListWatch, Gone, ListWatch, shutdown_response
from .rest import MERGE_PATCH, resource_path
from .retry import (
    CALL_FAILURES,
    BackoffSchedule,
    FailureLog,
    RepeatFilter,
    backoff_from_env,
    call,
    call_async,
    log,
    retryable,
)

__all__ = [
    "CALL_FAILURES",
    "DEFAULT_KUBECONFIG",
    "MERGE_PATCH",
    "NO_CLUSTER",
    "SERVICE_ACCOUNT_DIR",
    "AsyncConnection",
    "Backoff",
    "BackoffSchedule",
    "ClusterConfig",
    "ClusterUnavailable",
    "Connection",
    "ConnectionListWatch",
    "FailureLog",
    "Gone",
    "KubeConnection",
    "KubeError",
    "ListWatch",
    "RepeatFilter",
    "as_kube_error",
    "backoff_from_env",
    "call",
    "call_async",
    "check_reachable",
    "configuration_problem",
    "connect",
    "in_cluster",
    "is_already_exists",
    "is_not_found",
    "kubeconfig_files",
    "load_config",
    "load_config_async",
    "log",
    "refused",
    "resource_path",
    "retryable",
    "root_cause",
    "shutdown_response",
    "status_of",
    "unreachable",
]
