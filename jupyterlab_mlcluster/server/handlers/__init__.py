"""The REST handlers of `/mlcluster/api`, a module per resource: jobs (`/jobs`,
`/jobs/{id}`), job_outputs (a job's logs, metrics, result, TensorBoard), experiments (sweeps,
schedules), sessions, notebooks (notebook servers on Kubernetes), cluster (`/cluster`, the
document); base holds what every handler shares. server/app.py's `routes()` mounts them.
"""
