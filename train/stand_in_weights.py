"""Writes a state dict shaped like a downloaded pretrained checkpoint (1,000 ImageNet classes by default), for
trying the path a user's pretrained backbone takes on a machine that cannot download one.

A user starts from ImageNet weights and their own classes: ``model.weights`` holds a classifier for
1,000 classes, the data has 10, and the model stage loads every other tensor and re-makes the head.
That path depends on the checkpoint's shapes and key names, not its values, so a seeded, freshly
initialised model of the same architecture stands in for the download here. Its values carry no
pretraining: accuracy comes from the pipeline's own training on the user's classes.

    python -m train.stand_in_weights runs/mobilenetv3_large_100-1000.safetensors \\
        --model timm:mobilenetv3_large_100 --classes 1000
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from train.atomic_io import atomic_path
from train.models import build_model

logger = logging.getLogger(__name__)


def write_stand_in(out: str | Path, model: str, classes: int = 1000, channels: int = 3, seed: int = 0) -> Path:
    """Save ``model`` freshly initialised (seeded) for ``classes`` classes as safetensors at ``out`` (atomically)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    net = build_model(model, classes, channels)
    state = {k: v.detach().contiguous() for k, v in net.state_dict().items()}
    out = Path(out)
    with atomic_path(out) as tmp:
        save_file(state, str(tmp), metadata={"model": model, "classes": str(classes), "stand_in": "freshly initialised"})
    logger.info("wrote %s: %s for %d classes, %d tensors", out, model, classes, len(state))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--model", required=True, help="an architecture model.name accepts (e.g. resnet18, timm:…)")
    parser.add_argument("--classes", type=int, default=1000, help="the checkpoint's class count (default 1000)")
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_stand_in(args.out, args.model, args.classes, args.channels, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
