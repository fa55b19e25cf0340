"""A torch model captured by ``torch.export`` the way torchao's PT2E quantizers can annotate it.

Shared by the QAT rung (``compress.quantization.qat_pt2e``) and the Inductor runtime's native INT8 file
(``serve_bench.runners.inductor``): both annotate the captured graph with an x86 quantizer, which groups nodes by
the module they came from and finds layers by their exact type, so the same two repairs apply to both.
"""
from __future__ import annotations

import torch
from torch import nn


def batch_dim():
    return torch.export.Dim("batch", min=1, max=4096)


_SINGLE_OP_MODULES = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.SiLU, nn.Hardswish)


def split_shared_activations(graph_module: torch.fx.GraphModule) -> int:
    """Give every call of a reused activation module its own source name.

    torchvision's BasicBlock calls one ``self.relu`` twice; the quantizer groups nodes into
    partitions by the module they came from (``source_fn_stack``, or ``nn_module_stack`` when
    export leaves the former empty), so both calls form one partition with two outputs and
    annotation fails. An activation module is one op per call, so renaming the later calls in
    the captured graph's metadata is all it takes; the user's model stays untouched.
    """
    calls: dict[str, int] = {}
    renamed = 0
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        source = node.meta.get("source_fn_stack")
        modules = node.meta.get("nn_module_stack")
        if source and isinstance(source[-1][1], type) and issubclass(source[-1][1], _SINGLE_OP_MODULES):
            name = source[-1][0]
        elif not source and modules and _is_activation(list(modules.values())[-1][1]):
            name = list(modules.values())[-1][0]
        else:
            continue
        seen = calls.get(name, 0)
        calls[name] = seen + 1
        if not seen:
            continue
        if source:
            node.meta["source_fn_stack"] = [*source[:-1], (f"{name}__call{seen}", source[-1][1])]
        else:
            key, (fqn, kind) = list(modules.items())[-1]
            node.meta["nn_module_stack"] = {**modules, key: (f"{fqn}__call{seen}", kind)}
        renamed += 1
    return renamed


# The layer types the x86 quantizer looks for, and the aten op each one captures to.
_QUANTIZED_LAYERS = ((nn.Conv2d, torch.ops.aten.conv2d.default), (nn.Linear, torch.ops.aten.linear.default))


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def name_layer_subclasses(graph_module: torch.fx.GraphModule, model: nn.Module) -> int:
    """Record a subclass of ``nn.Conv2d`` / ``nn.Linear`` as the layer it is, on its conv / linear node.

    The quantizer finds its layers by the exact type a node came from, so timm's ``Linear`` (the classifier
    of MobileNetV3 and EfficientNet) and ``Conv2dSame`` (the stride-2 convolutions of the ``tf_*`` ports)
    were left in float, and the TensorRT file of the QAT rung then failed the lint. Only the conv / linear
    node itself is renamed: a subclass's own padding stays outside the layer, as it runs.
    """
    renamed = 0
    for node in graph_module.graph.nodes:
        modules = node.meta.get("nn_module_stack")
        if node.op != "call_function" or not modules:
            continue
        key, (fqn, kind) = list(modules.items())[-1]
        for base, op in _QUANTIZED_LAYERS:
            if node.target != op:
                continue
            try:
                module = model.get_submodule(fqn)
            except AttributeError:
                break
            if isinstance(module, base) and type(module) is not base and kind != _qualified(base):
                node.meta["nn_module_stack"] = {**modules, key: (fqn, _qualified(base))}
                source = node.meta.get("source_fn_stack")
                if source:
                    node.meta["source_fn_stack"] = [*source[:-1], (source[-1][0], base)]
                renamed += 1
            break
    return renamed


def _is_activation(kind) -> bool:
    if isinstance(kind, type):
        return issubclass(kind, _SINGLE_OP_MODULES)
    return isinstance(kind, str) and kind in {_qualified(c) for c in _SINGLE_OP_MODULES}


def capture(model: nn.Module, sample: torch.Tensor) -> torch.fx.GraphModule:
    """``model`` (in eval mode, on the CPU) captured with a dynamic batch dimension, both repairs applied."""
    captured = torch.export.export(model, (sample.float().cpu(),), dynamic_shapes=({0: batch_dim()},)).module()
    split_shared_activations(captured)
    name_layer_subclasses(captured, model)
    return captured
