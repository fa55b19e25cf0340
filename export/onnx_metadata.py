"""Key/value metadata carried inside an ONNX file (its ``metadata_props``), read back with onnx alone.

A file handed to another stage, machine or person must say what it was made for: which data
split it was judged and calibrated on and how its input is preprocessed. Anything kept only in
a run directory's manifest is lost when the file travels; the file's own properties are not.
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx

DATA_KEY = "compress.data"  # the data identity: name, split digest, split sizes, preprocessing
# What a deployer needs to feed the file and to trust it, each a JSON value (the version a plain string).
PREPROCESSING_KEY = "compress.preprocessing"
CLASSES_KEY = "compress.classes"
LINEAGE_KEY = "compress.lineage"
VERSION_KEY = "compress.version"
QUANTIZATION_KEY = "compress.quantization"
# How an image becomes the input tensor, in words a reader without this project can follow.
RESIZE = "bilinear, the whole image to width x height (no crop)"
# Data read into a square frame (detection, segmentation) states how: its boxes or masks come back in that frame.
RESIZE_FRAMED = {"letterbox": "letterbox: bilinear, the longest side to width (aspect kept), centred on a square "
                              "of pad_value grey; boxes and masks come back in that square's pixels",
                 "stretch": "stretch: bilinear, the whole image to width x height; boxes and masks come back in those "
                            "pixels"}
FORMULA = "x[c] = (pixel[c] / pixel_divisor - mean[c]) / std[c] in float32, pixel the 0..255 value"


def read_metadata(path: str | Path) -> dict[str, str]:
    model = onnx.load(str(path), load_external_data=False)
    return {prop.key: prop.value for prop in model.metadata_props}


def write_metadata(path: str | Path, props: dict[str, str]) -> None:
    """Set ``props`` (replacing same-named ones) in place; the weights are not touched or loaded:
    a file with external data keeps pointing at the same data files."""
    model = onnx.load(str(path), load_external_data=False)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    for key, value in [*kept, *props.items()]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))


def read_data_identity(path: str | Path) -> dict | None:
    value = read_metadata(path).get(DATA_KEY)
    return json.loads(value) if value else None


def input_description(preprocessing: dict) -> dict:
    """The data's preprocessing (channels, height, width, scale, mean, std) completed with what the
    exported graph fixes (the NCHW layout, the colour mode the channels mean) and the divisor the
    training data path really divides by: ``pixel * scale`` differs from ``pixel / 255`` in the
    last bit for half the pixel values, and a reader should get the tensors the model was judged on."""
    return {**preprocessing, "pixel_divisor": round(1 / preprocessing["scale"]), "layout": "NCHW",
            "color": "L" if preprocessing["channels"] == 1 else "RGB", "formula": FORMULA,
            "resize": preprocessing["resize"] if "resize" in preprocessing else RESIZE,
            **({"resize_how": RESIZE_FRAMED[preprocessing["resize"]]} if "resize" in preprocessing else {})}


def deployment_properties(*, preprocessing: dict, class_names: list[str], lineage: dict, version: str,
                          quantization: dict | None = None, data_identity: dict | None = None) -> dict[str, str]:
    """Every property a file written by this project carries, ready for ``write_metadata``."""
    props = {PREPROCESSING_KEY: json.dumps(input_description(preprocessing), sort_keys=True),
             CLASSES_KEY: json.dumps(list(class_names)), LINEAGE_KEY: json.dumps(lineage, sort_keys=True),
             VERSION_KEY: version}
    if quantization is not None:
        props[QUANTIZATION_KEY] = json.dumps(quantization, sort_keys=True)
    if data_identity is not None:
        props[DATA_KEY] = json.dumps(data_identity, sort_keys=True)
    return props


def read_deployment(path: str | Path) -> dict:
    """The properties of ``deployment_properties`` parsed back (absent ones left out)."""
    props = read_metadata(path)
    parsed = {key: json.loads(props[key]) for key in (PREPROCESSING_KEY, CLASSES_KEY, LINEAGE_KEY,
                                                      QUANTIZATION_KEY, DATA_KEY) if key in props}
    if VERSION_KEY in props:
        parsed[VERSION_KEY] = props[VERSION_KEY]
    return parsed
