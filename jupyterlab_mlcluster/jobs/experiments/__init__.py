"""Experiments on the one job model: sweeps (each trial a job) and scheduled trainings,
with their own tables in the job store's file."""
