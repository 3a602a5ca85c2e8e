"""How much memory a block of a benchmark took (Linux /proc, no tracemalloc overhead); what it ran on is
`tlt.machine.describe_machine`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


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
