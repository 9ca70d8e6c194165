"""NVML readings: clocks and throttle reasons around each shape, the energy counter, static facts.

nvidia-ml-py (`pynvml`) is optional: without it, or on a CPU, `GpuMonitor.open`
returns None and rows carry no throttle flags or energy. NVML handles are found
through the device UUID, which is used for the lookup only and never stored.
"""
from __future__ import annotations

import importlib.util
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
