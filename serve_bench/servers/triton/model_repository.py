"""A Triton model repository for a released file: ``<repository>/<model>/config.pbtxt`` and the file in ``1/``.

Written with Triton's own schema (``tritonclient``'s ``model_config_pb2.ModelConfig``, printed by protobuf's
``text_format``), from the serving settings that were measured: ``max_batch_size`` and the dynamic batcher's
queue delay are the bench's batcher's, ``instance_group`` its model copies, the backend's thread parameter its
intra-op threads. The tensors are the file's own (serve_bench.servers.tensors). The check parses a
``config.pbtxt`` with the same schema (an unknown field or enum value is refused, as Triton refuses it) and
compares every tensor with the file in the version folder, so a repository that would not load is caught
before it ships.

The bench's batcher and Triton's agree on what a batch is: the oldest request waits at most the queue delay
for others, and a batch goes as soon as it is full (``preferred_batch_size`` is the max batch; without it
Triton also sends the largest batch it can form at once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from serve_bench.servers.tensors import ServedFileError, TensorSpec, batchable

CONFIG_FILE = "config.pbtxt"
VERSION = "1"


@dataclass(frozen=True)
class TritonBackend:
    """How Triton runs a runtime's file: its platform or backend, the model file's name in the version folder,
    where its instances run and the parameter that sets a runtime's intra-op threads (each runtime's runner says,
    as ``triton_backend``)."""

    platform: str = ""
    backend: str = ""
    model_file: str = "model.onnx"
    kind: str = "KIND_CPU"
    threads_parameter: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)


def backends() -> dict[str, TritonBackend]:
    """The runtimes some Triton backend runs → that backend."""
    from serve_bench.runners import RUNNERS

    return {name: TritonBackend(**runner.triton_backend) for name, runner in RUNNERS.items()
            if runner.triton_backend is not None}


def _schema():
    """Triton's ``ModelConfig`` message, from the client library (imported here: only releases and checks need
    it)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise ServedFileError("Triton's model-configuration schema needs tritonclient: pip install "
                              "'tritonclient[grpc]'") from exc
    return model_config_pb2


def model_config(name: str, runtime: str, inputs: list[TensorSpec], outputs: list[TensorSpec], *, max_batch: int,
                 queue_delay_us: int, instances: int, threads: int | None, max_queue: int | None = None):
    """The ``ModelConfig`` of one model: tensors from the file, batching and instances from the measured serving
    settings. A file without an open batch dimension is served unbatched (``max_batch_size`` 0, full dims)."""
    pb = _schema()
    known = backends()
    backend = known.get(runtime)
    if backend is None:
        raise ServedFileError(f"Triton has no native backend for {runtime!r} files here; known: {', '.join(known)}")
    config = pb.ModelConfig(name=name, platform=backend.platform, backend=backend.backend,
                            default_model_filename=backend.model_file)
    batched = batchable(inputs, outputs)
    config.max_batch_size = max_batch if batched else 0
    for target, specs in ((config.input, inputs), (config.output, outputs)):
        for spec in specs:
            tensor = target.add(name=spec.name, data_type=_data_type(pb, spec.dtype))
            tensor.dims.extend(spec.per_request() if batched else spec.shape)
    if batched:
        batching = config.dynamic_batching
        batching.max_queue_delay_microseconds = queue_delay_us
        if max_batch > 1:
            batching.preferred_batch_size.append(max_batch)
        if max_queue is not None:
            batching.default_queue_policy.max_queue_size = max_queue
    config.instance_group.add(count=instances, kind=pb.ModelInstanceGroup.Kind.Value(backend.kind))
    if threads is not None and backend.threads_parameter:
        config.parameters[backend.threads_parameter].string_value = str(threads)
    for key, value in backend.parameters.items():
        config.parameters[key].string_value = value
    return config


def _data_type(pb, dtype: str) -> int:
    names = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "int64": "TYPE_INT64",
             "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8",
             "bool": "TYPE_BOOL", "bfloat16": "TYPE_BF16"}
    if dtype not in names:
        raise ServedFileError(f"a {dtype} tensor has no Triton data type this project maps; known: {', '.join(names)}")
    return pb.DataType.Value(names[dtype])


def config_text(config) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def parse_config(text: str, where: str):
    """``text`` parsed with Triton's schema; a field, value or syntax it does not know is a ServedFileError naming
    ``where`` and the line."""
    from google.protobuf import text_format

    pb = _schema()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ServedFileError(f"{where}: not a Triton model configuration: {exc}") from exc


def check_model(folder: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> list[str]:
    """What would stop Triton loading ``folder`` (one model of a repository) or make it answer other tensors than
    the file's: the schema, the name, the backend, the version folder's file, every tensor against the file's.
    Empty when it is fine."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return [f"{path}: missing"]
    try:
        config = parse_config(path.read_text(), str(path))
    except ServedFileError as exc:
        return [str(exc)]
    problems = []
    if config.name and config.name != folder.name:
        problems.append(f"{path}: name {config.name!r} is not its folder's ({folder.name!r}); Triton refuses it")
    known = {b.platform for b in backends().values()} | {b.backend for b in backends().values()}
    if not ({config.platform, config.backend} & (known - {""})):
        problems.append(f"{path}: platform {config.platform!r} / backend {config.backend!r}: not a native backend "
                        f"of the released runtimes ({', '.join(sorted(known - {''}))})")
    model_file = folder / VERSION / (config.default_model_filename or "model.onnx")
    if not model_file.is_file():
        problems.append(f"{model_file}: missing (the version folder holds the served file)")
    if not config.instance_group or any(group.count < 1 for group in config.instance_group):
        problems.append(f"{path}: instance_group needs a count of 1 or more")
    batched = config.max_batch_size > 0
    if batched and not batchable(inputs, outputs):
        problems.append(f"{path}: max_batch_size {config.max_batch_size} but the file's batch dimension is fixed")
    pb = _schema()
    for label, declared, specs in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {spec.name: spec for spec in specs}
        if {t.name for t in declared} != set(by_name):
            problems.append(f"{path}: {label}s {sorted(t.name for t in declared)} are not the file's "
                            f"{sorted(by_name)}")
            continue
        for tensor in declared:
            spec = by_name[tensor.name]
            want = list(spec.per_request() if batched else spec.shape)
            if list(tensor.dims) != want:
                problems.append(f"{path}: {label} {tensor.name!r} dims {list(tensor.dims)}, the file's {want}")
            if tensor.data_type != _data_type(pb, spec.dtype):
                problems.append(f"{path}: {label} {tensor.name!r} is {pb.DataType.Name(tensor.data_type)}, the "
                                f"file's {spec.dtype}")
    return problems
