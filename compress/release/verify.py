"""`compress verify`: a bundle is what its card says, wherever it was copied to.

Three checks, each of which a deployer could otherwise only do by hand: every file's sha256
against ``SHA256SUMS``; the released file loads (onnx's checker, then an onnxruntime session)
and states the input and classes the card states; and, given a folder of labelled images, the
file reproduces the card's accuracy. Given the very test images the card was judged on (same
pixels, labels and order, recognised by the test split's digest), the accuracy must be equal;
given other images it must agree within chance, both figures being samples: the 99% interval of
the difference of the two accuracies must contain 0 (``card_agreement``). Where the bundle holds model
servers' files (``serving/``), they are checked with the servers' own schemas and against the released file.

A check that was asked for and could not be made here (a TensorRT engine on a machine without
TensorRT or its GPU, and then its accuracy) is said as such and leaves the bundle not verified:
"verified" means every check asked for was made and held.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from compress.errors import ArtifactError, DataInputError
from compress.release.bundle import CARD_JSON
from compress.release.card_agreement import AGREEMENT_LEVEL, agrees, difference_interval, hits_of
from compress.release.checksums import check_sums
from compress.release.model_card import CARD_FORMAT, READABLE_CARD_FORMATS
from export.external_data import UnsafeModelError, check_external_data
from export.onnx_metadata import CLASSES_KEY, PREPROCESSING_KEY, read_deployment
from serve_bench.accuracy.classification import accuracy, accuracy_intervals
from serve_bench.accuracy.image_folder import ImageFolderError, read_labelled_folder
from serve_bench.accuracy.predictions import digest_of_test_split
from serve_bench.runners import RUNNER_OF_KIND, RUNNERS, RunnerError, current_kind, make_runner, predict
from serve_bench.servers.deployment import check_server_files
from train.file_digest import file_sha256

logger = logging.getLogger(__name__)


@dataclass
class Verification:
    checks: list[str] = field(default_factory=list)  # what was checked and held, one line each
    problems: list[str] = field(default_factory=list)  # what was checked and did not hold
    unchecked: list[str] = field(default_factory=list)  # what was asked for and could not be checked, and why

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unchecked


def load_card(folder: Path) -> dict:
    path = folder / CARD_JSON
    try:
        card = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: cannot read the model card ({exc}); give a folder made by compress release") from exc
    if card.get("format") not in READABLE_CARD_FORMATS:
        raise ArtifactError(f"{path}: not a compress model card (format {card.get('format')!r}, "
                            f"expected {CARD_FORMAT!r})")
    return card


def verify_bundle(folder: Path, images: Path | None = None, threads: int | None = None) -> Verification:
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactError(f"{folder} is not a folder; give a bundle made by compress release")
    card = load_card(folder)
    result = Verification()
    count, problems = check_sums(folder)
    result.problems += problems
    if not problems:
        result.checks.append(f"sha256 of all {count} files match SHA256SUMS")
    released = card["released"]
    path = folder / released["file"]
    accuracy_not_run = f"the card's accuracy on {images}: not measured, the file could not run"
    kind = current_kind(released["kind"], "the bundle's card")
    if kind == "onnx" and not _onnx_loads(path, card, result):
        result.unchecked += [accuracy_not_run] if images is not None else []
        return result
    _check_servers(folder, path, card, result)
    runtime = runtime_named(released, "released") or RUNNER_OF_KIND[kind]  # the one the gate released it on
    try:
        options = runner_options(card)
        measured_threads = options.pop("threads", None)
        runner = make_runner(runtime, path, threads=threads or measured_threads, **options).load()
    except (RunnerError, RuntimeError, OSError, ValueError) as exc:  # the runtimes' load errors
        if RUNNERS[runtime].fixed_device is None:
            result.problems.append(f"{released['file']} does not load in {runtime}: {exc}")
        else:  # an engine runs only with TensorRT on the GPU it was built for: elsewhere it cannot be checked
            where = ("run compress verify where TensorRT and the engine's GPU are; `sha256sum -c SHA256SUMS` "
                     "checks the digests alone")
            result.unchecked.append(f"{released['file']} was not loaded: {exc}; {where}")
        result.unchecked += [accuracy_not_run] if images is not None else []
        return result
    try:
        result.checks.append(f"{released['file']} loads in {runtime}")
        if images is not None:
            _reproduce(runner, Path(images), card, result)
    finally:
        runner.close()
    return result


def _check_servers(folder: Path, path: Path, card: dict, result: Verification) -> None:
    """The model servers' files (``serving/``), where the bundle has them: Triton's schema and tensors against the
    released file, OVMS's schema and layout, and the served copy byte for byte the released file."""
    servers = card.get("servers")
    if not servers:
        return
    where = folder / servers["folder"]
    problems = check_server_files(where, path, servers)
    served = where / servers["served_file"]
    if served.suffix == ".onnx" and served.is_file() and file_sha256(served) != file_sha256(path):
        problems.append(f"{served.relative_to(folder)} is not the released file {path.name} (their sha256 differ)")
    result.problems += problems
    if not problems:
        result.checks.append(f"{servers['folder']}/: the Triton configuration parses with Triton's schema and names "
                             "the file's tensors; the OpenVINO Model Server configuration fits its schema and layout")


