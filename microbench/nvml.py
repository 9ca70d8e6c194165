"""NVML readings: clocks and throttle reasons around each shape, the energy counter, static facts.

nvidia-ml-py (`pynvml`) is optional: without it, or on a CPU, `GpuMonitor.open`
returns None and rows carry no throttle flags or energy. NVML handles are found
through the device UUID, which is used for the lookup only and never stored.
"""
from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass

# Throttle ("clocks event") reasons that mean the clock was held down by power
# or heat; idle, application-clock and sync-boost reasons are not throttling.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THROTTLE_MASK = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


@dataclass(frozen=True)
class ClockReading:
    sm_mhz: int
    mem_mhz: int
    reasons: int

    @property
    def throttled(self) -> bool:
        return bool(self.reasons & THROTTLE_MASK)


class GpuMonitor:
    """One GPU through NVML."""

    def __init__(self, nvml, handle):
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, device) -> "GpuMonitor | None":
        """Monitor for a torch CUDA device, or None (CPU, or nvidia-ml-py missing)."""
        if device.type != "cuda" or importlib.util.find_spec("pynvml") is None:
            return None
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return cls(pynvml, handle)

    def clocks(self) -> ClockReading:
        n, h = self._nvml, self._handle
        reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return ClockReading(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                            n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM), int(reasons_fn(h)))

    def energy_mj(self) -> int:
        """Total energy since the driver loaded, millijoules (Volta and newer)."""
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def power_w(self) -> float:
        """Board power draw, watts, as NVML reports it (on Hopper and newer a 1 s moving average)."""
        return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def has_nvlink(self) -> bool:
        """True when NVLink 0 of this GPU is up (then NCCL talks over NVLink)."""
        try:
            return self._nvml.nvmlDeviceGetNvLinkState(self._handle, 0) == self._nvml.NVML_FEATURE_ENABLED
        except self._nvml.NVMLError:
            return False

    def facts(self) -> dict:
        """Static facts for the environment: no UUID or serial, only what identifies the SKU and its settings."""
        n, h = self._nvml, self._handle

        def read(fn, *args):
            try:
                return fn(h, *args)
            except n.NVMLError as e:
                return f"unavailable: {e}"

        pci = read(n.nvmlDeviceGetPciInfo)
        ecc = read(n.nvmlDeviceGetEccMode)
        power = read(n.nvmlDeviceGetEnforcedPowerLimit)
        return {
            "pci_device_id": f"0x{pci.pciDeviceId:08x}" if hasattr(pci, "pciDeviceId") else pci,
            "pci_subsystem_id": f"0x{pci.pciSubSystemId:08x}" if hasattr(pci, "pciSubSystemId") else pci,
            "driver": n.nvmlSystemGetDriverVersion(),
            "power_limit_w": power / 1000 if isinstance(power, int) else power,
            "ecc_enabled": bool(ecc[0]) if isinstance(ecc, (list, tuple)) else ecc,
            "max_sm_clock_mhz": read(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_SM),
            "max_mem_clock_mhz": read(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_MEM),
            "app_sm_clock_mhz": read(n.nvmlDeviceGetApplicationsClock, n.NVML_CLOCK_SM),
            "persistence_mode": read(n.nvmlDeviceGetPersistenceMode),
        }


class PowerMeter:
    """Energy and power of the GPU over a window (one serving workload): joules from NVML's energy counter
    at the window's ends, mean power from them, peak power as the highest of the power readings a
    background thread takes every `interval_s`.

    monitor: anything with energy_mj() and power_w() (a GpuMonitor).
    """

    def __init__(self, monitor, interval_s: float = 0.1):
        self.monitor, self.interval_s = monitor, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[float] = []

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append(self.monitor.power_w())

    def __enter__(self) -> "PowerMeter":
        self._samples = [self.monitor.power_w()]
        self._stop.clear()
        self._e0, self._t0 = self.monitor.energy_mj(), time.perf_counter()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._e1, self._t1 = self.monitor.energy_mj(), time.perf_counter()
        self._stop.set()
        self._thread.join()

    def reading(self) -> dict:
        """energy_j, duration_s, mean_power_w, peak_power_w, power_samples of the last window."""
        seconds = self._t1 - self._t0
        joules = (self._e1 - self._e0) / 1e3
        return {"energy_j": joules, "duration_s": seconds,
                "mean_power_w": joules / seconds if seconds > 0 else float("nan"),
                "peak_power_w": max(self._samples), "power_samples": len(self._samples)}
