"""Who is being measured: NVML for NVIDIA GPUs, the OS for CPUs, platform for Apple MPS.

The identity is matched to a hardware_db entry by the same name lookup the CLI
uses (NVML names are aliases there), so a profile knows its datasheet.
"""

from __future__ import annotations

import os
import platform
import sys

from estimator.efficiency.calibration_profile import DeviceIdentity
from estimator.errors import UnknownNameError
from estimator.specs.database import Database


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), or platform's description."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _total_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def _nvml_details(index: int) -> dict:
    """Clocks, bus width, power limit and driver from NVML; empty when NVML is unavailable."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "not installed (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        details = {
            "nvml_name": pynvml.nvmlDeviceGetName(handle),
            "memory_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "power_limit_w": pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
        }
        try:
            details["bus_width_bits"] = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        except (pynvml.NVMLError, AttributeError):
            pass
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in details.items()}
    except Exception as exc:  # NVML errors vary by driver; identity must never stop a calibration
        return {"nvml": f"unavailable: {exc}"}


def identify(torch, device: str, db: Database) -> DeviceIdentity:
    """Identify the device and match it to the hardware database where possible."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        details = {"sm_count": props.multi_processor_count, "compute_capability": f"{props.major}.{props.minor}",
                   "device_count": torch.cuda.device_count(), **_nvml_details(0)}
        name, memory = details.get("nvml_name") or props.name, float(props.total_memory)
    elif device == "mps":
        name, memory = f"Apple {platform.machine()} GPU ({platform.platform()})", _total_memory_bytes()
        details = {}
    else:
        name, memory = cpu_name(), _total_memory_bytes()
        details = {"logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    try:
        matched = db.hardware.get(name).name
    except UnknownNameError:
        matched = None
    return DeviceIdentity(kind=device, name=name, matched_hardware=matched, memory_bytes=memory, details=details)


def software(torch) -> dict[str, str]:
    import numpy
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
                "platform": platform.platform()}
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
        versions["cudnn"] = str(torch.backends.cudnn.version())
    return versions
