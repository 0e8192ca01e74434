"""What a bench costs in memory and accelerator: process RSS, and GPU memory/utilisation.

RSS comes from /proc (Linux; no psutil). GPU figures come from NVML through `pynvml`
(the `nvidia-ml-py` package) only when it is importable and a GPU answers; otherwise they
are reported as "not measured" with the reason, never as zeros — a zero would read as
"used no GPU memory", which is a claim nobody measured.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

NOT_MEASURED = "not measured"
_BYTES_PER_KIB = 1024


def _status_kib(field_name: str, status: Path = Path("/proc/self/status")) -> int | None:
    """A `VmXXX:  1234 kB` line of /proc/self/status in bytes; None where /proc is absent."""
    try:
        text = status.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{field_name}:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * _BYTES_PER_KIB
    return None


def rss_bytes() -> int | None:
    """This process's resident set size now; None where it cannot be read."""
    return _status_kib("VmRSS")


def peak_rss_bytes() -> int | None:
    """The high-water mark of this process's resident set since it started."""
    return _status_kib("VmHWM")


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int


class Nvml:
    """NVML when `pynvml` imports and reports at least one device; else `reason` says why."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self.reason = "pynvml (nvidia-ml-py) is not installed"
            return
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # NVMLError subclasses; no driver means no GPU here
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return
        if count == 0:
            self.reason = "NVML reports no GPU"
            nvml.nvmlShutdown()
            return
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def sample(self) -> list[GpuSample]:
        if self._nvml is None:
            return []
        nvml, samples = self._nvml, []
        for index, handle in enumerate(self._handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            name = nvml.nvmlDeviceGetName(handle)
            samples.append(
                GpuSample(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    utilization_percent=int(utilization.gpu),
                )
            )
        return samples

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None


@dataclass
class _Peaks:
    rss_samples: list[int] = field(default_factory=list)
    gpu_memory_peak: dict[int, int] = field(default_factory=dict)
    gpu_memory_total: dict[int, int] = field(default_factory=dict)
    gpu_names: dict[int, str] = field(default_factory=dict)
    gpu_utilization: dict[int, list[int]] = field(default_factory=dict)


class ResourceMonitor:
    """Samples RSS and (when present) GPUs every `interval_s` on a background thread.

    Use as a context manager around the measured phase; `summary()` is JSON-safe.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._nvml = Nvml()
        self._peaks = _Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="resource-monitor", daemon=True)
        self._started_rss: int | None = None
        self._started = 0.0
        self._elapsed = 0.0

    def __enter__(self) -> Self:
        self._started_rss = rss_bytes()
        self._started = time.perf_counter()
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self._elapsed = time.perf_counter() - self._started
        self._nvml.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        peaks = self._peaks
        rss = rss_bytes()
        if rss is not None:
            peaks.rss_samples.append(rss)
        for gpu in self._nvml.sample():
            peaks.gpu_names[gpu.index] = gpu.name
            peaks.gpu_memory_total[gpu.index] = gpu.memory_total_bytes
            peaks.gpu_memory_peak[gpu.index] = max(
                gpu.memory_used_bytes, peaks.gpu_memory_peak.get(gpu.index, 0)
            )
            peaks.gpu_utilization.setdefault(gpu.index, []).append(gpu.utilization_percent)

    def summary(self) -> dict[str, Any]:
        peaks = self._peaks
        rss: dict[str, Any] | str = NOT_MEASURED
        if peaks.rss_samples:
            rss = {
                "start_bytes": self._started_rss,
                "end_bytes": peaks.rss_samples[-1],
                "peak_sampled_bytes": max(peaks.rss_samples),
                "process_peak_bytes": peak_rss_bytes(),
                "samples": len(peaks.rss_samples),
            }
        gpu: list[dict[str, Any]] | str = NOT_MEASURED
        if peaks.gpu_memory_peak:
            gpu = [
                {
                    "index": index,
                    "name": peaks.gpu_names[index],
                    "memory_peak_bytes": peaks.gpu_memory_peak[index],
                    "memory_total_bytes": peaks.gpu_memory_total[index],
                    "utilization_mean_percent": sum(peaks.gpu_utilization[index])
                    / len(peaks.gpu_utilization[index]),
                }
                for index in sorted(peaks.gpu_memory_peak)
            ]
        return {
            "rss": rss,
            "gpu": gpu,
            "gpu_reason": None if gpu != NOT_MEASURED else self._nvml.reason,
            "interval_s": self.interval_s,
            "elapsed_s": self._elapsed,
        }


def cpu_busy_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """Core-seconds every CPU of the machine has spent busy since boot (all but idle and
    iowait): a local server's work counts as well as this process's. None off Linux."""
    try:
        fields = stat.read_text().splitlines()[0].split()[1:]
        ticks = [int(value) for value in fields]
    except (OSError, IndexError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ResourceMeter:
    """Resource-seconds spent over a window: GPU-seconds (each GPU NVML sees, held for
    the window's wall time) where NVML answers, else the machine's busy CPU core-seconds.
    `unit` says which ("gpu_s", "cpu_core_s"); `None` figures where neither is readable."""

    def __init__(self) -> None:
        nvml = Nvml()
        self.gpus = len(nvml.sample())
        nvml.close()
        self.unit = "gpu_s" if self.gpus else "cpu_core_s"

    def reading(self) -> float | None:
        if self.gpus:
            return time.perf_counter() * self.gpus
        return cpu_busy_seconds()

    def spent(self, since: float | None) -> float | None:
        now = self.reading()
        return None if since is None or now is None else max(now - since, 0.0)
