"""What this machine's CPU executes natively, as the numbers of a run depend on it.

Machines that look alike ("AMD EPYC", 2 cores) differ in instruction set: with AVX-512 BF16
a bf16 autocast step is 1.5-2× faster than fp32, on AVX2 alone it is emulated and about 10×
slower; with VNNI onnxruntime's int8 convolutions use one fused dot-product instruction, without
it a slower pair that can saturate. Everything that chooses a precision or explains a figure
asks this module, so the choice and the explanation cannot disagree.

Emulating a smaller CPU (``ONEDNN_MAX_CPU_ISA=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``) caps what
the libraries use without changing what the CPU reports, so both caps are read here too.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache

import torch

# oneDNN's ISA levels in increasing order (its ONEDNN_MAX_CPU_ISA values, aliases folded in).
_ONEDNN_LEVELS = ("sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni",
                  "avx512_core_bf16", "avx10_1_512", "avx10_1_512_amx", "avx10_1_512_amx_fp16")
_ONEDNN_ALIASES = {"avx512_core_fp16": "avx10_1_512", "avx512_core_amx": "avx10_1_512_amx",
                   "avx512_core_amx_fp16": "avx10_1_512_amx_fp16"}

# The instruction-set facts a figure of this project can depend on, by torch's cpuinfo names.
ISA_FLAGS = ("avx2", "avx512_f", "avx512_bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
             "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


@lru_cache(maxsize=1)
def cpu_flags() -> dict:
    """torch's cpuinfo reading of the CPU (what the hardware has, whatever the caps say)."""
    reader = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    return dict(reader()) if reader else {}


def _onednn_cap() -> str | None:
    raw = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().lower()
    if not raw or raw in ("all", "default"):
        return None
    return _ONEDNN_ALIASES.get(raw, raw)


def _onednn_allows(level: str) -> bool:
    cap = _onednn_cap()
    if cap is None or cap not in _ONEDNN_LEVELS:
        return True
    return _ONEDNN_LEVELS.index(cap) >= _ONEDNN_LEVELS.index(level)


def _aten_avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")


@dataclass(frozen=True)
class NativeTypes:
    """Which reduced-precision float types ``device`` computes natively, and in words why."""
    bf16: bool
    fp16: bool
    why: str


def native_types(device: torch.device) -> NativeTypes:
    """The one detection point for precision choices (tests replace it to play other machines)."""
    if device.type == "cuda":
        bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))  # emulated bf16 (pre-Ampere) is slow
        major, minor = torch.cuda.get_device_capability(device)
        return NativeTypes(bf16=bf16, fp16=True, why=f"CUDA compute capability {major}.{minor}"
                           + ("" if bf16 else ", bf16 not supported"))
    if device.type != "cpu":
        return NativeTypes(bf16=False, fp16=False, why=f"{device.type}: no native-precision facts known")
    bf16, fp16 = _cpu_native(cpu_flags())
    return NativeTypes(bf16=bf16, fp16=fp16, why=isa_words(isa_facts()))


def _cpu_native(flags: dict) -> tuple[bool, bool]:
    """(bf16, fp16) computed natively: the CPU has the instructions and no cap hides them."""
    aten = _aten_avx512()
    bf16 = bool(flags.get("avx512_bf16") or flags.get("amx_bf16")) and _onednn_allows("avx512_core_bf16") and aten
    fp16 = bool(flags.get("avx512_fp16") or flags.get("amx_fp16")) and _onednn_allows("avx10_1_512") and aten
    return bf16, fp16


def isa_facts() -> dict:
    """The instruction-set part of the environment fingerprint (manifest and every report)."""
    flags = cpu_flags()
    facts = {name: bool(flags.get(name, False)) for name in ISA_FLAGS}
    facts.update({
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_cpu_isa": _onednn_cap(),
        "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY") or None,
        "physical_cores": flags.get("num_physical_cores"),
        "logical_cores": flags.get("num_logical_cores") or os.cpu_count(),
    })
    facts["native_bf16"] = _cpu_native(flags)[0]
    facts["int8_dot_product"] = int8_dot_product(facts)
    return facts


def int8_dot_product(facts: dict) -> str:
    """The x86 instruction onnxruntime's u8s8 kernels multiply with: VNNI's fused vpdpbusd where
    present, else vpmaddubsw + vpmaddwd (slower, and its 16-bit pair sums can saturate)."""
    if facts.get("amx_int8"):
        return "AMX-INT8"
    if facts.get("avx512_vnni"):
        return "AVX-512 VNNI"
    if facts.get("avx_vnni"):
        return "AVX-VNNI"
    if facts.get("avx512_bw"):
        return "AVX-512BW (no VNNI)"
    if facts.get("avx2"):
        return "AVX2 (no VNNI)"
    return "none"


def isa_words(facts: dict) -> str:
    """One line a reader can compare between machines, e.g. 'AVX-512 (VNNI, BF16), torch AVX512'."""
    if not facts:
        return "instruction set not recorded"
    if facts.get("avx512_f"):
        extras = [name for key, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"), ("avx512_fp16", "FP16"),
                                         ("amx_tile", "AMX")) if facts.get(key)]
        base = "AVX-512" + (f" ({', '.join(extras)})" if extras else "")
    elif facts.get("avx2"):
        base = "AVX2" + (" (AVX-VNNI)" if facts.get("avx_vnni") else " only")
    else:
        base = "no AVX2"
    caps = [f"{env}={value}" for env, value in (("ONEDNN_MAX_CPU_ISA", facts.get("onednn_max_cpu_isa")),
                                                ("ATEN_CPU_CAPABILITY", facts.get("aten_cpu_capability_env"))) if value]
    line = f"{base}, torch {facts.get('torch_cpu_capability', '?')}"
    return line + (f", emulating a smaller CPU: {' '.join(caps)}" if caps else "")


# The facts two machines must share for a latency figure or a precision choice to carry over.
COMPARED = ("avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "torch_cpu_capability",
            "onednn_max_cpu_isa")


def isa_differences(recorded: dict, here: dict) -> list[str]:
    """What differs between a saved fingerprint's instruction set and this machine's (empty: same)."""
    return [f"{key}: {recorded.get(key)} there, {here.get(key)} here" for key in COMPARED
            if recorded.get(key) != here.get(key)]


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else what the platform module knows)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_words() -> str:
    """The machine a benchmark's figures name: CPU, the cores this process may use, and the instruction set."""
    return f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores; {isa_words(isa_facts())}"
