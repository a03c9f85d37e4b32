"""The engine: the job model, its store, the one API of every front end (`JobService`), each
job's supervisor and lifecycle, sessions, the warm pool, experiments, forensics, and the
backend interface with its registry. Each subpackage is a room; none imports another in a
cycle (docs/ARCHITECTURE.md)."""
