"""A rank's own CPU, memory and GPU reports, for ranks nobody samples from outside.

A local rank is sampled by its supervisor (psutil on its pid). A rank in a pod reports for
itself: a daemon thread sends a `metrics` control record every INTERVAL seconds on the
report channel (stdout, behind the marker), which the supervisor reads from the pod log.
GPU figures are whole-device (NVML utilisation and used memory of the devices the rank
owns): inside a container NVML reports host process ids, so per-process memory cannot be
matched to the rank.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from . import nvml, reporting

INTERVAL = 2.0


def visible_gpus(env: os._Environ | dict[str, str] = os.environ) -> list[int]:
    """The NVML indices of this rank's GPUs (CUDA_VISIBLE_DEVICES; UUIDs are not matched)."""
    value = env.get("CUDA_VISIBLE_DEVICES", "")
    return [int(part) for part in value.split(",") if part.strip().isdigit()]


class DeviceSampler:
    """Utilisation and used memory of whole GPUs; NVML opened lazily, never CUDA."""

    def __init__(self, indices: list[int]):
        self.indices = indices
        self._nvml: Any = None
        self._failed = not indices

    def _lib(self) -> Any:
        if self._nvml is None and not self._failed:
            try:
                self._nvml = nvml.open_nvml()
            except Exception:  # noqa: BLE001 - no driver: no GPU figures
                self._failed = True
        return self._nvml

    def sample(self) -> dict[str, Any]:
        nvml = self._lib()
        utils, memory = [], 0
        for index in self.indices if nvml is not None else []:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                utils.append(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory += nvml.nvmlDeviceGetMemoryInfo(handle).used
            except Exception:  # noqa: BLE001 - a device can vanish or deny; skip it
                continue
        return {
            "gpu_util": sum(utils) / len(utils) if utils else None,
            "gpu_memory_bytes": memory if utils else None,
        }


def sample_forever(processes: Any, devices: DeviceSampler, interval: float = INTERVAL) -> None:
    pid = os.getpid()
    processes.sample(pid, [])  # cpu_percent needs a first call to measure from
    while True:
        time.sleep(interval)
        metrics = processes.sample(pid, [])
        metrics.update(devices.sample())
        reporting.send({"type": "metrics", **metrics})


def start_reporting(interval: float = INTERVAL) -> threading.Thread:
    # Imported here, before the thread starts: a daemon thread still importing (psutil
    # imports subprocess) when a short rank's interpreter shuts down dies with a traceback
    # in the rank's output.
    from .samplers import RankSampler  # psutil over this process and its children

    processes, devices = RankSampler(), DeviceSampler(visible_gpus())
    thread = threading.Thread(
        target=sample_forever,
        args=(processes, devices, interval),
        name="mlcluster-metrics",
        daemon=True,
    )
    thread.start()
    return thread
