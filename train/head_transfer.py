"""Weights trained on other classes, loaded into a model built for the data's: everything but the classifier.

Almost every production vision model is a backbone pretrained on ImageNet (or in-house data) and
finetuned on the user's classes. A state dict of 1,000 classes onto a model built for 10 fits in
every tensor but the classifier's; refusing it at the first mismatched key left the user to write a
loader by hand. Here the classifier is found (a name the user gives; timm's ``get_classifier()``,
the module its ``reset_classifier`` re-makes; else the model's last ``nn.Linear``, which is
torchvision's ``fc`` or ``classifier[-1]``), every other tensor is loaded as it is, and the classifier
keeps the fresh initialisation the builder gave it for the data's class count. Anything else that
does not fit is still refused, with the key, because a backbone that does not fit is a wrong file,
not a transfer.

``head``: ``auto`` re-makes the classifier only where it does not fit; ``keep`` refuses instead (a
user who expects their own classes); ``reset`` re-makes it even where it fits (the same count of
other classes).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)

HEADS = ("auto", "keep", "reset")


class HeadMismatch(ValueError):
    """The weights do not fit the model, and re-making the classifier would not make them fit (or is not wanted)."""


@dataclass
class Transfer:
    """What loading left out: the classifier re-made for the data, and the file's tensors not loaded."""

    classifier: str
    left_out: dict[str, list[int]]  # key → its shape in the file
    made_for: dict[str, list[int]]  # key → its shape in the model built for the data
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Transfer":
        """A transfer as a model's description records it (``transfer``, with the weights file beside)."""
        return cls(**{k: record[k] for k in ("classifier", "left_out", "made_for", "reason")})

    def words(self) -> str:
        left = ", ".join(f"{k} {shape}" for k, shape in self.left_out.items()) or "nothing"
        return f"{self.classifier!r} re-made for the data ({self.reason}; left out: {left})"


def classifier_name(model: nn.Module, named: str | None = None) -> str:
    """The module that maps features to classes: ``named``, timm's ``get_classifier()``, else the last Linear."""
    modules = dict(model.named_modules())
    if named is not None:
        if named not in modules or named == "":
            raise HeadMismatch(f"model.classifier: the model has no module named {named!r}; its last layers are "
                               f"{', '.join(list(n for n in modules if n)[-4:])}")
        return named
    get = getattr(model, "get_classifier", None)
    head = get() if callable(get) else None
    if isinstance(head, nn.Module) and any(True for _ in head.parameters()):
        found = next((n for n, m in modules.items() if m is head), None)
        if found:
            return found
    linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
    if not linears:
        raise HeadMismatch("cannot tell which layer is the classifier (no get_classifier(), no nn.Linear): name it "
                           "with model.classifier")
    return linears[-1]


def load_for_data(model: nn.Module, state: dict[str, torch.Tensor], head: str = "auto",
                  classifier: str | None = None) -> Transfer | None:
    """Load ``state`` into ``model`` (built for the data's classes). Returns what was re-made (None: the file fit
    as a whole); raises HeadMismatch naming the key where it cannot be loaded."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
    own = model.state_dict()
    misfit = {k: (list(state[k].shape), list(own[k].shape)) for k in state
              if k in own and state[k].shape != own[k].shape}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if head != "reset" and not (misfit or missing or unexpected):
        model.load_state_dict(state, strict=True)
        return None
    if head == "keep":
        raise HeadMismatch(_first_problem(misfit, missing, unexpected) + " (model.head: keep refuses a classifier "
                           "that does not fit; head: auto re-makes it for the data)")
    name = classifier_name(model, classifier)
    prefix = f"{name}."
    outside = _first_problem({k: v for k, v in misfit.items() if not k.startswith(prefix)},
                             [k for k in missing if not k.startswith(prefix)],
                             [k for k in unexpected if not k.startswith(prefix)], required=False)
    if outside:
        raise HeadMismatch(f"{outside}: outside the classifier {name!r}, so this is not a file of the same "
                           "architecture trained on other classes")
    loaded = {k: v for k, v in state.items() if not k.startswith(prefix)}
    result = model.load_state_dict(loaded, strict=False)
    assert all(k.startswith(prefix) for k in result.missing_keys) and not result.unexpected_keys
    left_out = {k: list(v.shape) for k, v in state.items() if k.startswith(prefix)}
    made_for = {k: list(v.shape) for k, v in own.items() if k.startswith(prefix)}
    reason = ("model.head: reset" if head == "reset" and not misfit else
              "its shape in the file is " + ", ".join(f"{k} {a} against {b}" for k, (a, b) in misfit.items()
                                                      if k.startswith(prefix)) if misfit else "absent from the file")
    transfer = Transfer(name, left_out, made_for, reason)
    logger.info("weights loaded but for the classifier: %s", transfer.words())
    return transfer


def _first_problem(misfit: dict, missing: list[str], unexpected: list[str], required: bool = True) -> str:
    if misfit:
        key, (theirs, ours) = next(iter(misfit.items()))
        return f"{key} is {theirs} in the weights file and {ours} in the model"
    if missing:
        return f"{missing[0]} is missing from the weights file" + (f" (and {len(missing) - 1} more)"
                                                                   if len(missing) > 1 else "")
    if unexpected:
        return f"{unexpected[0]} in the weights file is not in the model" + (
            f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else "")
    return "" if not required else "the weights file fits"


def freeze_all_but(model: nn.Module, name: str) -> list[nn.Parameter]:
    """Parameters outside module ``name`` stop taking gradients (the head-first schedule's first phase); returns
    them, to be given back with ``requires_grad_(True)``."""
    prefix = f"{name}."
    frozen = [p for n, p in model.named_parameters() if not n.startswith(prefix) and p.requires_grad]
    for param in frozen:
        param.requires_grad_(False)
    return frozen
