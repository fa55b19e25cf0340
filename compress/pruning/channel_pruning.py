"""Network slimming: L1 on BatchNorm scales during training, then dependency-aware channel surgery.

Liu et al. 2017 ("Learning Efficient Convolutional Networks through Network Slimming"):
an L1 penalty drives the BN scale γ of unimportant channels towards zero, then channels
are removed by |γ|. torch-pruning's dependency graph keeps residual adds, concatenations,
depthwise and grouped convolutions consistent, and records a history that rebuilds the
pruned architecture from the original one. Models without BatchNorm (ConvNeXt's LayerNorm,
ViTs) are ranked by weight magnitude instead, and ViT-style attention loses whole heads
(compress.pruning.structure), which the same history records.
"""
from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass, field
from typing import Annotated, Callable, Literal

import torch
import torch_pruning as tp
from pydantic import Field, model_validator
from torch import nn

from compress.config import Strict
from compress.pruning import structure

log = logging.getLogger(__name__)


class PruningError(Exception):
    """Pruning ran but could not reach a meaningful result (the pruning package's base error)."""

    bad_input = False


class PruningLimitReached(PruningError):
    """The pruner can remove no more (every layer protected or at its max_layer_ratio), or not as much as asked:
    a fixed target fails with it; a search of how far to prune stops there."""


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
    graph = tp.DependencyGraph().build_dependency(model.eval(), example_inputs=example, forward_fn=_trace_fn(model))
    prunable = set()
    for group in graph.get_all_groups(ignored_layers=ignored, root_module_types=(nn.Conv2d, nn.Linear)):
        prunable.update(dep.target.module for dep, _ in group)
    return [bn for bn in batchnorm_layers(model) if bn not in prunable]


class PruneTarget(Strict):
    """How far to prune: a MACs or parameter budget (or ``auto``: the prune stage finds the smallest within the red
    line), or a share of channels. MACs are what latency follows on a CPU; parameters are what a file's size and a
    device's memory follow, and the two part ways where pruning thins wide late layers more than early ones."""

    macs: Annotated[float, Field(gt=0, lt=1)] | Literal["auto"] | None = Field(
        None, description="keep at most this share of the MACs; auto: prune in steps, each finetuned briefly and judged "
                          "on the validation split, and keep the last within the red line (the stage's auto settings)")
    params: Annotated[float, Field(gt=0, lt=1)] | Literal["auto"] | None = Field(
        None, description="or keep at most this share of the parameters (auto: as for macs, in steps of parameters)")
    ratio: float | None = Field(None, gt=0, lt=1, description="or remove this share of the channels")

    @property
    def auto(self) -> bool:
        return "auto" in (self.macs, self.params)

    @property
    def measure(self) -> Literal["macs", "params"] | None:
        """What the budget counts: ``macs``, ``params``, or None for a share of channels."""
        return "macs" if self.macs is not None else "params" if self.params is not None else None

    @property
    def budget(self) -> float | None:
        """The share of the measure to keep (None for auto or a share of channels)."""
        value = self.macs if self.macs is not None else self.params
        return None if value in (None, "auto") else float(value)

    @model_validator(mode="after")
    def _one(self) -> "PruneTarget":
        if sum(v is not None for v in (self.macs, self.params, self.ratio)) != 1:
            raise ValueError("give exactly one of macs (share of MACs to keep), params (share of parameters to keep) "
                             "or ratio (share of channels to remove)")
        return self


class SurgerySettings(Strict):
    """How channels are ranked and removed (torch-pruning's MetaPruner)."""

    importance: Literal["bn_scale", "magnitude"] = Field(
        "bn_scale", description="bn_scale: |γ| of BatchNorm (needs BatchNorm and a sparsity phase); "
                                "magnitude: L2 norm of the weights")
    global_pruning: bool = Field(True, description="rank channels across all layers at once (else the same share in "
                                                   "each layer)")
    round_to: int | None = Field(None, ge=1, description="channel counts rounded to multiples of this (e.g. 8)")
    max_layer_ratio: float = Field(0.9, gt=0, lt=1, description="no layer loses more than this share of its channels")
    steps: int = Field(16, ge=1, description="iterative steps towards a MACs target")
    target_tolerance: float = Field(0.05, ge=0, lt=1, description="a MACs or params target is a target: the share "
                                    "kept lands within this much below it (0.05: a 0.5 target keeps 45-50%); where a "
                                    "multiple overshoots, a smaller one (round_to chosen for you) or finer steps are "
                                    "tried, and the closest is kept and said")
    head_ratio: float = Field(0.25, ge=0, lt=1, description="share of attention heads removed, whole heads, in ViT-style "
                                                           "attention (timm's Attention) before the channels; 0 keeps all")


