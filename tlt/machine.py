"""What a benchmark or a comparison ran on: CPU, cores, load, library versions, torch threads."""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

import torch


def cpu_model() -> str:
    """The first `model name` line of /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AMX or AVX-512 BF16, from /proc/cpuinfo's flags). Without
    them torch emulates bf16 matrix products: 40x slower than float32 on an AVX2 AMD EPYC (one thread)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return bool({"amx_bf16", "avx512_bf16"} & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return False


def resolve_precision(precision: str, device_type: str) -> str:
    """A precision setting as run on `device_type` ("cpu" or "cuda"): "auto" is bf16-mixed on CUDA and on CPUs
    with native bf16, else 32-true; the others are returned as they are."""
    if precision != "auto":
        return precision
    return "bf16-mixed" if device_type == "cuda" or cpu_has_native_bf16() else "32-true"


def describe_machine() -> dict:
    """CPU, cores, load, library versions, torch threads and the GPU (None without CUDA), for report headers."""
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
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu_native_bf16": cpu_has_native_bf16(),
    }
