"""Models by name: torchvision classifiers, the CIFAR ResNets, timm's ``timm:<name>``, or a user's
``module:callable``.

A model is always rebuilt from (name, arguments), never unpickled; the class count and
input channels come from the data set so one pipeline file works on any data. Nothing is
ever downloaded: pretrained weights come from the pipeline's ``model.weights`` file.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from train import cifar_resnet
from train.detection.model import tiny_fcos
from train.detection.torchvision_ssdlite import ssdlite_mobilenet_v3
from train.errors import TrainError
from train.segmentation.models import SMP_PREFIX, TORCHVISION_SEGMENTERS, smp_segmenter, tiny_segmenter, \
    torchvision_segmenter


class ModelError(TrainError):
    bad_input = True
    """A model name, its arguments or its weights file is wrong; the message says how to fix it."""


_CIFAR = {"resnet20": cifar_resnet.resnet20, "resnet32": cifar_resnet.resnet32, "resnet56": cifar_resnet.resnet56,
          "tiny_fcos": tiny_fcos,  # the project's own small models; tiny_fcos and ssdlite: detectors (task: detection)
          "ssdlite_mobilenet_v3": ssdlite_mobilenet_v3,
          "tiny_segmenter": tiny_segmenter}  # task: segmentation, as are torchvision's segmenters and smp:<Arch>


def _torchvision_builders() -> dict[str, Callable[..., nn.Module]]:
    from torchvision import models as tvm

    return {name: tvm.get_model_builder(name) for name in tvm.list_models(module=tvm)}


def known_models() -> list[str]:
    """The registry's names; timm's ~1,300 are written ``timm:<name>`` and listed by timm.list_models()."""
    return sorted(_CIFAR) + sorted(TORCHVISION_SEGMENTERS) + sorted(_torchvision_builders())


TIMM_PREFIX = "timm:"
# Arguments the pipeline decides, never the model section: the data gives the class count and
# channels, and weights only ever come from model.weights (timm would download or unpickle them).
_TIMM_RESERVED = {"pretrained": "timm weights are never downloaded; give a local state dict as model.weights",
                  "checkpoint_path": "give the weights file as model.weights (read without unpickling)",
                  "pretrained_cfg_overlay": "weights come from model.weights, not from a pretrained config",
                  "num_classes": "the class count comes from the data",
                  "in_chans": "the input channels come from the data (data.channels)"}


def _unknown(name: str) -> ModelError:
    return ModelError(f"model.name {name!r} is not known; use one of {', '.join(known_models())}, "
                      "'timm:<name>' or 'package.module:callable'")


def _timm():
    try:
        import timm
    except ImportError as exc:
        raise ModelError(f"model.name 'timm:…' needs the timm package, which is not installed ({exc}); "
                         "pip install timm") from exc
    return timm


def _timm_name(spec: str) -> str:
    """The timm architecture a ``timm:<name>`` spec names; ModelError with close matches if timm has none."""
    timm, name = _timm(), spec[len(TIMM_PREFIX):]
    if not name:
        raise ModelError(f"model.name {spec!r}: write 'timm:<name>', e.g. 'timm:convnext_atto'")
    if timm.is_model(name):
        return name
    # Candidates sharing the family prefix first (timm.list_models takes a wildcard pattern), so
    # 'convnext_atom' suggests the ConvNeXts; the whole list when the prefix itself is misspelt.
    family = timm.list_models(f"{name.split('_')[0]}*")
    close = (difflib.get_close_matches(name, family, n=5, cutoff=0.5)
             or difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.5))
    hint = f"close matches: {', '.join(TIMM_PREFIX + c for c in close)}" if close else \
        "timm.list_models('<pattern>*') lists the names"
    raise ModelError(f"model.name {spec!r}: timm {timm.__version__} has no model {name!r}; {hint}")


def _timm_builder(spec: str, num_classes: int, in_channels: int, args: dict) -> Callable[[], nn.Module]:
    name = _timm_name(spec)
    for key, why in _TIMM_RESERVED.items():
        if key in args:
            raise ModelError(f"model.args.{key} is not accepted for {spec!r}: {why}")
    import timm

    def build() -> nn.Module:
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_channels, **args)
        heads_follow_weights(model)
        return model

    return build


_SHAPED: dict[type, type] = {}


def _attention_macs(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
    """torch-pruning's MACs counter hook for the weight-shaped Attention. The counter does not look
    inside a module it has a hook for, so this counts all of it: the qkv, proj (and gate) Linears,
    and the two matmuls per head (QKᵀ and AV) that no Linear holds."""
    batch, tokens = inputs[0].shape[0], inputs[0].shape[1]
    linears = [m for m in (module.qkv, getattr(module, "gate", None), module.proj) if isinstance(m, nn.Linear)]
    per_token = sum(m.in_features * m.out_features for m in linears) + 2 * module.num_heads * tokens * module.head_dim
    module.__flops__ += int(batch * tokens * per_token)


def _shaped_attention(base: type) -> type:
    if base not in _SHAPED:
        _SHAPED[base] = type(base.__name__, (base,), {
            "__module__": base.__module__,
            "__doc__": f"{base.__doc__ or ''}\n\nHead count read from the qkv weights (train.models.heads_follow_weights).",
            "num_heads": property(lambda self: self.qkv.out_features // (3 * self.head_dim)),
            "attn_dim": property(lambda self: self.qkv.out_features // 3),
        })
        try:  # torch-pruning's MACs counter looks hooks up by exact type; without one it counts no matmul
            from torch_pruning.utils import op_counter
        except ImportError:
            pass
        else:
            op_counter.MODULES_MAPPING.setdefault(_SHAPED[base], _attention_macs)
    return _SHAPED[base]


def heads_follow_weights(model: nn.Module) -> None:
    """Make every timm ``Attention`` in ``model`` read its head count from its qkv weights.

    Why: a pruned model is saved as weights plus its pruning history and rebuilt by replaying
    that history on a fresh model (train.model_io). Replay resizes the qkv and proj Linears, but
    timm's Attention keeps ``num_heads`` and ``attn_dim`` as plain ints set once in __init__,
    which nothing would update, and its forward reshapes by them. With the head width fixed
    (pruning removes whole heads only) both follow from qkv's width, so they are right on the
    pruned model, after every reload, and in an exported graph, with nothing more to record.
    """
    try:
        from timm.layers import Attention
    except ImportError:
        return
    for module in model.modules():
        if type(module) is Attention:
            module.__class__ = _shaped_attention(Attention)
            for attr in ("num_heads", "attn_dim"):
                module.__dict__.pop(attr, None)


def _resolve_callable(spec: str) -> Callable[..., nn.Module]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ModelError(f"model.name {spec!r}: a user model is written 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"model.name {spec!r}: cannot import module {module_name!r} ({exc}); is it on PYTHONPATH?") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ModelError(f"model.name {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ModelError(f"model.name {spec!r}: {attr!r} is not callable")
    return target


def code_file(spec: str) -> Path | None:
    """The source file of a user model's module ('package.module:callable'), found without running it.

    None for the registry's models (their code is the installed packages', versioned) and for a
    module that cannot be found (building the model will say why).
    """
    module_name, sep, _ = spec.partition(":")
    if not sep or not module_name or spec.startswith(TIMM_PREFIX):
        return None
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not Path(found.origin).is_file():
        return None
    return Path(found.origin)


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_model(name: str, in_channels: int | None, weights: str | None = None) -> None:
    """What can be known about a model section without building it: the name resolves (a registry
    model, a timm architecture, or a user callable that imports), a torchvision model gets
    3-channel input, the weights file exists. Raises ModelError with the fix. A timm model takes
    any channel count (timm adapts its stem to ``in_chans``)."""
    if name.startswith(TIMM_PREFIX):
        _timm_name(name)
    elif name.startswith(SMP_PREFIX) or name in TORCHVISION_SEGMENTERS:
        if in_channels is not None and in_channels != 3 and name in TORCHVISION_SEGMENTERS:
            raise ModelError(f"model.name {name!r} is a torchvision segmenter and expects 3-channel input, the data "
                             f"has {in_channels}; set data.channels: 3")
    elif ":" in name:
        _resolve_callable(name)
    elif name not in _CIFAR:
        if name not in _torchvision_builders():
            raise _unknown(name)
        if in_channels is not None and in_channels != 3:
            raise ModelError(f"model.name {name!r} is a torchvision model and expects 3-channel input, the data has "
                             f"{in_channels}; set data.channels: 3")
    if weights and not Path(weights).is_file():
        raise ModelError(f"model.weights: {weights} does not exist; give a local .safetensors or .pt state dict")


def build_model(name: str, num_classes: int, in_channels: int, args: dict | None = None) -> nn.Module:
    """Construct a freshly initialised model; raises ModelError with the fix on bad input.

    ``timm:<name>`` is ``timm.create_model(name, pretrained=False, num_classes, in_chans, **args)``:
    never a download (weights come from model.weights, loaded by the caller).
    """
    args = dict(args or {})
    rejects: tuple[type[Exception], ...] = (TypeError,)
    if name.startswith(TIMM_PREFIX):
        builder: Callable[..., nn.Module] = _timm_builder(name, num_classes, in_channels, args)
        kwargs: dict = {}
        # timm checks shapes with asserts and ValueErrors (embed_dim not divisible by num_heads, …).
        rejects = (TypeError, ValueError, AssertionError)
    elif name in _CIFAR:
        builder = _CIFAR[name]
        kwargs = {"num_classes": num_classes, "in_channels": in_channels, **args}
    elif name.startswith(SMP_PREFIX):
        def builder(**kw):
            return smp_segmenter(name, **kw)
        kwargs = {"num_classes": num_classes, "in_channels": in_channels, **args}
        rejects = (TypeError, ValueError, KeyError, ImportError)
    elif name in TORCHVISION_SEGMENTERS:
        if in_channels != 3:
            raise ModelError(f"model.name {name!r} is a torchvision segmenter and expects 3-channel input, the data "
                             f"has {in_channels}; set data.channels: 3")

        def builder(**kw):
            return torchvision_segmenter(name, **kw)
        kwargs = {"num_classes": num_classes, **args}
        rejects = (TypeError, ValueError)
    elif ":" in name:
        builder = _resolve_callable(name)
        kwargs = dict(args)
        if _accepts(builder, "num_classes"):
            kwargs.setdefault("num_classes", num_classes)
        if _accepts(builder, "in_channels"):
            kwargs.setdefault("in_channels", in_channels)
    else:
        builders = _torchvision_builders()
        if name not in builders:
            raise _unknown(name)
        if in_channels != 3:
            raise ModelError(
                f"model.name {name!r} is a torchvision model and expects 3-channel input, the data has {in_channels}; "
                "set data.channels: 3"
            )
        builder = builders[name]
        kwargs = {"weights": None, "num_classes": num_classes, **args}
    try:
        model = builder(**kwargs)
    except rejects as exc:
        raise ModelError(f"model {name!r} rejected its arguments {sorted(kwargs or args)}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a weights file without ever unpickling code (safetensors, or torch with weights_only)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model.weights: {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise ModelError(f"model.weights: {path} is not a readable safetensors file ({exc}); re-export it with "
                             "safetensors.torch.save_file") from exc
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for bad files
        raise ModelError(
            f"model.weights: {path} is not a plain state dict ({type(exc).__name__}); save it with "
            "torch.save(model.state_dict(), path) or as .safetensors; pickled modules are refused"
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"model.weights: {path} does not hold a state dict of tensors")
    return state


def load_weights(model: nn.Module, path: str | Path) -> None:
    state = load_state_dict_file(path)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelError(f"model.weights: {path} does not fit the model: {str(exc).splitlines()[0]}") from exc


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward pass at batch 1 (torch-pruning's counter)."""
    import torch_pruning as tp

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        macs, _ = tp.utils.count_ops_and_params(model, torch.zeros(1, *input_shape, device=device))
    finally:
        model.train(was_training)
    return int(macs)
