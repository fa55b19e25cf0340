"""The machine as the figures depend on it: CPU, cores, instruction set, and what torch actually uses.

The CPU's flags say what the hardware can do; torch's own CPU capability and the oneDNN cap say what
the libraries use. They differ when a smaller CPU is emulated (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2`` on an AVX-512 machine), and then a latency or a precision choice made
here describes that smaller CPU, not this one: the doctor says so instead of leaving it to be found
in a report. The facts themselves come from the run fingerprint and ``train.hardware``, so the
doctor and the manifest cannot describe the same machine differently.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# torch's ATen CPU capabilities on x86, lowest first.
_TORCH_LEVELS = ("DEFAULT", "AVX2", "AVX512")
# oneDNN's ISA levels, lowest first (its ONEDNN_MAX_CPU_ISA values; train.hardware reads the cap itself).
_ONEDNN_LEVELS = ("sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni",
                  "avx512_core_bf16", "avx10_1_512", "avx10_1_512_amx", "avx10_1_512_amx_fp16")


def torch_level_of(flags: dict) -> str | None:
    """The ATen capability this CPU's flags allow (None off x86, where the names differ)."""
    if not flags or not (flags.get("avx") or flags.get("avx2") or flags.get("sse4_2")):
        return None
    if all(flags.get(name) for name in ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq")):
        return "AVX512"
    return "AVX2" if flags.get("avx2") else "DEFAULT"


def onednn_level_of(flags: dict) -> str:
    """The highest oneDNN ISA level this CPU's flags allow."""
    core = all(flags.get(name) for name in ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"))
    amx = flags.get("amx_tile") and (flags.get("amx_int8") or flags.get("amx_bf16"))
    for level, present in (("avx10_1_512_amx_fp16", flags.get("amx_fp16")),
                           ("avx10_1_512_amx", amx),
                           ("avx10_1_512", core and flags.get("avx512_fp16")),
                           ("avx512_core_bf16", core and flags.get("avx512_bf16")),
                           ("avx512_core_vnni", core and flags.get("avx512_vnni")),
                           ("avx512_core", core),
                           ("avx2_vnni", flags.get("avx2") and flags.get("avx_vnni")),
                           ("avx2", flags.get("avx2")),
                           ("avx", flags.get("avx"))):
        if present:
            return level
    return "sse41"


def _rank(levels: tuple[str, ...], level: str | None) -> int | None:
    return levels.index(level) if level in levels else None


def isa_limits(isa: dict, flags: dict) -> tuple[list[str], list[str]]:
    """(limits, notes): what the libraries are kept from using on this CPU, and caps set without effect."""
    limits, notes = [], []
    hardware, used = torch_level_of(flags), isa.get("torch_cpu_capability")
    env = isa.get("aten_cpu_capability_env")
    if _rank(_TORCH_LEVELS, used) is not None and _rank(_TORCH_LEVELS, hardware) is not None \
            and _rank(_TORCH_LEVELS, used) < _rank(_TORCH_LEVELS, hardware):
        limits.append(f"torch runs {used} kernels on a CPU whose flags allow {hardware}"
                      + (f" (ATEN_CPU_CAPABILITY={env})" if env else ""))
    elif env:
        notes.append(f"ATEN_CPU_CAPABILITY={env} is set but changes nothing here: torch uses {used}, "
                     f"what the CPU has")
    cap, own = isa.get("onednn_max_cpu_isa"), onednn_level_of(flags)
    if cap:
        if _rank(_ONEDNN_LEVELS, cap) is None:
            notes.append(f"ONEDNN_MAX_CPU_ISA={cap} is not a level oneDNN knows; it is ignored")
        elif _rank(_ONEDNN_LEVELS, cap) < _rank(_ONEDNN_LEVELS, own):
            limits.append(f"oneDNN is capped at {cap} (ONEDNN_MAX_CPU_ISA) below the CPU's {own}")
        else:
            notes.append(f"ONEDNN_MAX_CPU_ISA={cap} is set but changes nothing here: the CPU's own level is {own}")
    return limits, notes


def int8_dot_native(isa: dict) -> bool:
    """Whether INT8 dot products are one fused instruction here (VNNI or AMX), by train.hardware's naming."""
    return isa.get("int8_dot_product") in ("AMX-INT8", "AVX-512 VNNI", "AVX-VNNI")


def machine_facts() -> dict:
    """The machine section of the doctor's report (plain JSON values)."""
    import torch

    from compress.pipeline.fingerprint import environment
    from train.hardware import cpu_flags, native_types

    env = environment()
    isa, flags = env["isa"], cpu_flags()
    native = native_types(torch.device("cpu"))
    limits, notes = isa_limits(isa, flags)
    logger.info("machine: %s, %s", env["cpu"], env["isa_summary"])
    return {
        "cpu": env["cpu"], "machine": env["machine"], "platform": env["platform"], "python": env["python"],
        "physical_cores": isa.get("physical_cores"), "logical_cores": isa.get("logical_cores"),
        "isa_summary": env["isa_summary"], "isa": isa,
        "cpu_flags_level": torch_level_of(flags), "onednn_cpu_level": onednn_level_of(flags),
        "torch_cpu_capability": isa.get("torch_cpu_capability"),
        "isa_limited": bool(limits), "isa_limits": limits, "isa_notes": notes,
        "native_bf16": native.bf16, "native_fp16": native.fp16, "native_why": native.why,
        "int8_dot_product": isa.get("int8_dot_product"), "int8_dot_product_native": int8_dot_native(isa),
        "torch_threads": env["torch_threads"], "cuda_build": env["cuda"], "gpu": env["gpu"],
        "packages": env["packages"],
    }
