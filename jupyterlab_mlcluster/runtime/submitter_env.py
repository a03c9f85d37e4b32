"""What of the submitting process's environment a job's ranks inherit, on every backend: all of
it but the variables of a launcher or a kernel that would lie in a rank."""

from __future__ import annotations

# Variables of the submitting process that must not leak into ranks: ipykernel's inline
# matplotlib backend has no frontend in a rank, and stale launcher variables would lie.
_DROP_ENV_PREFIXES = ("MLCLUSTER_", "TORCHELASTIC_", "PET_", "JPY_")
_DROP_ENV = {
    "MPLBACKEND",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "GROUP_RANK",
}
# Kept on purpose (they describe the user's environment, not a launcher).
_KEEP_ENV = {
    "MLCLUSTER_STORE_DIR",
    "MLCLUSTER_BACKEND",
    "MLCLUSTER_CPU_SLOTS",
    "MLCLUSTER_GPUS",
    "MLCLUSTER_WARM_POOL",
}


def base_environment(submitter_env: dict[str, str]) -> dict[str, str]:
    """The submitter's variables a rank starts from (before the job's `env` and the rank table)."""
    env = {}
    for key, value in submitter_env.items():
        if key in _DROP_ENV or (key.startswith(_DROP_ENV_PREFIXES) and key not in _KEEP_ENV):
            continue
        env[key] = value
    return env
