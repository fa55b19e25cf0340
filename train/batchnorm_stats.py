"""BatchNorm running statistics re-estimated from training images: after channel surgery, a finetune or QAT.

A BatchNorm layer normalises at inference with running averages of its input's mean and variance,
which training updates by ``momentum`` per step. Channel surgery changes every layer's input at
once, and a short finetune at a small momentum (0.01, as TensorFlow ports such as EfficientNet-Lite
and MobileNet use) moves the averages only part of the way back: the weights are fine, and the
model is near chance at inference. Re-estimating resets the statistics and averages them over a
bounded number of training images, the model in train mode without gradients, each batch weighing
the same (a cumulative average, momentum ``None``): what ``torch.optim.swa_utils.update_bn`` does,
and what pruning and quantization toolkits ask their users to do after surgery.

A model captured for quantization-aware training (torch.export, PT2E) has no BatchNorm modules:
its batch norms are graph operations whose momentum was fixed at capture. The same cumulative
average is had there by setting each operation's momentum to 1/k before the k-th batch.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

# A captured graph's batch-norm operations, and where each takes its momentum (None: an inference-only form).
_MOMENTUM_ARG = {"aten.batch_norm.default": 6, "aten._native_batch_norm_legit.default": 6,
                 "aten.cudnn_batch_norm.default": 6, "aten._native_batch_norm_legit_no_training.default": None}


def batchnorm_count(model: nn.Module) -> int:
    """BatchNorm layers whose statistics a re-estimation would set: modules, or a captured graph's operations."""
    modules = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules())
    return modules or len(_graph_batch_norms(model))


def _graph_batch_norms(model: nn.Module) -> list:
    graph = getattr(model, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        return []
    return [n for n in graph.nodes if n.op == "call_function" and str(n.target) in _MOMENTUM_ARG]


def _limited(batches: Iterable, images: int) -> Iterator[torch.Tensor]:
    """The input tensors of ``batches``, whole, until ``images`` images were given (each batch weighs the same in
    the average, so none is cut short)."""
    seen = 0
    for batch in batches:
        if seen >= images:
            return
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        seen += len(x)
        yield x


@torch.no_grad()
def reestimate(model: nn.Module, batches: Iterable, images: int) -> int:
    """Reset every BatchNorm's running statistics and set them again from about ``images`` images of
    ``batches`` (tensors, or tuples whose first item is the input; whole batches until that many were seen). The
    model's mode, its BatchNorm momenta and its weights are as before. Returns the images used (0 where the model
    has no BatchNorm)."""
    if images <= 0 or not batchnorm_count(model):
        return 0
    given = _limited(batches, images)
    first = next(given, None)
    if first is None:  # no batch at all: the statistics stay as they are, not reset to nothing
        logger.warning("BatchNorm statistics not re-estimated: no training batch was given")
        return 0
    counted = _Counted(itertools.chain([first], given))
    nodes = _graph_batch_norms(model)
    if nodes and not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        _reestimate_graph(model, counted)
    else:
        from torch.optim.swa_utils import update_bn

        update_bn(counted, model)
    logger.debug("BatchNorm statistics re-estimated on %d images", counted.images)
    return counted.images


class _Counted:
    """An iterable of input tensors that counts the images it gave."""

    def __init__(self, tensors: Iterator[torch.Tensor]) -> None:
        self.tensors, self.images = tensors, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        for x in self.tensors:
            self.images += len(x)
            yield x


def _reestimate_graph(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """A captured graph's batch norms: the k-th batch weighed 1/k (a cumulative average; the first, at 1, replaces
    the old statistics), in train mode; each operation's momentum and the model's mode restored after. The old
    statistics are not reset first: a QAT graph folds the running variance into the weights it fake-quantizes
    before the batch norm, and a reset variance would push those weights out of their frozen ranges. The
    operations are found after the switch to train mode, which rewrites them (torchao's
    move_exported_model_to_train)."""
    was_training = _graph_trains(model)
    model.train()
    nodes = [n for n in _graph_batch_norms(model) if _MOMENTUM_ARG[str(n.target)] is not None]
    momenta = [n.args[_MOMENTUM_ARG[str(n.target)]] for n in nodes]
    try:
        for k, x in zip(itertools.count(1), batches):
            _set_momenta(model, nodes, [1.0 / k] * len(nodes))
            model(x)
    finally:
        _set_momenta(model, nodes, momenta)
        model.train(was_training)


def _graph_trains(model: nn.Module) -> bool:
    """Whether a captured graph's batch norms use batch statistics: its ``training`` flag is not kept by the
    train/eval switch of an exported model, the operations are."""
    for node in _graph_batch_norms(model):
        return str(node.target) != "aten._native_batch_norm_legit_no_training.default" and bool(node.args[5])
    return model.training


def _set_momenta(model: nn.Module, nodes: list, momenta: list[float]) -> None:
    for node, momentum in zip(nodes, momenta):
        args = list(node.args)
        args[_MOMENTUM_ARG[str(node.target)]] = momentum
        node.args = tuple(args)
    model.recompile()
