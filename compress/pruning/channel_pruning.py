"""Network slimming: L1 on BatchNorm scales during training, then dependency-aware channel surgery.

Liu et al. 2017 ("Learning Efficient Convolutional Networks through Network Slimming"):
an L1 penalty drives the BN scale γ of unimportant channels towards zero, then channels
are removed by |γ|. torch-pruning's dependency graph keeps residual adds, concatenations,
depthwise and grouped convolutions consistent, and records a history that rebuilds the
pruned architecture from the original one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch
import torch_pruning as tp
from pydantic import Field, model_validator
from torch import nn

from compress.config import Strict


class PruningError(Exception):
    """Pruning ran but could not reach a meaningful result (the pruning package's base error)."""

    bad_input = False


class PruningInputError(PruningError):
    """The model or the settings do not allow this pruning at all; the message says what to change."""

    bad_input = True


def batchnorm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine]


def gamma_values(model: nn.Module) -> torch.Tensor:
    layers = batchnorm_layers(model)
    return torch.cat([m.weight.detach().abs().flatten().cpu() for m in layers]) if layers else torch.empty(0)


def gamma_histogram(model: nn.Module, bins: int = 20) -> dict:
    values = gamma_values(model)
    if values.numel() == 0:
        return {"counts": [], "edges": []}
    counts, edges = torch.histogram(values.float(), bins=bins)
    return {"counts": [int(c) for c in counts], "edges": [round(float(e), 6) for e in edges]}


def bn_l1_hook(model: nn.Module, lam: float, ignored: list[nn.Module] | None = None) -> Callable[[nn.Module], None]:
    """The post-backward gradient hook of the sparsity phase: ∂(λ·Σ|γ|)/∂γ = λ·sign(γ).

    The loop calls it after the scaler has unscaled the gradients and before clipping and
    the optimizer step, so the penalty has the same strength under fp16 as under fp32.
    """
    if not batchnorm_layers(model):
        raise PruningInputError("the model has no BatchNorm layers, so BN-scale sparsity has nothing to act on; "
                           "use importance: magnitude (and sparsity.epochs: 0)")
    skip = set(ignored or [])

    def hook(trained: nn.Module) -> None:
        for bn in batchnorm_layers(trained):
            if bn not in skip and bn.weight.grad is not None:
                bn.weight.grad.add_(lam * torch.sign(bn.weight.detach()))

    return hook


def unprunable_batchnorms(model: nn.Module, example: torch.Tensor, protected: list[nn.Module]) -> list[nn.Module]:
    """BatchNorms whose channels the pruner will never remove, given the protected layers.

    The same rule torch-pruning's pruner applies: a channel group is pruned only if none of
    its output-channel members is ignored (a protected module or any module inside one). A
    BatchNorm in no prunable group keeps all its channels, so the sparsity phase must not
    push its scales to zero: that would only cost accuracy.
    """
    ignored = [m for layer in protected for m in layer.modules()]
    graph = tp.DependencyGraph().build_dependency(model.eval(), example_inputs=example)
    prunable = set()
    for group in graph.get_all_groups(ignored_layers=ignored, root_module_types=(nn.Conv2d, nn.Linear)):
        prunable.update(dep.target.module for dep, _ in group)
    return [bn for bn in batchnorm_layers(model) if bn not in prunable]


class PruneTarget(Strict):
    """How far to prune: a MACs budget, or a share of channels."""

    macs: float | None = Field(None, gt=0, lt=1, description="keep at most this share of the MACs")
    ratio: float | None = Field(None, gt=0, lt=1, description="or remove this share of the channels")

    @model_validator(mode="after")
    def _one(self) -> "PruneTarget":
        if (self.macs is None) == (self.ratio is None):
            raise ValueError("give exactly one of macs (share of MACs to keep) or ratio (share of channels to remove)")
        return self


