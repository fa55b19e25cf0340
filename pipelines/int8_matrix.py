"""The INT8 matrix: does the project's INT8 pay on the networks people ship to CPUs, beside what they would use?

    python pipelines/int8_matrix.py                       # the four models, about 30 minutes on 2 cores
    python pipelines/int8_matrix.py --models resnet50 --out runs/int8-matrix

For each timm model at 224 px (MobileNetV3-Large, EfficientNet-B0, ResNet-50 and DeiT-Tiny, a LayerNorm
network), on a generated 10-class folder with a seeded 1,000-class stand-in checkpoint (nothing can be
downloaded here): ``compress run`` trains the new head for one epoch, the quantize stage makes its INT8 files
(onnxruntime's and, by NNCF, OpenVINO's) and the export stage the fp32 ONNX. Then, in ONE interleaved run of
the project's latency harness (every file in its own worker process, batch 1, all cores), it measures:

- the fp32 ONNX on onnxruntime and on OpenVINO (which runs a float file in bf16 on CPUs with native bf16);
- the quantize stage's INT8 file on each runtime it is made for;
- NNCF's INT8 of the same fp32 ONNX as an OpenVINO user makes it by hand: ``core.read_model`` → ``nncf.quantize``
  (OpenVINO backend, defaults, the same calibration images) → IR;

each file's top-1 on the run's test split and its drop against the fp32 ONNX on the same runtime (paired, on
the same images), and every p50 ratio against the peer with its 95% interval over the rounds. The accuracy
figures rest on a head trained for one epoch on generated images: they show what quantization changed in the
same model, not how good the model is. Writes ``matrix.json`` and ``matrix.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from compress.quantization.flavours import CPU, OPENVINO

MODELS = ("mobilenetv3_large_100", "efficientnet_b0", "resnet50", "deit_tiny_patch16_224")
PEER = "nncf-openvino"


def pipeline(model: str, data: Path, weights: Path, size: int) -> dict:
    return {
        "name": f"int8-matrix-{model}", "seed": 0,
        "data": {"name": "imagefolder", "path": str(data), "image_size": size, "channels": 3,
                 "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "calib_size": 300},
        "model": {"name": f"timm:{model}", "weights": str(weights), "head": "auto"},
        "red_line": {"metric": "top1", "max_drop": 100.0},  # PTQ is what is measured: no ladder climb
        "stages": [
            {"name": "train", "kind": "train", "freeze_backbone_epochs": 1, "epochs": 1, "batch_size": 32,
             "optimizer": "adamw", "lr": 1.0e-3, "weight_decay": 0.05, "schedule": "cosine", "warmup_epochs": 0,
             "amp": "auto", "checkpoint_every": 0},
            {"name": "quantize", "kind": "quantize", "flavours": [CPU.name, OPENVINO.name],
             "calibration": {"method": "entropy", "samples": 128}, "fallback": {"enabled": False},
             "qat": {"enabled": False}},
            {"name": "export", "kind": "export", "formats": ["onnx"]},
        ]}


def _run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def prepare(model: str, out: Path, data: Path, images: int, size: int, force: list[str]) -> Path:
    """The model's run directory after ``compress run`` (cached: a second call re-uses it)."""
    if not data.exists():
        _run(sys.executable, "-m", "train.generated_folder", str(data), "--images", str(images), "--size", str(size),
             "--classes", "10")
    weights = out / f"{model}-1000.safetensors"
    if not weights.exists():
        _run(sys.executable, "-m", "train.stand_in_weights", str(weights), "--model", f"timm:{model}")
    path = out / f"{model}.yaml"
    path.write_text(yaml.safe_dump(pipeline(model, data, weights, size), sort_keys=False))
    run_dir = out / model
    _run("compress", "run", str(path), "--run-dir", str(run_dir), *(a for stage in force for a in ("--force", stage)))
    return run_dir


