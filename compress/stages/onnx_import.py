"""An ONNX classifier trained elsewhere, brought into a run: checked, fitted to the data, measured, labelled.

What a user's file must be to go through quantize, export and bench: one float32 N×C×H×W image
input whose C, H and W match the data (a file exported at another size is refused with the sizes
to set), one output of one score per class, and a batch axis the runtimes can vary. A plain
``torch.onnx.export`` fixes the batch at the example's size, in the input and output shapes and in
the Reshape of a flatten: such a file is given a symbolic batch axis there (a Reshape target that
starts with the batch infers that axis instead), and kept only where the result, fed several
images at once, gives the logits the user's file gives at its own batch size; a graph that bakes the
batch in elsewhere is refused with the re-export to do. External-data locations
that leave the file's folder are refused before anything else is read.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto

from compress import __version__
from compress.errors import ConfigError, DataMismatchError
from compress.quantization import measure as int8_measure
from compress.stages.base import StageContext
from compress.stages.data_match import preprocessing_difference
from export.external_data import UnsafeModelError, check_external_data
from export.onnx_metadata import DATA_KEY, PREPROCESSING_KEY, deployment_properties, read_metadata, write_metadata
from train.data import DataBundle

logger = logging.getLogger(__name__)
BATCH_AXIS = "N"
_EXTERNAL_LIMIT = 1_800_000_000  # protobuf's 2 GiB ceiling, with room: larger files keep external data


@dataclass
class ImportedOnnx:
    meta: dict  # the artifact's manifest metadata
    test: dict  # accuracies on the test split
    shape: list  # the input's dims as the file states them


def _fail(source: Path, message: str) -> ConfigError:
    return ConfigError(f"model.onnx: {source}: {message}")


def _dims(value: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value.type.tensor_type.shape.dim]


def _image_input(source: Path, model: onnx.ModelProto, data: DataBundle) -> onnx.ValueInfoProto:
    initializers = {i.name for i in model.graph.initializer}
    feeds = [i for i in model.graph.input if i.name not in initializers]
    if len(feeds) != 1:
        raise _fail(source, f"it has {len(feeds)} inputs ({', '.join(i.name for i in feeds)}); the runtimes here "
                            "feed one N×C×H×W float32 image tensor: export the model with a single image input")
    feed = feeds[0]
    elem = feed.type.tensor_type.elem_type
    if elem != TensorProto.FLOAT:
        raise _fail(source, f"input {feed.name!r} is {TensorProto.DataType.Name(elem)}; the images are fed as float32 "
                            "(an fp16 file: export it with float32 inputs and outputs)")
    dims = _dims(feed)
    if len(dims) != 4:
        raise _fail(source, f"input {feed.name!r} has shape {dims}; an N×C×H×W image tensor is expected")
    for axis, got, want in zip(("channels", "height", "width"), dims[1:], data.input_shape):
        if isinstance(got, int) and got != want:
            raise _fail(source, f"input {feed.name!r} has shape {dims}: {axis} {got}, but the data gives {want} "
                                f"({'×'.join(map(str, data.input_shape))}); set data.image_size and data.channels to "
                                "the size the model was exported at, or export it at the data's size")
    return feed


def _reshape_targets(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.TensorProto]]:
    """The Reshape nodes with a constant target shape (an initializer or a Constant node), with that shape."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    constants = {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"}
    return [(n, t) for n in graph.node if n.op_type == "Reshape" and len(n.input) > 1
            for t in [initializers.get(n.input[1]) or constants.get(n.input[1])] if t is not None]


def _free_target(node: onnx.NodeProto, target: onnx.TensorProto, batch: int) -> None:
    """A Reshape target that starts with the batch: ``-1`` there (inferred), or where another axis is
    already inferred, ``0`` with ``allowzero`` off (copy the input's first axis)."""
    shape = onnx.numpy_helper.to_array(target)
    if shape.ndim != 1 or len(shape) < 2 or int(shape[0]) != batch:
        return
    rest = [int(v) for v in shape[1:]]
    shape = shape.copy()
    if -1 not in rest:
        shape[0] = -1
    elif 0 not in rest:
        shape[0] = 0
        for attribute in node.attribute:
            if attribute.name == "allowzero":
                attribute.i = 0
    else:
        return
    target.CopyFrom(onnx.numpy_helper.from_array(shape, target.name))


def _free_batch(model: onnx.ModelProto, batch: int) -> bool:
    """Make a fixed batch axis symbolic: on the graph's input and outputs, and in the Reshape targets that
    start with it (a flatten exported at batch 1). Whether that was right is checked afterwards against
    the original file's logits."""
    fixed = False
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH_AXIS  # clears dim_value (a oneof)
            fixed = True
    if not fixed:
        return False
    for node, target in _reshape_targets(model):
        _free_target(node, target, batch)
    del model.graph.value_info[:]  # shapes inferred at the fixed batch would contradict the new axis
    return True


def _save(model: onnx.ModelProto, path: Path) -> list[str]:
    if model.ByteSize() > _EXTERNAL_LIMIT:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data")
        return [path.name, path.name + ".data"]
    onnx.save(model, str(path))
    return [path.name]


