"""Quantization-aware training with torchao's PT2E flow, ending in a symmetric-int8 Q/DQ graph.

The model is captured with ``torch.export`` (batch dimension dynamic, or the graph would
guard on the training batch size), annotated by the x86 quantizer with a symmetric int8
spec for activations (zero-point 0: the TensorRT layout) and per-channel symmetric int8
weights, fake-quantized while it trains, then converted to quantize/dequantize ops that the
dynamo ONNX exporter writes as QuantizeLinear/DequantizeLinear. The CPU flavour is derived
from that file afterwards (``qdq_rewrite``), so one training run serves both deployments.
"""
from __future__ import annotations

import contextlib
import copy
import logging
from typing import Iterator

import torch
from torch import nn

from compress.quantization.ladder import RungUnavailable
from export.torch_capture import capture

QUANT_RANGE = (-127, 127)  # symmetric: -128 would need a zero-point TensorRT does not take


class _TorchaoEnumNotice(logging.Filter):
    """Drops one notice torch logs when torchao registers its Enum settings with torch's pytree ("… is an Enum
    subclass and is now natively supported …"): it concerns torchao's code, not the user's run, and it would
    land in the run's console between the quantize stage's lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is an Enum subclass and is now natively supported" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_TorchaoEnumNotice())


class QATUnavailable(RungUnavailable):
    """torchao (the PT2E QAT engine) is not installed or cannot capture this model."""


def _quantizer():
    try:
        from torchao.quantization.pt2e import (FusedMovingAvgObsFakeQuantize, MovingAverageMinMaxObserver,
                                               MovingAveragePerChannelMinMaxObserver)
        from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec
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

    class _UnfusedResidualQuantizer(X86InductorQuantizer):
        """The x86 quantizer without its conv(+BN)+add(+ReLU) fusion, and with both inputs of every
        residual add quantized: the layout onnxruntime fuses into QLinearConv (and TensorRT's
        explicit quantization expects). The x86 quantizer targets Inductor's fused int8 conv-add
        kernel instead, which leaves the conv output and the shortcut in float in ONNX."""

        def _annotate_qat_conv2d_bn_binary_unary(self, *args, **kwargs) -> None:
            return None

        def _annotate_qat_conv2d_bn_binary(self, *args, **kwargs) -> None:
            return None

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            model = super().annotate(model)
            for node in model.graph.nodes:
                if node.op != "call_function" or node.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor):
                    continue
                operands = [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
                if len(operands) != 2:
                    continue
                annotation = node.meta.get("quantization_annotation")
                if annotation is None:
                    node.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={a: activation for a in operands}, _annotated=True)
                else:
                    for a in operands:
                        annotation.input_qspec_map.setdefault(a, activation)
            return model

    return _UnfusedResidualQuantizer().set_global(QuantizationConfig(activation, activation, weight, None, True))


def prepare(model: nn.Module, sample: torch.Tensor) -> nn.Module:
    """A fake-quantized copy of ``model`` that trains with ``.train()`` / ``.eval()`` like any module."""
    from torchao.quantization.pt2e import allow_exported_model_train_eval
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    quantizer = _quantizer()
    model = copy.deepcopy(model).eval().cpu().to(memory_format=torch.contiguous_format)  # the float model stays as it was
    try:
        prepared = prepare_qat_pt2e(capture(model, sample), quantizer)
    except Exception as exc:  # torch.export raises many types for untraceable models
        raise QATUnavailable(f"torch.export / prepare_qat_pt2e could not capture the model: {exc}") from exc
    return allow_exported_model_train_eval(prepared)


@torch.no_grad()
def observe(prepared: nn.Module, images: torch.Tensor, batch_size: int = 64) -> None:
    """Seed every fake-quantizer's range from the calibration images before training moves it."""
    prepared.eval()
    for start in range(0, len(images), batch_size):
        prepared(images[start:start + batch_size])


def _fake_quantizers(prepared: nn.Module) -> list[nn.Module]:
    from torchao.quantization.pt2e import FakeQuantizeBase

    return [m for m in prepared.modules() if isinstance(m, FakeQuantizeBase)]


@contextlib.contextmanager
def observers_paused(prepared: nn.Module) -> Iterator[None]:
    """Range observers off while the model is only being judged, then back as they were.

    ``move_exported_model_to_eval`` switches BatchNorm and dropout, not the fused moving-average
    fake-quantizers: left on, every validation pass would pull the activation ranges towards
    the validation images, which then judge the rung that ships those ranges.
    """
    quantizers = _fake_quantizers(prepared)
    states = [bool(q.observer_enabled[0]) for q in quantizers]
    for q in quantizers:
        q.disable_observer()
    try:
        yield
    finally:
        for q, enabled in zip(quantizers, states):
            if enabled:
                q.enable_observer()


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
