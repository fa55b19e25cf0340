"""PyTorch's own x86 INT8 file: a model quantized by torchao's PT2E flow with ``X86InductorQuantizer``, which
Inductor lowers to oneDNN INT8 kernels.

A quantized ``ExportedProgram`` would be the obvious file, but ``torch.export.load`` falls back to unpickling
when its safe load fails, and a model file from elsewhere is never unpickled here. So the file is the float
model as every torch artifact is (safetensors + JSON) plus the calibrated quantizer's state (observers' ranges
and the weights, safetensors) and a JSON recipe. Loading re-captures the float model, re-annotates it with the
same quantizer, loads that state (strictly: a graph that annotated differently refuses) and converts: the same
integers as when it was made, with no code in the file.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from serve_bench.runners.base import RunnerError

logger = logging.getLogger(__name__)

KIND = "pt2e-int8"  # the artifact kind of such a folder
FORMAT = "compress-pt2e-int8/1"
STATE_FILE, RECIPE_FILE = "pt2e_state.safetensors", "pt2e.json"
QUANTIZER = "torchao X86InductorQuantizer, default static config (per-channel int8 weights, uint8 activations)"


def _quantizer():
    try:
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    except ImportError as exc:
        raise RunnerError(f"PyTorch's native INT8 needs torchao's PT2E flow (pip install 'torchao>=0.18'): {exc}") \
            from exc
    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())


def _prepared(model, sample_shape: tuple[int, ...]):
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from export.torch_capture import capture

    try:
        return prepare_pt2e(capture(model.eval().cpu(), torch.zeros(2, *sample_shape)), _quantizer())
    except RunnerError:
        raise
    except Exception as exc:  # torch.export and the quantizer raise many types for models they cannot take
        raise RunnerError(f"torch.export / X86InductorQuantizer could not capture the model: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc


def _converted(prepared):
    from torchao.quantization.pt2e import move_exported_model_to_eval
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    converted = convert_pt2e(prepared)
    move_exported_model_to_eval(converted)
    return converted


def make(model, description: dict, calibration: np.ndarray, folder: str | Path, batch_size: int = 32) -> dict:
    """Quantize ``model`` from the ``calibration`` images (N×C×H×W) into ``folder``; returns the recipe written."""
    import torch
    import torchao
    from safetensors.torch import save_file

    from train.model_io import save_model

    folder = Path(folder)
    shape = tuple(int(d) for d in calibration.shape[1:])
    prepared = _prepared(model, shape)
    with torch.no_grad():
        for start in range(0, len(calibration), batch_size):
            prepared(torch.from_numpy(np.ascontiguousarray(calibration[start:start + batch_size], dtype=np.float32)))
    save_model(model, folder, description)
    state = {k: v.detach().cpu().clone().contiguous() for k, v in prepared.state_dict().items()}
    save_file(state, str(folder / STATE_FILE), metadata={"format": FORMAT})
    recipe = {"format": FORMAT, "quantizer": QUANTIZER, "sample_shape": list(shape),
              "calibration_images": int(len(calibration)), "torch": torch.__version__,
              "torchao": torchao.__version__}
    (folder / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True))
    logger.info("PT2E INT8 file written to %s from %d calibration images", folder, len(calibration))
    return recipe


def is_native_int8(path: str | Path) -> bool:
    return (Path(path) / RECIPE_FILE).is_file()


def load(path: str | Path):
    """The converted (quantized) module of a folder :func:`make` wrote, rebuilt without unpickling."""
    from safetensors.torch import load_file

    from train.model_io import load_model

    folder = Path(path)
    try:
        recipe = json.loads((folder / RECIPE_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunnerError(f"{folder / RECIPE_FILE} cannot be read ({exc}); re-run the stage that made it") from exc
    if recipe.get("format") != FORMAT:
        raise RunnerError(f"{folder / RECIPE_FILE}: format {recipe.get('format')!r} is not {FORMAT!r}; re-run the "
                          "stage that made it")
    import torch
    import torchao

    here = {"torch": torch.__version__, "torchao": torchao.__version__}
    moved = {k: (recipe.get(k), v) for k, v in here.items() if recipe.get(k) != v}
    if moved:  # the same state, annotated and converted by another version: loads, but may not compute the same
        logger.warning("%s: made with %s, rebuilt with %s; the quantize stage's red-line check was made on the "
                       "former (the bench measures this file's accuracy again, and the gate reads that)", folder,
                       ", ".join(f"{k} {old}" for k, (old, _) in moved.items()),
                       ", ".join(f"{k} {new}" for k, (_, new) in moved.items()))
    model, _ = load_model(folder)
    prepared = _prepared(model, tuple(recipe["sample_shape"]))
    try:
        prepared.load_state_dict(load_file(str(folder / STATE_FILE)), strict=True)
    except RuntimeError as exc:
        raise RunnerError(f"{folder / STATE_FILE} does not fit the model as this torch/torchao annotates it (made "
                          f"with torch {recipe.get('torch')}, torchao {recipe.get('torchao')}): "
                          f"{str(exc).splitlines()[0][:300]}; re-run the quantize stage here") from exc
    return _converted(prepared)
