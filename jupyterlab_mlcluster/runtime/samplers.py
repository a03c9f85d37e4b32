"""CPU, memory and GPU samples of a process tree (psutil; NVML where a GPU exists): the
local supervisor's samples of its ranks, and a rank's of itself (runtime/metrics.py). In
runtime/ because code inside ranks uses it, and runtime/ imports nothing above it."""

from __future__ import annotations

from typing import Any

import psutil

from . import nvml


class GpuSampler:
    """NVML, opened lazily and only if the job holds GPUs. Never touches CUDA."""

    def __init__(self) -> None:
        self._nvml = None
        self._failed = False

    def _lib(self):
        if self._nvml is None and not self._failed:
            try:
                self._nvml = nvml.open_nvml()
            except Exception:  # noqa: BLE001 - no driver / no GPU: no GPU metrics
                self._failed = True
        return self._nvml

    def sample(self, gpus: list[int], pids: set[int]) -> dict[str, Any]:
        nvml = self._lib() if gpus else None
        if nvml is None:
            return {"gpu_util": None, "gpu_memory_bytes": None}
        utils, memory = [], 0
        for index in gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                utils.append(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid in pids and proc.usedGpuMemory:
                        memory += proc.usedGpuMemory
            except Exception:  # noqa: BLE001 - a device can vanish or deny; skip it
                continue
        return {
            "gpu_util": sum(utils) / len(utils) if utils else None,
            "gpu_memory_bytes": memory if utils else None,
        }

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._nvml = None


class RankSampler:
    """Keeps psutil.Process objects between samples (cpu_percent needs the previous one)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self.gpu = GpuSampler()

    def sample(self, pid: int, gpus: list[int]) -> dict[str, Any] | None:
        """CPU/memory/GPU of a rank and its children; None once the rank is exiting (a
        zombie reads as 0 bytes, which is not the rank's memory)."""
        try:
            root = psutil.Process(pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                return None
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        cpu, rss, pids = 0.0, 0, set()
        for proc in tree:
            cached = self._procs.setdefault(proc.pid, proc)
            try:
                with cached.oneshot():
                    cpu += cached.cpu_percent(None)
                    rss += cached.memory_info().rss
                pids.add(proc.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._procs.pop(proc.pid, None)
        metrics = {"cpu_percent": round(cpu, 1), "memory_bytes": rss}
        metrics.update(self.gpu.sample(gpus, pids))
        return metrics
