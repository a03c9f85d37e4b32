"""Every route the extension serves: its handlers by resource, each naming its OpenAPI path,
and the tornado pattern of a path."""

from __future__ import annotations

from .events import EventsHandler
from .handlers import cluster, experiments, job_export, job_outputs, jobs, notebooks, sessions
from .handlers.base import MLClusterHandler
from .openapi import API_PREFIX


def route_pattern(api_path: str) -> str:
    """'/jobs/{id}/logs' -> '/mlcluster/api/jobs/([^/]+)/logs' (tornado passes groups in order)."""
    parts = [("([^/]+)" if p.startswith("{") else p) for p in api_path.split("/")]
    return API_PREFIX + "/".join(parts)


# Every route the extension serves, by resource (each handler names its OpenAPI path).
ROUTE_HANDLERS: list[type[MLClusterHandler]] = [
    # jobs
    jobs.JobsHandler,  # /jobs
    jobs.JobHandler,  # /jobs/{id}
    job_outputs.LogsHandler,  # /jobs/{id}/logs
    job_outputs.MetricsHandler,  # /jobs/{id}/metrics
    job_outputs.StacksHandler,  # /jobs/{id}/stacks
    job_outputs.TensorBoardHandler,  # /jobs/{id}/tensorboard
    job_outputs.ResultHandler,  # /jobs/{id}/result
    job_export.JobExportHandler,  # /jobs/{id}/export
    # sweeps and schedules
    experiments.SweepsHandler,  # /sweeps
    experiments.SweepHandler,  # /sweeps/{id}
    experiments.SchedulesHandler,  # /schedules
    experiments.ScheduleHandler,  # /schedules/{name}
    experiments.SchedulePauseHandler,  # /schedules/{name}/pause
    experiments.ScheduleResumeHandler,  # /schedules/{name}/resume
    experiments.ScheduleRunsHandler,  # /schedules/{name}/runs
    # sessions
    sessions.SessionsHandler,  # /sessions
    sessions.SessionHandler,  # /sessions/{name}
    sessions.SessionRestartHandler,  # /sessions/{name}/restart
    # notebook servers (Kubernetes)
    notebooks.NotebooksHandler,  # /notebooks
    notebooks.NotebookHandler,  # /notebooks/{name}
    notebooks.NotebookStopHandler,  # /notebooks/{name}/stop
    notebooks.NotebookStartHandler,  # /notebooks/{name}/start
    # the server itself
    cluster.ClusterHandler,  # /cluster
    cluster.OpenAPIHandler,  # /openapi.json
]


def routes() -> list[tuple[str, type]]:
    """(OpenAPI path, handler) of every route the extension serves."""
    return [(h.api_path, h) for h in ROUTE_HANDLERS] + [("/events", EventsHandler)]