@dataclass
class PruneResult:
    history: list
    macs_before: int
    macs_after: int
    params_before: int
    params_after: int
    channels_before: dict[str, int] = field(default_factory=dict)
    channels_after: dict[str, int] = field(default_factory=dict)
    importance: str = "bn_scale"
    not_pruned: dict[str, list[str]] = field(default_factory=dict)  # reason → layers whose output width it kept
    unwrapped: list[str] = field(default_factory=list)  # loose parameters pruned along an inferred dimension
    heads_before: dict[str, int] = field(default_factory=dict)
    heads_after: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what torch-pruning warned about
    round_to: int | None = None  # the channel multiple the surgery rounded to
    rounding: list[str] = field(default_factory=list)  # multiples tried first that could not reach the target
    target: float | None = None  # the share of the MACs (or parameters) asked for, beside what was reached
    measure: str | None = None  # what the target counts: macs or params

    def reached(self) -> float | None:
        """The share of the target's measure kept (None for a share of channels)."""
        if self.measure is None:
            return None
        return (self.macs_after / self.macs_before if self.measure == "macs"
                else self.params_after / self.params_before)


def layer_widths(model: nn.Module) -> dict[str, int]:
    """Output channels (features) of every convolution and linear layer, by name."""
    return {name: m.out_channels if isinstance(m, nn.Conv2d) else m.out_features
            for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


HEADS_ONLY = "attention width: pruned by whole heads only (see heads_before/heads_after)"


def _kept_whole(model: nn.Module, protected: list[nn.Module]) -> dict[nn.Module, str]:
    """The layers the pruner ignores, each with the reason the report gives."""
    names = {m: n for n, m in model.named_modules()}
    reasons: dict[nn.Module, str] = {}
    heads, other = structure.attention_layers(model)
    for name, attn in other.items():
        for m in structure.head_projections(attn):
            reasons[m] = f"attention {name} ({type(attn).__name__}): heads and head widths kept, only timm's Attention " \
                         "can have its head count follow its weights"
    for attn in heads.values():
        reasons[attn.qkv] = HEADS_ONLY
    classifier = protected[-1] if protected else None
    for layer in protected:
        why = "the classifier: keeps its class count" if layer is classifier else f"protected ({names.get(layer, '?')})"
        for m in layer.modules():
            reasons[m] = why
    return reasons


def _importance(model: nn.Module, settings: SurgerySettings) -> tp.importance.Importance:
    if settings.importance == "magnitude":
        return tp.importance.MagnitudeImportance(p=2)
    if not batchnorm_layers(model):
        raise PruningInputError("the model has no BatchNorm layers; BN-scale importance cannot rank its channels. "
                                "Use importance: magnitude")
    gammas = gamma_values(model)
    if float(gammas.max() - gammas.min()) < 1e-8:
        raise PruningInputError("every BatchNorm scale has the same value, so BN-scale ranking would prune nothing "
                                "meaningful; run the sparsity phase first (sparsity.epochs > 0, lambda > 0)")
    return tp.importance.BNScaleImportance()


def _trace_fn(model: nn.Module):
    """What torch-pruning traces: the model's ``prune_trace(x)`` where it has one (a detector's raw head outputs,
    before reshapes over anchors that torch-pruning cannot map), else its forward."""
    if callable(getattr(model, "prune_trace", None)):
        return lambda m, x: m.prune_trace(x)
    return None


def _class_width(output: torch.Tensor) -> int:
    """The class count an output carries: its last dimension (a classifier's N×C, a detector's N×A×(4+C)), or its
    channels where it is a dense map (a segmenter's N×C×H×W)."""
    return output.shape[1] if output.dim() == 4 else output.shape[-1]


def _counts(model: nn.Module, example: torch.Tensor) -> dict[str, int]:
    """MACs and parameters as torch-pruning counts them (the parameter count the budget is on)."""
    macs, params = tp.utils.count_ops_and_params(model, example)
    return {"macs": macs, "params": params}


def prune(model: nn.Module, example: torch.Tensor, target: PruneTarget, protected: list[nn.Module],
          settings: SurgerySettings | None = None) -> PruneResult:
    """Prune ``model`` in place towards the target; raises PruningError when it cannot.

    ``protected[-1]`` is taken to be the classifier (reported as such). Whole attention heads go
    first (``head_ratio``), then channels step by step until the target; everything the pruner
    may not touch, and why, is in ``not_pruned``. torch-pruning's warnings are logged and kept.
    """
    if target.auto:
        raise ValueError(f"target {target.measure}: auto is searched by the prune stage in numeric steps; prune() takes "
                         "one of them")
    settings = settings or SurgerySettings()
    importance = _importance(model, settings)
    model.eval()
    macs_before, params_before = tp.utils.count_ops_and_params(model, example)
    with torch.no_grad():
        classes_before = _class_width(model(example))
    channels_before, heads_before = layer_widths(model), structure.head_counts(model)
    reasons = _kept_whole(model, protected)
    ignored = list(dict.fromkeys([*protected, *reasons]))  # the pruner ignores these and their submodules
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example, forward_fn=_trace_fn(model))
        found = structure.survey(model, graph, importance, settings.importance, reasons)
        if found.rankable == 0 and settings.importance == "bn_scale":
            raise PruningInputError("no prunable channel group of this model carries a BatchNorm scale, so BN-scale "
                                    "importance ranks nothing; use importance: magnitude")
        attentions = {n: a for n, a in structure.attention_layers(model)[0].items()
                      if reasons.get(a.qkv) == HEADS_ONLY and settings.head_ratio > 0}  # not inside a protected layer
        for name in structure.prune_heads(graph, attentions, importance, settings.head_ratio, settings.global_pruning,
                                          settings.max_layer_ratio):
            found.not_pruned.setdefault(f"{settings.importance} cannot rank its heads", []).append(name)
        history = list(graph.pruning_history())
        budget, measure = target.budget, target.measure
        by_budget = budget is not None
        pruner = tp.pruner.MetaPruner(
            model, example, importance=importance, global_pruning=settings.global_pruning,
            pruning_ratio=settings.max_layer_ratio if by_budget else target.ratio,
            max_pruning_ratio=settings.max_layer_ratio, iterative_steps=settings.steps if by_budget else 1,
            ignored_layers=ignored, round_to=settings.round_to, forward_fn=_trace_fn(model))
        before = {"macs": macs_before, "params": params_before}
        counted = _counts(model, example)
        for _ in range(settings.steps if by_budget else 1):
            if by_budget and counted[measure] <= budget * before[measure]:
                break
            pruner.step()
            counted = _counts(model, example)
    notes = list(dict.fromkeys(str(w.message).split("\n")[0] for w in caught))
    for note in notes:
        log.warning("torch-pruning: %s", note)
    macs = counted["macs"]
    if macs >= macs_before:
        raise PruningLimitReached("the pruner removed no channel: every layer is protected or at its max_layer_ratio")
    if by_budget and counted[measure] > budget * before[measure]:
        word = "MACs" if measure == "macs" else "parameters"
        raise PruningLimitReached(f"reached {counted[measure] / before[measure]:.1%} of the {word}, not the "
                                  f"{budget:.0%} target, with max_layer_ratio {settings.max_layer_ratio}; raise it or "
                                  "relax the target")
    try:
        with torch.no_grad():
            width = _class_width(model(example))
    except Exception as exc:  # a layer torch-pruning resized but whose forward was not told
        raise PruningError(f"the pruned model no longer runs ({type(exc).__name__}: {exc}); list the layer it names "
                           "under protected") from exc
    if width != classes_before:  # the classifier was not the layer protected as such
        raise PruningError(f"the pruned model gives {width} scores, not the {classes_before} classes it gave: "
                           "its classifier was pruned; list the classifier's module name under protected")
    params_after = sum(p.numel() for p in model.parameters())
    history += pruner.pruning_history()
    history = [[name, bool(out), [int(i) for i in idxs]] for name, out, idxs in history]
    return PruneResult(history, int(macs_before), int(macs), int(params_before), int(params_after),
                       channels_before, layer_widths(model), settings.importance, found.not_pruned, found.unwrapped,
                       heads_before, structure.head_counts(model), notes)