def peer_file(run_dir: Path, calib: np.ndarray) -> Path:
    """NNCF's INT8 as an OpenVINO user makes it: read the fp32 ONNX, ``nncf.quantize`` on calibration images
    (OpenVINO backend, its defaults; ``model_type=TRANSFORMER`` for an attention network, as NNCF's documentation
    asks), save the IR. The same images the quantize stage calibrated on; re-made whenever the fp32 file, the
    images or the libraries change."""
    import hashlib

    import nncf
    import onnx
    import openvino as ov

    from compress.quantization.nncf_ptq import has_attention

    source = run_dir / "export" / "onnx" / "model.onnx"
    key = {"onnx": hashlib.sha256(source.read_bytes()).hexdigest(), "calib": hashlib.sha256(calib.tobytes()).hexdigest(),
           "nncf": nncf.__version__, OPENVINO.runtime: ov.get_version()}
    out, stamp = run_dir / PEER / "model.xml", run_dir / PEER / "made-from.json"
    if out.exists() and stamp.exists() and json.loads(stamp.read_text()) == key:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    transformer = has_attention(onnx.load(str(source), load_external_data=False))
    quantized = nncf.quantize(ov.Core().read_model(str(source)),
                              nncf.Dataset([calib[i:i + 1] for i in range(len(calib))]), subset_size=len(calib),
                              **({"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}))
    ov.save_model(quantized, str(out))
    stamp.write_text(json.dumps(key))
    return out


def split_images(run_dir: Path, name: str, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A split of the run's data, exactly as its stages read it (the pipeline's own data section and seed)."""
    from compress.pipeline.pipeline_data import load_section
    from compress.pipeline.pipeline_file import load_pipeline
    from compress.stages.int8_records import split_arrays

    loaded = load_pipeline(str(run_dir / "pipeline.resolved.yaml"))
    return split_arrays(load_section(loaded.config.data, str(run_dir / "pipeline.resolved.yaml")), name, limit)


def float_file(runtime: str) -> str:
    """The name of the fp32 file's candidate on ``runtime``: what every file on that runtime is compared with."""
    return "fp32" if runtime == CPU.runtime else f"fp32@{runtime}"


def candidates(run_dir: Path, peer: Path) -> dict[str, tuple[str, Path]]:
    """Name → (runtime, file): the fp32 file on both runtimes, the quantize stage's files each on the runtime it is
    made for, and the peer on OpenVINO."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    fp32 = run_dir / "export" / "onnx" / "model.onnx"
    files = {float_file(f.runtime): (f.runtime, fp32) for f in (CPU, OPENVINO)}
    for flavour in (CPU, OPENVINO):
        if f"quantize.onnx_{flavour.name}" in manifest["artifacts"]:
            files[f"int8 (quantize.onnx_{flavour.name})"] = (flavour.runtime, run_dir / "quantize" /
                                                             f"onnx_{flavour.name}" / "model.onnx")
    files[f"int8 ({PEER}, by hand)"] = (OPENVINO.runtime, peer)
    return files


def accuracy_of(files: dict[str, tuple[str, Path]], images: np.ndarray, labels: np.ndarray) -> dict[str, dict]:
    """Top-1 of each file on the test split as its runtime answers, at batch 1 (OpenVINO's answers depend on the
    batch), with the drop against the fp32 file on the same runtime and its paired 95% interval."""
    from serve_bench.runners import make_runner, predict
    from serve_bench.stats.paired import drop_interval, paired_counts

    hits = {}
    for name, (runtime, path) in files.items():
        with make_runner(runtime, path) as runner:
            hits[name] = predict(runner, images, 1).argmax(axis=1) == labels
    out = {}
    for name, (runtime, _) in files.items():
        reference = float_file(runtime)
        counts = paired_counts(hits[reference], hits[name])
        low, high = drop_interval(counts)
        out[name] = {"top1": round(float(hits[name].mean()) * 100, 2),
                     "drop_vs_fp32": round(float(hits[reference].mean() - hits[name].mean()) * 100, 2),
                     "drop_ci": [round(low, 2), round(high, 2)], "n": int(len(labels))}
    return out


def latency_of(files: dict[str, tuple[str, Path]], pool: np.ndarray, seconds: float) -> dict[str, dict]:
    """One interleaved run of every file (each in its own worker), batch 1, all cores; p50/p99 and every p50
    ratio against the peer, paired by round."""
    from compress.quantization.measure import interleaved
    from serve_bench.latency.harness import HarnessSettings
    from serve_bench.stats.latency_intervals import paired_ratio
    from serve_bench.stats.summary import percentile

    measured = interleaved({name: path for name, (_, path) in files.items()}, pool,
                           HarnessSettings(min_iters=500, min_duration_s=seconds),
                           runtime={name: runtime for name, (runtime, _) in files.items()})
    peer = next(n for n in files if PEER in n)
    out = {}
    for name, m in measured.items():
        fp32 = float_file(files[name][0])  # the float file on the same runtime
        out[name] = {"p50_ms": round(percentile(m.latencies_ms, 50), 3), "p99_ms": round(percentile(m.latencies_ms, 99), 3),
                     "requests": m.requests, "p50_vs_peer": paired_ratio(m.blocked, measured[peer].blocked, 50).as_dict(),
                     "p50_vs_fp32": paired_ratio(m.blocked, measured[fp32].blocked, 50).as_dict()}
    return out


def kernels_of(files: dict[str, tuple[str, Path]], sample: np.ndarray) -> dict[str, str]:
    """What each runtime made of each file: integer against float compute layers, from its own profile."""
    from serve_bench.latency.operator_profile import profile_artifact
    from serve_bench.runners.kernel_census import census_line

    out = {}
    for name, (runtime, path) in files.items():
        profile = profile_artifact(runtime, str(path), sample[:1], threads=_cores(), iters=10)
        out[name] = census_line(profile.get("kernels"), len(profile.get("unfused_qdq") or []))
    return out


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def machine() -> str:
    from train.hardware import machine_words

    return machine_words()


def table(results: dict[str, dict]) -> str:
    def cell(ratio: dict) -> str:
        return f"{ratio['ratio']:.2f} [{ratio['ci'][0]:.2f}, {ratio['ci'][1]:.2f}]"

    lines = ["| model | file | runtime | p50 ms | p99 ms | p50 / NNCF's (95% CI) | p50 / fp32, same runtime | top-1 | "
             "drop vs fp32 (95% CI) | compute layers as run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model, result in results.items():
        for name, (runtime, _) in result["files"].items():
            lat, acc = result["latency"][name], result["accuracy"][name]
            lines.append(f"| {model} | {name} | {runtime} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | "
                         f"{cell(lat['p50_vs_peer'])} | {cell(lat['p50_vs_fp32'])} | {acc['top1']:.2f} | "
                         f"{acc['drop_vs_fp32']:+.2f} [{acc['drop_ci'][0]:+.2f}, {acc['drop_ci'][1]:+.2f}] | "
                         f"{result['kernels'][name]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="timm architectures (default: the four)")
    parser.add_argument("--out", type=Path, default=Path("runs/int8-matrix"))
    parser.add_argument("--images", type=int, default=1600, help="images in the generated folder (when it is made)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per file (interleaved)")
    parser.add_argument("--force", nargs="*", default=[], help="stages to re-run in each model's run (e.g. quantize)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / f"generated{args.size}"
    results = {}
    for model in args.models:
        run_dir = prepare(model, args.out, data, args.images, args.size, args.force)
        calib, _ = split_images(run_dir, "calib", 128)
        test_x, test_y = split_images(run_dir, "test")
        files = candidates(run_dir, peer_file(run_dir, calib))
        print(f"measuring {len(files)} files of {model} in one interleaved run", flush=True)
        results[model] = {"files": {k: (r, str(p)) for k, (r, p) in files.items()},
                          "latency": latency_of(files, test_x[:16], args.seconds),
                          "accuracy": accuracy_of(files, test_x, test_y),
                          "kernels": kernels_of(files, test_x)}
        (args.out / "matrix.json").write_text(json.dumps({"machine": machine(), "results": results}, indent=2))
    text = f"Machine: {machine()}\n\n{table(results)}\n"
    (args.out / "matrix.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
