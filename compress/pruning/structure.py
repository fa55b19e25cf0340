"""What structured pruning reaches in a model: whole attention heads, and the layers it must leave whole.

torch-pruning prunes what its dependency graph couples into channel groups and an importance
can rank; every other layer keeps its width. ``survey`` says which layer is which and why, so
the prune stage reports it (a layer left whole is never skipped silently). ``prune_heads``
removes whole heads from ViT-style attention (timm's ``Attention``): channel ranking alone
would cut across heads, which a reshape into (heads, head width) cannot survive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch_pruning as tp
from torch import nn

ROOT_TYPES = (tp.ops.TORCH_CONV, tp.ops.TORCH_LINEAR, tp.ops.TORCH_LSTM)  # MetaPruner's default roots
# Linear layers that project into heads in attention modules other than timm's Attention.
_HEAD_PROJECTIONS = {"qkv", "q", "k", "v", "kv", "q_proj", "k_proj", "v_proj", "qkv_proj", "in_proj"}


def _timm_attention() -> type | None:
    try:
        from timm.layers import Attention
    except ImportError:
        return None
    return Attention


def head_prunable(module: nn.Module) -> bool:
    """timm's plain ``Attention`` (or train.models' weight-shaped version of it): one fused qkv Linear
    whose forward reshapes by ``num_heads`` × ``head_dim`` and a proj Linear; nothing else indexed by head."""
    attention = _timm_attention()
    return (attention is not None and isinstance(module, attention) and type(module).forward is attention.forward
            and isinstance(getattr(module, "qkv", None), nn.Linear) and isinstance(getattr(module, "proj", None), nn.Linear))


def attention_layers(model: nn.Module) -> tuple[dict[str, nn.Module], dict[str, nn.Module]]:
    """(head-prunable attentions, other attention modules) by name. Other: a module with an int
    ``num_heads`` that is not head-prunable (Swin's window attention, rotary attention, …); torch's
    MultiheadAttention is left to torch-pruning, which has a pruner that keeps its heads whole."""
    prunable, other = {}, {}
    for name, module in model.named_modules():
        if head_prunable(module):
            prunable[name] = module
        elif isinstance(getattr(module, "num_heads", None), int) and not isinstance(module, nn.MultiheadAttention):
            other[name] = module
    return prunable, other


def head_projections(module: nn.Module) -> list[nn.Module]:
    """The Linear layers of an unsupported attention whose output widths are laid out by head."""
    return [child for name, child in module.named_children() if name in _HEAD_PROJECTIONS and isinstance(child, nn.Linear)]


def _sync_heads(attention: nn.Module) -> None:
    """Set a plain timm Attention's head count after its qkv lost heads (train.models' shaped one reads it)."""
    if not isinstance(getattr(type(attention), "num_heads", None), property):
        attention.num_heads = attention.qkv.out_features // (3 * attention.head_dim)
        attention.attn_dim = attention.qkv.out_features // 3


def head_counts(model: nn.Module) -> dict[str, int]:
    return {name: int(m.num_heads) for name, m in attention_layers(model)[0].items()}


def prune_heads(graph: tp.DependencyGraph, attentions: dict[str, nn.Module], importance: tp.importance.Importance,
                share: float, global_ranking: bool, max_layer_ratio: float) -> list[str]:
    """Remove ``share`` of the heads of ``attentions``, whole heads, lowest importance first.

    A head's importance is the mean over its dims of the group importance (torch-pruning's own
    rule). Global ranking compares heads across layers; every layer keeps at least one head and
    the share ``max_layer_ratio`` allows. torch-pruning's own global head pruning is not used:
    its iterative steps fail (1.6.1) on a step that removes no head. Returns the attentions
    whose heads the importance could not rank (kept whole). The pruning lands in ``graph``'s history.
    """
    scores, unranked = {}, []
    for name, attn in attentions.items():
        group = graph.get_pruning_group(attn.proj, tp.prune_linear_in_channels, list(range(attn.proj.in_features)))
        imp = importance(group)
        if imp is None:
            unranked.append(name)
        else:
            scores[name] = imp.detach().float().cpu().view(attn.num_heads, -1).mean(1)
    keep_min = {name: max(1, math.ceil(len(s) * (1 - max_layer_ratio))) for name, s in scores.items()}
    chosen: dict[str, list[int]] = {name: [] for name in scores}
    if global_ranking:
        budget = math.floor(share * sum(len(s) for s in scores.values()))
        ranked = sorted((float(v), name, h) for name, s in scores.items() for h, v in enumerate(s))
        for _, name, head in ranked:
            if budget == 0:
                break
            if len(scores[name]) - len(chosen[name]) > keep_min[name]:
                chosen[name].append(head)
                budget -= 1
    else:
        for name, s in scores.items():
            n = min(math.floor(share * len(s)), len(s) - keep_min[name])
            chosen[name] = torch.argsort(s)[:max(n, 0)].tolist()
    for name, heads in chosen.items():
        if heads:
            attn = attentions[name]
            idxs = [h * attn.head_dim + d for h in sorted(heads) for d in range(attn.head_dim)]
            group = graph.get_pruning_group(attn.proj, tp.prune_linear_in_channels, idxs)
            if graph.check_pruning_group(group):
                group.prune()
                _sync_heads(attn)
    return unranked


@dataclass
class Survey:
    """Which output widths the pruner may change, and why the others stay whole.

    ``not_pruned`` maps a reason to the layers (Conv/Linear by module name, loose parameters by
    name) whose output width it keeps; ``unwrapped`` names the parameters that belong to no
    layer (class token, position embedding, layer scales), which torch-pruning prunes along the
    dimension it infers; ``rankable`` counts the channel groups the importance can rank.
    """

    rankable: int = 0
    not_pruned: dict[str, list[str]] = field(default_factory=dict)
    unwrapped: list[str] = field(default_factory=list)


def survey(model: nn.Module, graph: tp.DependencyGraph, importance: tp.importance.Importance, importance_name: str,
           reasons: dict[nn.Module, str]) -> Survey:
    """Classify every channel group of ``graph`` (built on ``model``) before pruning.

    ``reasons`` gives the layers the pruner is told to ignore, each with why (protected, the
    classifier, attention widths); a group holding one is skipped whole by torch-pruning, so its
    other layers are "coupled to" it. A group the importance returns nothing for (bn_scale on a
    group without BatchNorm) is left whole too. A Conv/Linear in no group at all is one whose
    outputs torch-pruning cannot follow.
    """
    names = {**{m: n for m, n in graph._module2name.items()}, **{p: n for p, n in graph._param_to_name.items()}}
    found = Survey(unwrapped=sorted(f"{names.get(p, '?')} (dim {dim})" for p, dim in graph.unwrapped_parameters or []))
    seen: set = set()
    why: dict[str, str] = {}
    for group in graph.get_all_groups(ignored_layers=[], root_module_types=ROOT_TYPES):
        outs = [dep.target.module for dep, _ in group if graph.is_out_channel_pruning_fn(dep.handler)
                and (isinstance(dep.target.module, ROOT_TYPES) or dep.target.type == tp.ops.OPTYPE.PARAMETER)]
        seen.update(outs)
        blocked = [m for m in outs if m in reasons]
        if blocked:
            coupled = f"coupled to {', '.join(sorted(names.get(m, '?') for m in blocked))}, which is kept whole"
            for m in outs:
                why.setdefault(names.get(m, "?"), reasons.get(m, coupled))
        elif importance(group) is None:
            for m in outs:
                why.setdefault(names.get(m, "?"), f"{importance_name} cannot rank it: no BatchNorm in its channel group")
        else:
            found.rankable += 1
    for name, module in model.named_modules():
        if isinstance(module, ROOT_TYPES) and module not in seen:
            why.setdefault(name, reasons.get(module, "torch-pruning found no channel group for its outputs"))
    for name, reason in sorted(why.items()):
        found.not_pruned.setdefault(reason, []).append(name)
    return found
