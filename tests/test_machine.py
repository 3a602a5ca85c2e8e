"""`tlt.machine`: precision "auto" resolves per device and CPU."""

import pytest

from tlt import machine


def test_auto_precision_is_bf16_on_cuda_and_on_cpus_with_native_bf16(monkeypatch):
    assert machine.resolve_precision("32-true", "cuda") == "32-true"  # an explicit setting stays
    assert machine.resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"
    assert machine.resolve_precision("auto", "cuda") == "bf16-mixed"
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: False)
    assert machine.resolve_precision("auto", "cpu") == "32-true"  # emulated bf16 is ~40x slower
    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda: True)
    assert machine.resolve_precision("auto", "cpu") == "bf16-mixed"


@pytest.mark.parametrize(("flags", "native", "isa"), [("fpu avx2 fma", False, "AVX2"),
                                                      ("avx2 avx512f avx512_bf16", True, "AVX-512 BF16"),
                                                      ("avx2 avx512f", False, "AVX-512"),
                                                      ("avx512f amx_tile amx_bf16", True, "AMX"),
                                                      ("fp asimd", False, None)])  # fmt: skip
def test_native_bf16_and_the_vector_isa_read_the_cpu_flags(monkeypatch, tmp_path, flags, native, isa):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    real = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real(p))
    machine.cpu_flags.cache_clear()
    try:
        assert machine.cpu_has_native_bf16() is native
        assert machine.cpu_vector_isa() == isa
        assert machine.describe_machine()["cpu_isa"] == isa
    finally:
        machine.cpu_flags.cache_clear()