def _check_batches(source: Path, path: Path, images: np.ndarray, num_classes: int, batch: int) -> None:
    """The written file must give, one image at a time, all at once and at an odd size, one score per class:
    the logits the user's own file gives fed at its own batch size, ``batch``."""
    one = int8_measure.logits(source, images, batch_size=batch)  # one session, fed in batches of its own size
    if one.ndim != 2 or one.shape != (len(images), num_classes):
        raise _fail(source, f"its output has shape {list(one.shape)} for {len(images)} images; one score per class "
                            f"({num_classes} classes in the data) is expected")
    scale = max(float(np.abs(one).max()), 1e-6)
    for size in sorted({1, len(images), len(images) - 1}):
        try:
            got = int8_measure.logits(path, images[:size * (len(images) // size)], batch_size=size)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument/RuntimeException types
            raise _fail(source, f"its batch axis is fixed inside the graph (batch {size} fails: "
                                f"{str(exc).splitlines()[0][:200]}); re-export it with a dynamic batch axis, e.g. "
                                "torch.onnx.export(..., dynamic_axes={'input': {0: 'N'}, 'output': {0: 'N'}})") from exc
        want = one[:len(got)]
        if got.shape != want.shape or float(np.abs(got - want).max()) / scale > 1e-4:
            raise _fail(source, f"at batch {size} it gives other logits than the file itself at batch {batch}, so its "
                                "batch axis is baked into the graph; re-export it with a dynamic batch axis, e.g. "
                                "torch.onnx.export(..., dynamic_axes={'input': {0: 'N'}, 'output': {0: 'N'}})")


def import_onnx(source: Path, folder: Path, data: DataBundle, ctx: StageContext, origin: dict,
                test_x: np.ndarray, test_y: np.ndarray) -> ImportedOnnx:
    """Check ``source`` against ``data``, write it labelled into ``folder``, measure it on the test split."""
    if not source.is_file():
        raise _fail(source, "no such file; give the path of an .onnx file")
    try:
        check_external_data(source)
    except UnsafeModelError as exc:
        raise ConfigError(f"model.onnx: {exc}") from exc
    try:
        onnx.checker.check_model(str(source))
    except onnx.checker.ValidationError as exc:
        raise _fail(source, f"onnx's checker refuses it ({str(exc).splitlines()[0][:200]}); re-export it") from exc
    except Exception as exc:  # a truncated or non-ONNX file: protobuf's DecodeError and friends
        raise _fail(source, f"not a readable ONNX file ({type(exc).__name__}: {str(exc)[:200]})") from exc
    props = read_metadata(source)
    identity = json.loads(props[DATA_KEY]) if DATA_KEY in props else None
    if identity and identity.get("split_digest") != data.digest() and origin["test_independence"] == "unknown":
        raise DataMismatchError(
            f"model.onnx: {source} records that it was made on data split {str(identity.get('split_digest'))[:12]}… "
            f"({identity.get('name')}, sizes {identity.get('sizes')}), not this run's {data.digest()[:12]}…: its test "
            "images can be images it trained on. Use the data section it was made with, give a test folder of your "
            "own (data.test_path), or, only if the test images are new to it, set data.independent_test: true")
    recorded = props.get(PREPROCESSING_KEY)
    if recorded:  # a file made by this project states what it expects
        differ = preprocessing_difference(json.loads(recorded), data.preprocessing())
        if differ:
            raise _fail(source, f"it records other input preprocessing than the data gives ({'; '.join(differ)}); "
                                "set data.image_size, data.channels, data.mean and data.std to its values")
    model = onnx.load(str(source))
    feed = _image_input(source, model, data)
    shape = _dims(feed)
    fixed_batch = shape[0] if isinstance(shape[0], int) else None
    made_dynamic = _free_batch(model, fixed_batch or 1)
    path = folder / "model.onnx"
    files = _save(model, path)
    own = fixed_batch or 1
    _check_batches(source, path, test_x[:own * max(3, -(-5 // own))], data.num_classes, own)
    # every float initializer: weights, biases, norms (folded batch statistics included), as near as a graph
    # comes to torch's parameter count
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                 if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16))
    description = {"architecture": {"name": f"onnx:{source.name}", "num_classes": data.num_classes,
                                    "in_channels": data.input_shape[0]},
                   "preprocessing": data.preprocessing(), "data": data.identity(), "origin": origin}
    lineage = {"source_model": str(source.name), "source_sha256": origin.get("sha256"),
               "data_split_digest": data.digest()}
    write_metadata(path, deployment_properties(preprocessing=data.preprocessing(), class_names=data.class_names,
                                               lineage=lineage, version=__version__, data_identity=data.identity()))
    test = int8_measure.split_accuracy(path, test_x, test_y)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if made_dynamic:
        ctx.log(f"{source.name}: its batch axis was fixed at {fixed_batch}; made symbolic, and batch 4 gives the "
                "file's own logits")
    meta = {"file": "model.onnx", "files": files, "opset": opset, "precision": "fp32", "io_dtype": "fp32",
            "input_name": feed.name, "output_name": model.graph.output[0].name, "dynamic_batch": True,
            "batch_made_dynamic": made_dynamic, "preprocessing": data.preprocessing(),
            "num_classes": data.num_classes, "params": params, "macs": None,
            "test_top1": round(float(test["top1"]), 3), "description": description}
    return ImportedOnnx(meta=meta, test=test, shape=shape)
