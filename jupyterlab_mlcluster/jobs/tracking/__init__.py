"""Experiment trackers a job records into (`--track mlflow`): mlflow_run.py. A tracker runs
beside the job in its supervisor and never decides the job's fate."""