def runner_options(card: dict) -> dict:
    """What the runtime ran the file with when the card's figures were measured (OpenVINO: its performance hint,
    the inference precision and the threads it used, so the accuracy is reproduced in the same arithmetic)."""
    runner = (card.get("latency") or {}).get("runner") or {}
    runtime = runtime_named(runner, "latency.runner")
    return RUNNERS[runtime].options_from_info(runner) if runtime in RUNNERS else {}


def runtime_named(record: dict, where: str) -> str | None:
    """The runtime a card's record names: ``runtime``, or ``backend`` in a bundle made before the one name (read,
    and said in the log)."""
    if "runtime" not in record and "backend" in record:
        logger.warning("the bundle's card names its runtime 'backend' in %s (a bundle made before report version 4): "
                       "read as its runtime; re-run compress release to write today's names", where)
        return record["backend"]
    return record.get("runtime")


def _onnx_loads(path: Path, card: dict, result: Verification) -> bool:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        check_external_data(path)
        onnx.checker.check_model(str(path), full_check=True)
    except (UnsafeModelError, onnx.checker.ValidationError, DecodeError, OSError) as exc:  # DecodeError: not ONNX
        result.problems.append(f"{path.name} fails onnx's checker: {exc}")
        return False
    before = len(result.problems)
    props = read_deployment(path)
    for key, expected, what in ((PREPROCESSING_KEY, card["input"], "input"), (CLASSES_KEY, card["classes"], "classes")):
        if key not in props:
            result.problems.append(f"{path.name} does not state its {what} ({key}; written by a version before files "
                                   "carried it): re-run the stage that made it, then release again")
        elif props[key] != expected:
            result.problems.append(f"{path.name} metadata {key} differs from the card's {what}")
    if len(result.problems) == before:
        result.checks.append(f"{path.name} passes onnx's checker and states the card's input and classes")
    return True


def _reproduce(runner, images: Path, card: dict, result: Verification) -> None:
    acc_card = card["accuracy"]
    metric = acc_card["metric"]
    if metric not in ("top1", "top5"):
        what = "a segmenter, judged by mIoU" if metric in ("miou", "pixel_acc") else "a detector, judged by COCO mAP"
        raise DataInputError(f"compress verify {images}: this bundle is {what}; verify reads a class-per-folder image "
                             f"set and cannot measure {metric} yet: run compress verify without images (digests, the "
                             "ONNX checker, the metadata and a load in the released runtime)")
    try:
        folder = read_labelled_folder(images, card["input"], card["classes"])
    except ImageFolderError as exc:
        raise DataInputError(f"compress verify: {exc}") from exc
    logits = predict(runner, folder.images, acc_card.get("eval_batch") or 64)
    measured = accuracy(logits, folder.labels)
    intervals = accuracy_intervals(measured)
    same = digest_of_test_split(folder.images, folder.labels) == acc_card.get("test_digest")
    got, want, n = measured[metric], acc_card[metric], measured["n"]
    words = (f"{metric} {got}% on {n} images of {images} [{intervals[metric][0]:g}, {intervals[metric][1]:g}] "
             f"(95% Wilson); card {want}% on {acc_card['test_images']}")
    if same:
        if all(measured.get(k) == acc_card.get(k) for k in measured if k.startswith("top")):
            result.checks.append(f"{words}: the card's test images (same digest), same accuracy")
        else:
            result.problems.append(f"{words}: the card's very test images (same digest) but another accuracy")
        return
    card_n = acc_card.get("test_images")
    if not card_n:
        result.unchecked.append(f"{words}: the card does not record how many test images its figure comes from, "
                                "so other images cannot be compared with it; give the card's own test images")
        return
    counts = (hits_of(got, n), n, hits_of(want, card_n), card_n)
    lower, upper = (float(b) for b in difference_interval(*counts))
    level = f"{AGREEMENT_LEVEL:.0%}"
    words += (f"; difference {got - want:+.2f} points, {level} interval [{lower:+.2f}, {upper:+.2f}] "
              "(Newcombe, both figures being samples)")
    if agrees(*counts):
        result.checks.append(f"{words}: other images than the card's test split; they agree with the card")
    else:
        result.problems.append(f"{words}: the interval excludes 0, so these images disagree with the card; the "
                               "file, its preprocessing or these images' labels differ from what the card "
                               "describes (or these images come from another distribution)")
