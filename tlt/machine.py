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
def cpu_flags() -> frozenset[str]:
    """The first `flags` line of /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AMX or AVX-512 BF16). Without them torch emulates bf16
    matrix products: 40x slower than float32 on an AVX2 AMD EPYC (one thread)."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


# the widest vector extension a CPU has, widest first: the same model name ("AMD EPYC") comes with either
VECTOR_ISAS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpu_vector_isa() -> str | None:
    """The CPU's widest vector extension of VECTOR_ISAS, None if it has none of them (or is not x86)."""
    return next((name for flag, name in VECTOR_ISAS if flag in cpu_flags()), None)


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
        "cpu_isa": cpu_vector_isa(),
    }


def machine_name(machine: dict) -> str:
    """The machine as "AMD EPYC with AVX2, 2 cores" (or the GPU's name) from a `describe_machine()` dict. Dicts
    written before it recorded `cpu_isa` name AVX-512 BF16 where the CPU had native bf16, and no extension
    otherwise."""
    if machine.get("gpu"):
        return machine["gpu"]
    isa = machine.get("cpu_isa") or ("AVX-512 BF16" if machine.get("cpu_native_bf16") else None)
    with_isa = f" with {isa}" if isa else ""
    return f"{machine.get('cpu_model', '?')}{with_isa}, {machine.get('logical_cores', '?')} cores"
