"""How the bench compiles a torch file with torch.compile (the Inductor runtime's options)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class InductorSettings(BaseModel):
    """What a PyTorch user sets for CPU inference with torch.compile; the defaults follow PyTorch's CPU guidance."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["default", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile's mode; max-autotune-no-cudagraphs also times alternative GEMM "
                               "kernels while compiling (longer compiles, sometimes faster files)")
    freezing: bool = Field(True, description="Inductor's freezing: weights folded as constants and convolutions "
                                             "pre-packed for oneDNN (without it, measured 2.3× slower on ResNet-18 "
                                             "at 64 px, AMX Xeon)")
    bf16: Literal["auto", "on", "off"] = Field(
        "auto", description="also measure each torch file compiled under bf16 autocast: auto where the CPU has "
                            "native bf16 (AVX-512 BF16 or AMX), on everywhere (emulated bf16 is slow), off never")

    def runner_options(self) -> dict:
        return {"mode": self.mode, "freezing": self.freezing, "bf16": self.bf16}
