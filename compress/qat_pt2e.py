"""Quantization-aware training with torchao's PT2E flow, ending in a symmetric-int8 Q/DQ graph.

The model is captured with ``torch.export`` (batch dimension dynamic, or the graph would
guard on the training batch size), annotated by the x86 quantizer with a symmetric int8
spec for activations (zero-point 0: the TensorRT layout) and per-channel symmetric int8
weights, fake-quantized while it trains, then converted to quantize/dequantize ops that the
dynamo ONNX exporter writes as QuantizeLinear/DequantizeLinear. The CPU flavour is derived
from that file afterwards (``qdq_rewrite``), so one training run serves both deployments.
"""
from __future__ import annotations

import torch
from torch import nn

QUANT_RANGE = (-127, 127)  # symmetric: -128 would need a zero-point TensorRT does not take


class QATUnavailable(RuntimeError):
    """torchao (the PT2E QAT engine) is not installed or cannot capture this model."""


def _quantizer():
    try:
        from torchao.quantization.pt2e import (FusedMovingAvgObsFakeQuantize, MovingAverageMinMaxObserver,
                                               MovingAveragePerChannelMinMaxObserver)
        from torchao.quantization.pt2e.quantizer import QuantizationSpec
        from torchao.quantization.pt2e.quantizer.utils import QuantizationConfig
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import X86InductorQuantizer
    except ImportError as exc:
        raise QATUnavailable(f"QAT needs torchao's PT2E flow (pip install 'torchao>=0.18'): {exc}") from exc
    lo, hi = QUANT_RANGE
    activation = QuantizationSpec(
        dtype=torch.int8, quant_min=lo, quant_max=hi, qscheme=torch.per_tensor_symmetric,
        observer_or_fake_quant_ctr=FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver,
                                                                          eps=2**-12))
    weight = QuantizationSpec(
        dtype=torch.int8, quant_min=lo, quant_max=hi, qscheme=torch.per_channel_symmetric, ch_axis=0,
        observer_or_fake_quant_ctr=FusedMovingAvgObsFakeQuantize.with_args(
            observer=MovingAveragePerChannelMinMaxObserver, eps=2**-12))
    return X86InductorQuantizer().set_global(QuantizationConfig(activation, activation, weight, None, True))


def batch_dim():
    return torch.export.Dim("batch", min=1, max=4096)


def prepare(model: nn.Module, sample: torch.Tensor) -> nn.Module:
    """A fake-quantized copy of ``model`` that trains with ``.train()`` / ``.eval()`` like any module."""
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    quantizer = _quantizer()
    model = model.eval().cpu().to(memory_format=torch.contiguous_format)
    try:
        captured = torch.export.export(model, (sample.float().cpu(),), dynamic_shapes=({0: batch_dim()},)).module()
        prepared = prepare_qat_pt2e(captured, quantizer)
    except Exception as exc:  # torch.export raises many types for untraceable models
        raise QATUnavailable(f"torch.export / prepare_qat_pt2e could not capture the model: {exc}") from exc
    return allow_exported_model_train_eval(prepared)


@torch.no_grad()
def observe(prepared: nn.Module, images: torch.Tensor, batch_size: int = 64) -> None:
    """Seed every fake-quantizer's range from the calibration images before training moves it."""
    prepared.eval()
    for start in range(0, len(images), batch_size):
        prepared(images[start:start + batch_size])


def freeze_ranges(prepared: nn.Module) -> None:
    """Stop range updates so the last epochs train against the scales that will ship."""
    from torchao.quantization.pt2e import disable_observer

    prepared.apply(disable_observer)


def convert(prepared: nn.Module) -> nn.Module:
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    prepared.eval()
    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    converted.training = False  # the flag the ONNX exporter checks; the graph itself was switched above
    return converted
