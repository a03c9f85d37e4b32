"""NVML for the GPU samplers: pynvml, or (a test seam) a file of utilisation figures.

`MLCLUSTER_TEST_NVML_FILE=/path/gpus.json` makes every GPU sampler started with it in its
environment (a local job's supervisor, a pod's rank) read whole-device utilisation from
that file instead of the driver: a JSON object `{"0": 3, "1": 97}` of device index ->
utilisation percent, read again on every sample so a test can change it while a job runs.
It exists so the idle-GPU flag can be tested with real ranks on a machine without GPUs
(the pool's GPUs then come from `MLClusterConfig.gpus = "0,1"`); it reports figures, it
grants nothing, and a user who sets it only misreports their own job.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

TEST_FILE_ENV = "MLCLUSTER_TEST_NVML_FILE"
MAX_FILE_BYTES = 64 * 1024


class FileNvml:
    """The few pynvml calls the samplers make, answered from the test file."""

    def __init__(self, path: str):
        self.path = path

    def _figures(self) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            figures = json.loads(f.read(MAX_FILE_BYTES))
        if not isinstance(figures, dict):
            raise TypeError(f"{self.path}: not a JSON object of index -> utilisation")
        return figures

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        value = self._figures()[str(handle)]  # KeyError: no such device, as NVML would fail
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{self.path}: utilisation of GPU {handle} is not a number")
        return SimpleNamespace(gpu=value, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self.nvmlDeviceGetUtilizationRates(handle)
        return SimpleNamespace(used=0, total=0, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self.nvmlDeviceGetUtilizationRates(handle)
        return []

    def nvmlShutdown(self) -> None:
        pass


def open_nvml() -> Any:
    """An initialised NVML (the module, or the test file's stand-in); raises without one."""
    path = os.environ.get(TEST_FILE_ENV)
    if path:
        return FileNvml(path)
    import pynvml

    pynvml.nvmlInit()
    return pynvml
