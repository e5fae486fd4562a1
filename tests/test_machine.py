"""benchmarks/machine.py: the CPU description every side-by-side benchmark prints, read from
/proc/cpuinfo texts of the three CPUs docs/speed.md's tables come from. The expected peaks are
the published per-core rates worked out by hand (clock × cores × FLOP/cycle), not the module's."""

import pytest

from benchmarks import machine

# The first processor's block of /proc/cpuinfo, cut to the fields the module reads.
AMX_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
cpu MHz\t\t: 2699.998
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 \
amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
"""
EARLIER_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
cpu MHz\t\t: 2200.000
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_vnni
"""
ZEN4_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC
cpu MHz\t\t: 2596.140
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512_vnni avx512_bf16
"""


def test_amx_xeon_lists_its_matrix_units_and_peaks():
    cpu = machine.parse_cpuinfo(AMX_XEON)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert cpu.extensions == [
        "AVX2", "FMA", "AVX-512F", "AVX512-VNNI", "AVX512-BF16", "AVX512-FP16",
        "AMX", "AMX-BF16", "AMX-INT8",
    ]  # fmt: skip
    peak = machine.peaks(cpu, cores=2)
    # 2.699998 GHz × 2 cores × (2 FMA units × 16 lanes × 2) = 345.6 GFLOP/s float32
    assert peak["float32"].gflops == pytest.approx(345.6, rel=1e-4)
    # AMX: 1,024 bf16 FLOP a cycle a core -> 2.699998 × 2 × 1024 = 5,529.6 GFLOP/s
    assert peak["bfloat16"].gflops == pytest.approx(5529.6, rel=1e-4)
    assert "AMX-BF16 tiles" in peak["bfloat16"].how


def test_zen4_counts_avx512_at_its_256_bit_datapaths():
    cpu = machine.parse_cpuinfo(ZEN4_EPYC)
    assert cpu.is_zen4 and "AMX" not in cpu.extensions
    peak = machine.peaks(cpu, cores=2)
    # 2 FMA pipes × 8 float32 lanes (256 bits) × 2 = 32 FLOP a cycle a core; bf16 pairs: 64
    assert peak["float32"].gflops == pytest.approx(2.59614 * 2 * 32, rel=1e-6)
    assert peak["bfloat16"].gflops == pytest.approx(2.59614 * 2 * 64, rel=1e-6)


def test_a_cpu_without_bf16_units_runs_bfloat16_at_the_float32_rate():
    cpu = machine.parse_cpuinfo(EARLIER_XEON)
    peak = machine.peaks(cpu, cores=1, clock_ghz=3.0)
    assert peak["float32"].gflops == pytest.approx(192.0)  # 3.0 × 1 × 64
    assert peak["bfloat16"].gflops == pytest.approx(192.0)
    assert "--clock-ghz 3" in peak["float32"].how
    lines = machine.describe(cpu, 1, peak)
    assert lines[0].startswith("CPU: Intel(R) Xeon(R) CPU @ 2.20GHz (GenuineIntel family 6)")
    assert "lacks: AVX512-BF16, AVX512-FP16, AMX" in lines[1]


def test_peak_gflops_overrides_the_clock_and_scales_bfloat16():
    peak = machine.peaks(machine.parse_cpuinfo(ZEN4_EPYC), cores=2, peak_gflops=200.0)
    assert peak["float32"].gflops == 200.0
    assert peak["bfloat16"].gflops == 400.0
