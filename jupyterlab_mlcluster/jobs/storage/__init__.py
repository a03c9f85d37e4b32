"""The job store: SQLite (WAL) rows of jobs and ranks, their schema and change feed, the
log files on disk, and what a failed write to the store's filesystem means."""
