"""The machine a benchmark runs on, printed at the top of every side-by-side benchmark so that a
ratio names its CPU: the model, the vector and matrix extensions that decide which kernels XLA
and PyTorch can use, the cores in use, and their peak FLOP/s for float32 and bfloat16 (clock ×
cores × FLOP per cycle per core), read from /proc/cpuinfo.

FLOP per cycle per core is two FMA pipes × the lanes of the widest datapath × 2 (multiply and
add), except where the datapath is narrower than the instruction: Zen 4 (AMD family 25 with
AVX-512) runs a 512-bit instruction as two 256-bit halves, so AVX-512 gives it 32 float32 FLOP a
cycle, not 64. bfloat16: AMX tiles give 1,024 FLOP a cycle a core (Intel's figure for Sapphire
Rapids' TMUL), AVX512-BF16's dot product (`vdpbf16ps`) twice the float32 rate; without either
bfloat16 is converted to float32 and runs at the float32 rate. The clock is the one
/proc/cpuinfo reports (under a hypervisor often the base clock, not the boost): a matmul that
beats the peak says so, and `--clock-ghz` or `--peak-gflops` corrects it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

# /proc/cpuinfo flag -> the name benchmarks print, in the order they are printed.
EXTENSIONS = (
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512F"),
    ("avx512_vnni", "AVX512-VNNI"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512_fp16", "AVX512-FP16"),
    ("amx_tile", "AMX"),
    ("amx_bf16", "AMX-BF16"),
    ("amx_int8", "AMX-INT8"),
    ("amx_fp16", "AMX-FP16"),
)
AMX_BF16_FLOP_PER_CYCLE = 1024


@dataclasses.dataclass(frozen=True)
class Cpu:
    """One CPU as /proc/cpuinfo describes its first processor."""

    model: str
    vendor: str
    family: int | None
    flags: frozenset[str]
    mhz: float | None

    @property
    def extensions(self) -> list[str]:
        return [name for flag, name in EXTENSIONS if flag in self.flags]

    @property
    def is_zen4(self) -> bool:
        return self.vendor == "AuthenticAMD" and self.family == 25 and "avx512f" in self.flags


@dataclasses.dataclass(frozen=True)
class Peak:
    """Peak GFLOP/s of the cores in use for one dtype, and how it was computed."""

    gflops: float
    how: str


def parse_cpuinfo(text: str) -> Cpu:
    """The first processor's model name, vendor, family, flags and clock in `text`."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    family = fields.get("cpu family", "")
    mhz = fields.get("cpu MHz", "")
    return Cpu(
        model=fields.get("model name") or platform.processor() or platform.machine(),
        vendor=fields.get("vendor_id", "?"),
        family=int(family) if family.isdigit() else None,
        flags=frozenset(fields.get("flags", "").split()),
        mhz=float(mhz) if mhz.replace(".", "", 1).isdigit() else None,
    )


def this_cpu() -> Cpu:
    path = Path("/proc/cpuinfo")
    return parse_cpuinfo(path.read_text() if path.exists() else "")


def float32_flop_per_cycle(cpu: Cpu) -> tuple[int, str]:
    """float32 FLOP per cycle per core of the widest vector unit, and its name."""
    if "avx512f" in cpu.flags:
        if cpu.is_zen4:
            return 32, "AVX-512 on 256-bit datapaths (Zen 4)"
        return 64, "AVX-512, 2 FMA units"
    if "fma" in cpu.flags:
        return 32, "AVX2+FMA"
    if "avx" in cpu.flags:
        return 16, "AVX"
    return 8, "SSE2"


def bfloat16_flop_per_cycle(cpu: Cpu) -> tuple[int, str]:
    """bfloat16 matmul FLOP per cycle per core, and the unit that gives it."""
    if "amx_bf16" in cpu.flags:
        return AMX_BF16_FLOP_PER_CYCLE, "AMX-BF16 tiles"
    fp32, _ = float32_flop_per_cycle(cpu)
    if "avx512_bf16" in cpu.flags:
        return 2 * fp32, "AVX512-BF16 dot products"
    return fp32, "converted to float32"


def peaks(
    cpu: Cpu, cores: int, clock_ghz: float | None = None, peak_gflops: float | None = None
) -> dict[str, Peak]:
    """{"float32": Peak, "bfloat16": Peak} of `cores` cores; `peak_gflops` (float32) overrides
    the clock and scales the bfloat16 peak by the same per-cycle ratio."""
    fp32, fp32_unit = float32_flop_per_cycle(cpu)
    bf16, bf16_unit = bfloat16_flop_per_cycle(cpu)
    if peak_gflops:
        return {
            "float32": Peak(peak_gflops, f"--peak-gflops {peak_gflops:g}"),
            "bfloat16": Peak(peak_gflops * bf16 / fp32, f"--peak-gflops × {bf16 / fp32:g}"),
        }
    source = f"--clock-ghz {clock_ghz:g}" if clock_ghz else "/proc/cpuinfo cpu MHz"
    if clock_ghz is None:
        clock_ghz = cpu.mhz / 1000 if cpu.mhz else 3.0
        source = source if cpu.mhz else "a guessed 3.0 GHz"
    return {
        dtype: Peak(
            clock_ghz * cores * per_cycle,
            f"{clock_ghz:.3g} GHz ({source}) × {cores} cores × {per_cycle} FLOP/cycle ({unit})",
        )
        for dtype, per_cycle, unit in (
            ("float32", fp32, fp32_unit),
            ("bfloat16", bf16, bf16_unit),
        )
    }


def describe(cpu: Cpu, cores: int, peak_by_dtype: dict[str, Peak]) -> list[str]:
    """The lines a benchmark prints first: the CPU, its extensions, the cores used, the peaks."""
    missing = [name for flag, name in EXTENSIONS if flag not in cpu.flags]
    family = f" family {cpu.family}" if cpu.family is not None else ""
    return [
        f"CPU: {cpu.model} ({cpu.vendor}{family}); {cores} of {os.cpu_count()} cores in use",
        f"  has: {', '.join(cpu.extensions) or 'none of the listed'}; "
        f"lacks: {', '.join(missing) or 'none'}",
        *(
            f"  peak {dtype}: {peak.gflops:.1f} GFLOP/s = {peak.how}"
            for dtype, peak in peak_by_dtype.items()
        ),
    ]
