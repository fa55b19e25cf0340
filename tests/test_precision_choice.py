"""amp: auto follows what the hardware computes natively; a forced emulated precision warns.

The detection is replaced at its one function (``train.precision.native_types``) so every
machine plays every other: native bf16 or not, CPU or CUDA, auto or forced.
"""
from __future__ import annotations

import pytest
import torch

from train import precision as precision_module
from train.hardware import NativeTypes, isa_differences, isa_facts, isa_words
from train.precision import choose_amp, make_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
AVX512_BF16 = NativeTypes(bf16=True, fp16=False, why="AVX-512 (VNNI, BF16), torch AVX512")
AVX2_ONLY = NativeTypes(bf16=False, fp16=False, why="AVX2 only, torch AVX2")
AMPERE = NativeTypes(bf16=True, fp16=True, why="CUDA compute capability 8.0")
TURING = NativeTypes(bf16=False, fp16=True, why="CUDA compute capability 7.5, bf16 not supported")


@pytest.fixture
def machine(monkeypatch):
    def play(native: NativeTypes) -> None:
        monkeypatch.setattr(precision_module, "native_types", lambda device: native)
    return play


@pytest.mark.parametrize("device, native, mode, name, emulated", [
    (CPU, AVX512_BF16, "auto", "bf16", False),
    (CPU, AVX2_ONLY, "auto", "fp32", False),
    (CPU, AVX512_BF16, "bf16", "bf16", False),
    (CPU, AVX2_ONLY, "bf16", "bf16", True),
    (CPU, AVX512_BF16, "fp16", "fp16", True),
    (CPU, AVX2_ONLY, "off", "fp32", False),
    (CPU, AVX512_BF16, "off", "fp32", False),
    (CUDA, AMPERE, "auto", "bf16", False),
    (CUDA, TURING, "auto", "fp16", False),
    (CUDA, AMPERE, "bf16", "bf16", False),
    (CUDA, TURING, "bf16", "bf16", True),
    (CUDA, TURING, "fp16", "fp16", False),
    (CUDA, AMPERE, "off", "fp32", False),
])
def test_the_precision_follows_the_hardware(machine, device, native, mode, name, emulated):
    machine(native)
    choice = choose_amp(mode, device)
    assert choice.name == name
    assert (choice.warning is not None) == emulated
    assert choice.reason.startswith(f"amp: {mode}")
    if mode != "off":
        assert native.why in choice.reason  # the log line and the metrics say which hardware decided


def test_auto_on_a_cpu_without_native_bf16_says_why_it_stays_fp32(machine):
    machine(AVX2_ONLY)
    choice = choose_amp("auto", CPU)
    assert "emulated" in choice.reason and "AVX2 only" in choice.reason


def test_forced_bf16_on_an_emulating_cpu_runs_and_warns_with_the_cost(machine):
    machine(AVX2_ONLY)
    precision = make_precision("bf16", CPU)
    assert "10× slower" in precision.warning and "amp: auto" in precision.warning
    with precision.autocast():  # it still runs in bf16: the user asked for it
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16


def test_only_fp16_gets_the_loss_scaler(machine):
    machine(TURING)
    assert make_precision("fp16", CPU).uses_scaler
    assert not make_precision("bf16", CPU).uses_scaler and not make_precision("off", CPU).uses_scaler


def test_the_fingerprint_names_the_instruction_set_and_the_caps(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)  # this test sets the cap itself
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    facts = isa_facts()
    for key in ("avx2", "avx512_f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx_vnni", "torch_cpu_capability",
                "physical_cores", "int8_dot_product", "native_bf16"):
        assert key in facts
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = isa_facts()
    assert capped["native_bf16"] is False and capped["onednn_max_cpu_isa"] == "avx2"
    assert "emulating a smaller CPU: ONEDNN_MAX_CPU_ISA=avx2" in isa_words(capped)
    assert any(d.startswith("onednn_max_cpu_isa") for d in isa_differences(facts, capped))
    assert isa_differences(facts, facts) == []