class SurgerySettings(Strict):
    """How channels are ranked and removed (torch-pruning's MetaPruner)."""

    importance: Literal["bn_scale", "magnitude"] = Field(
        "bn_scale", description="bn_scale: |γ| of BatchNorm (needs BatchNorm and a sparsity phase); "
                                "magnitude: L2 norm of the weights")
    global_pruning: bool = True
    round_to: int | None = Field(None, ge=1, description="channel counts rounded to multiples of this (e.g. 8)")
    max_layer_ratio: float = Field(0.9, gt=0, lt=1, description="no layer loses more than this share of its channels")
    steps: int = Field(16, ge=1, description="iterative steps towards a MACs target")


@dataclass
class PruneResult:
    history: list
    macs_before: int
    macs_after: int
    params_before: int
    params_after: int
    channels_before: dict[str, int] = field(default_factory=dict)
    channels_after: dict[str, int] = field(default_factory=dict)


def _channels(model: nn.Module) -> dict[str, int]:
    return {name: m.out_channels for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}


def prune(model: nn.Module, example: torch.Tensor, target: PruneTarget, protected: list[nn.Module],
          settings: SurgerySettings | None = None) -> PruneResult:
    """Prune ``model`` in place towards the target; raises PruningError when it cannot."""
    settings = settings or SurgerySettings()
    if settings.importance == "bn_scale":
        if not batchnorm_layers(model):
            raise PruningInputError("the model has no BatchNorm layers; BN-scale importance cannot rank its channels. "
                               "Use importance: magnitude")
        gammas = gamma_values(model)
        if float(gammas.max() - gammas.min()) < 1e-8:
            raise PruningInputError("every BatchNorm scale has the same value, so BN-scale ranking would prune nothing "
                               "meaningful; run the sparsity phase first (sparsity.epochs > 0, lambda > 0)")
        importance = tp.importance.BNScaleImportance()
    else:
        importance = tp.importance.MagnitudeImportance(p=2)
    model.eval()
    macs_before, params_before = tp.utils.count_ops_and_params(model, example)
    channels_before = _channels(model)
    by_macs = target.macs is not None
    pruner = tp.pruner.MetaPruner(
        model, example, importance=importance, global_pruning=settings.global_pruning,
        pruning_ratio=settings.max_layer_ratio if by_macs else target.ratio,
        max_pruning_ratio=settings.max_layer_ratio, iterative_steps=settings.steps if by_macs else 1,
        ignored_layers=protected, round_to=settings.round_to)
    macs = macs_before
    for _ in range(settings.steps if by_macs else 1):
        pruner.step()
        macs, _ = tp.utils.count_ops_and_params(model, example)
        if by_macs and macs <= target.macs * macs_before:
            break
    if macs >= macs_before:
        raise PruningError("the pruner removed no channel: every layer is protected or at its max_layer_ratio")
    if by_macs and macs > target.macs * macs_before:
        raise PruningError(f"reached {macs / macs_before:.1%} of the MACs, not the {target.macs:.0%} target, "
                           f"with max_layer_ratio {settings.max_layer_ratio}; raise it or relax the target")
    params_after = sum(p.numel() for p in model.parameters())
    history = [[name, bool(out), [int(i) for i in idxs]] for name, out, idxs in pruner.pruning_history()]
    return PruneResult(history, int(macs_before), int(macs), int(params_before), int(params_after),
                       channels_before, _channels(model))


def latency_ratio(original: nn.Module, pruned: nn.Module, example: torch.Tensor, rounds: int = 10, block: int = 20) -> float:
    """Median CPU latency of the pruned model over the original's, measured interleaved in one run."""
    import time

    times: dict[int, list[float]] = {0: [], 1: []}
    models = (original.eval(), pruned.eval())
    with torch.inference_mode():
        for m in models:
            for _ in range(5):
                m(example)
        for _ in range(rounds):
            for k, m in enumerate(models):
                for _ in range(block):
                    t0 = time.perf_counter()
                    m(example)
                    times[k].append(time.perf_counter() - t0)
    median = [sorted(v)[len(v) // 2] for v in times.values()]
    return median[1] / median[0]
