"""GPU telemetry while a benchmark runs, through NVML (`nvidia-ml-py`): utilization, SM and memory clocks, memory
used, power and throttle reasons, sampled on a thread. Without a GPU driver the report says so. What the report
keeps of it, a `TelemetrySummary`, is in `records.py`.

UNVERIFIED on a GPU: no NVIDIA GPU on the machines this project is tested on; the NVML calls are the documented
ones (`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetClockInfo`, `nvmlDeviceGetMemoryInfo`,
`nvmlDeviceGetPowerUsage`, `nvmlDeviceGetCurrentClocksThrottleReasons`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from trtflow.stages.trt.records import Spread, TelemetrySummary

# throttle reasons that mean the measurement is not the GPU's best (idle and application-clock settings are not)
THROTTLING = {0x2: "software power cap", 0x4: "hardware slowdown", 0x8: "sync boost", 0x20: "software thermal",
              0x40: "hardware thermal", 0x80: "hardware power brake"}


@dataclass(frozen=True)
class Sample:
    gpu_util: int  # %
    mem_util: int  # %
    sm_clock_mhz: int
    mem_clock_mhz: int
    mem_used_mb: float
    power_w: float
    throttle: int  # NVML's clocks-throttle-reason bits


SPREAD = ("gpu_util", "mem_util", "sm_clock_mhz", "mem_clock_mhz", "mem_used_mb", "power_w")  # summarised


class Telemetry:
    """`with Telemetry() as t: ...` then `t.summary()`."""

    def __init__(self, device: int = 0, interval_s: float = 0.1):
        self.device, self.interval = device, interval_s
        self.samples: list[Sample] = []
        self.unavailable: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None

    def __enter__(self) -> "Telemetry":
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device)
        except ImportError:
            self.unavailable = "nvidia-ml-py is not installed"
            return self
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission ...
            self.unavailable = f"no NVIDIA GPU telemetry on this machine ({type(exc).__name__})"
            return self
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        n, h = self._nvml, self._handle
        while not self._stop.is_set():
            try:
                util = n.nvmlDeviceGetUtilizationRates(h)
                self.samples.append(Sample(
                    gpu_util=util.gpu, mem_util=util.memory,
                    sm_clock_mhz=n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                    mem_clock_mhz=n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
                    mem_used_mb=n.nvmlDeviceGetMemoryInfo(h).used / 2**20,
                    power_w=n.nvmlDeviceGetPowerUsage(h) / 1000,
                    throttle=int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h))))
            except Exception:  # noqa: BLE001 - a query this GPU does not support: stop sampling, keep what we have
                return
            self._stop.wait(self.interval)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass

    def summary(self) -> TelemetrySummary:
        if self.unavailable:
            return TelemetrySummary(available=False, why=self.unavailable)
        if not self.samples:
            return TelemetrySummary(available=True, samples=0)
        out = TelemetrySummary(available=True, samples=len(self.samples))
        for key in SPREAD:
            values = [getattr(s, key) for s in self.samples]
            setattr(out, key, Spread(min=min(values), max=max(values), mean=sum(values) / len(values)))
        out.throttled = sorted({name for s in self.samples for bit, name in THROTTLING.items() if s.throttle & bit})
        return out
