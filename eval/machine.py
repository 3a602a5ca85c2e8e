"""What a benchmark ran on, and how much memory a block of it took (Linux /proc, no tracemalloc overhead)."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def cpu_model() -> str:
    """The first `model name` line of /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_machine() -> dict:
    """CPU, cores, load, library versions and torch threads, for the report header."""
    import transformers

    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def _status_kib(key: str) -> int | None:
    """A `VmRSS` / `VmHWM` line of /proc/self/status in KiB, None off Linux."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset VmHWM (peak RSS) to the current RSS: Linux >= 4.0, writing 5 to clear_refs."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


@dataclass
class PeakMemory:
    """Resident-memory growth over a `with` block.

    method "vmhwm": peak RSS during the block (VmHWM after resetting it at entry) minus RSS at entry;
    "rss_end": RSS at exit minus RSS at entry (misses transient peaks); "none": not on Linux.
    Memory the process already held (freed by earlier blocks, kept by the allocator) is reused without
    showing here, so in one long process this is a lower bound of the block's own footprint.
    """

    method: str = "none"
    start_mib: float = 0.0
    peak_mib: float = 0.0  # absolute peak RSS of the process during the block

    def __enter__(self) -> PeakMemory:
        rss = _status_kib("VmRSS")
        if rss is not None:
            self.method = "vmhwm" if _reset_peak() else "rss_end"
            self.start_mib = rss / 1024
        return self

    def __exit__(self, *exc) -> None:
        key = {"vmhwm": "VmHWM", "rss_end": "VmRSS"}.get(self.method)
        if key is not None:
            self.peak_mib = (_status_kib(key) or 0) / 1024

    @property
    def delta_mib(self) -> float:
        return max(0.0, self.peak_mib - self.start_mib)

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "delta_mib": self.delta_mib,
            "peak_rss_mib": self.peak_mib,
            "start_rss_mib": self.start_mib,
        }