def prune_rounded(model: nn.Module, example: torch.Tensor, target: PruneTarget, protected: list[nn.Module],
                  settings: SurgerySettings, halve: bool = True) -> tuple[nn.Module, PruneResult]:
    """``prune`` at ``settings.round_to``, halving the multiple (``halve``: a multiple chosen for the user, not one
    the user set) where the target cannot be reached with it, or where it overshoots the target by more than
    ``settings.target_tolerance``.

    A multiple the kernels want can make a budget unreachable on a narrow network: ResNet-20's 16-channel stage
    cannot lose a channel at a multiple of 16, and that stage alone is a third of its MACs. The smaller multiple
    still keeps widths a runtime's slow paths avoid (a depthwise width off 4 ran 2.6× slower per MAC on
    onnxruntime). The other way, a coarse multiple removes channels in large chunks, and the last step towards a
    budget can land far under it (a detector asked for 50% of its MACs went to 32.6% at a multiple of 16, and lost
    2.2 mAP points): a fixed target is a target. So a result under the tolerance tries the next multiple down, then
    finer steps at the last multiple (twice, then four times as many), and keeps the first within it, else the
    closest to the target. Each try prunes a copy, so ``model`` is left as it is and the pruned copy is returned;
    the result records the multiple used, the target beside what was reached, and each try that was passed over."""
    multiple, steps = settings.round_to or 1, settings.steps
    tried: list[str] = []
    best: tuple[nn.Module, PruneResult] | None = None
    budget, word = target.budget, "MACs" if target.measure == "macs" else "parameters"
    while True:
        candidate = copy.deepcopy(model)
        protected_copy = _same_modules(model, candidate, protected)
        try:
            result = prune(candidate, example, target, protected_copy,
                           settings.model_copy(update={"round_to": multiple if multiple > 1 else None,
                                                       "steps": steps}))
        except PruningLimitReached as exc:
            if multiple <= 1 or not halve:
                if best is not None:  # finer steps went no further than a coarser try that reached the target
                    break
                raise
            tried.append(f"round_to {multiple}: {exc}")
            log.info("round_to %d cannot reach the target (%s); trying %d", multiple, exc, multiple // 2)
            multiple //= 2
            continue
        result.round_to, result.target, result.measure = (multiple if multiple > 1 else None), budget, target.measure
        reached = result.reached()
        if budget is None or reached >= budget - settings.target_tolerance:
            best = (candidate, result)
            break
        if best is None or reached > best[1].reached():
            best = (candidate, result)
        how = f"round_to {multiple}" + (f", {steps} steps" if steps != settings.steps else "")
        tried.append(f"{how}: reached {reached:.1%} of the {word}, more than {settings.target_tolerance:.0%} under "
                     f"the {budget:.0%} target")
        if halve and multiple > 1:
            log.info("%s overshoots the target; trying round_to %d", how, multiple // 2)
            multiple //= 2
        elif steps < 4 * settings.steps:
            steps *= 2
        else:
            break
    candidate, result = best
    result.rounding = tried  # every try passed over, the kept one's own where none was within the tolerance
    return candidate, result


def _same_modules(model: nn.Module, copied: nn.Module, modules: list[nn.Module]) -> list[nn.Module]:
    """``modules`` of ``model`` as the same-named modules of its copy."""
    names = {m: n for n, m in model.named_modules()}
    lookup = dict(copied.named_modules())
    return [lookup[names[m]] for m in modules]
