"""``compress doctor --gpu``: the check a GPU machine runs before it is trusted with a pipeline.

The CPU test suite skips everything that needs CUDA or TensorRT, so on a GPU machine three things
remain unproven until this runs: the GPU-marked tests, an INT8 TensorRT engine built from the
quantize stage's Q/DQ file, and a bench on the device. It runs them as a user would, as
subprocesses in the source checkout (their output streamed as it comes), and records each exit
code. Without a CUDA device it says why and changes nothing.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PIPELINE = "pipelines/quickstart.yaml"
RUN_DIR = "runs/doctor-gpu"
# The quickstart as it is, with the engine made compulsory (INT8, from quantize's TensorRT Q/DQ file) and the
# bench on the GPU; export and bench are forced so a re-run measures this machine now, while the trained,
# pruned and quantized model is reused from an earlier doctor run.
OVERRIDES = ("stages.export.formats=[onnx,tensorrt]", "stages.export.tensorrt.precision=int8",
             "stages.export.tensorrt.required=true", "stages.bench.device=cuda")
# `compress run` exit codes that mean the pipeline ran: 0, and 1 (the release gate said no, a verdict on the model).
RAN = (0, 1)
GATE_SAID_NO = 1


@dataclass
class StepResult:
    name: str
    command: list[str]
    returncode: int | None
    seconds: float
    passed: bool
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def no_gpu_reason() -> str | None:
    """Why torch sees no CUDA device (None when it sees one)."""
    import torch

    if torch.cuda.is_available():
        return None
    if not torch.version.cuda:
        return (f"torch {torch.__version__} is built without CUDA: install a CUDA build of torch "
                "(https://pytorch.org/get-started/locally/)")
    try:
        torch.cuda.init()
    except Exception as exc:  # torch says why here (no driver, driver too old, CUDA_VISIBLE_DEVICES empty...)
        text = str(exc).strip()
        why = text.splitlines()[0] if text else type(exc).__name__
        return f"no CUDA device visible to torch (CUDA {torch.version.cuda} build): {why}"
    return f"no CUDA device visible to torch (CUDA {torch.version.cuda} build)"


def source_root() -> Path:
    """The checkout this package runs from (tests and pipelines live there, not in an installed wheel)."""
    import compress

    return Path(compress.__file__).resolve().parents[1]


def gpu_commands(python: str = sys.executable) -> list[tuple[str, list[str], tuple[int, ...]]]:
    """The steps, in order: (name, argv run in the source checkout, the exit codes that pass)."""
    return [
        ("GPU tests (pytest -m gpu)", [python, "-m", "pytest", "-m", "gpu", "-q"], (0,)),
        ("quickstart: INT8 TensorRT engine and a cuda bench",
         [python, "-m", "compress", "run", PIPELINE, "--run-dir", RUN_DIR, "--force", "export", "--force", "bench",
          *OVERRIDES], RAN),
    ]


def engine_summary(run_dir: Path) -> tuple[bool, str]:
    """(an INT8 engine was built, what the run left: its engines and the bench's verdict), from the manifest."""
    from compress.errors import ArtifactError
    from compress.pipeline.manifest import Manifest
    from export.tensorrt_engine import ENGINE_KIND

    try:
        manifest = Manifest.load(run_dir)
    except ArtifactError as exc:
        return False, f"manifest unreadable: {exc}"
    if manifest is None:
        return False, f"no manifest in {run_dir}"
    engines = [a for a in manifest.artifacts.values() if a.kind == ENGINE_KIND]
    bench = next((s for s in manifest.stages.values() if s.kind == "bench"), None)
    parts = [", ".join(f"{a.name}: {a.meta.get('precision')} engine" for a in engines) or "no TensorRT engine"]
    if bench is not None:
        parts.append(f"bench {bench.status}: {bench.metrics.get('summary', '')}".rstrip(": "))
    return any(a.meta.get("precision") == "int8" for a in engines), "; ".join(parts)


def run_step(name: str, argv: list[str], passing: tuple[int, ...], cwd: Path) -> StepResult:
    """Run one step, its output streamed to this terminal; a step that cannot start is a failed step."""
    logger.info("doctor --gpu: %s", " ".join(argv))
    start = time.perf_counter()
    try:
        code = subprocess.run(argv, cwd=cwd, check=False).returncode
    except OSError as exc:
        return StepResult(name, argv, None, round(time.perf_counter() - start, 1), False, f"could not start: {exc}")
    seconds = round(time.perf_counter() - start, 1)
    passed = code in passing
    detail = "" if code == 0 else ("ran; the release gate said no (exit 1)" if passed and code == GATE_SAID_NO
                                   else f"exit {code}")
    return StepResult(name, argv, code, seconds, passed, detail)


def run_gpu_check(say) -> dict:
    """The ``--gpu`` section; ``say(text)`` prints a line before each step (their output follows)."""
    reason = no_gpu_reason()
    if reason:
        return {"gpu": None, "reason": reason, "steps": [], "passed": True}
    import torch

    root = source_root()
    gpu = torch.cuda.get_device_name(0)
    if not (root / PIPELINE).is_file() or not (root / "tests").is_dir():
        return {"gpu": gpu, "reason": None, "passed": False, "steps": [
            StepResult("source checkout", [], None, 0.0, False, f"{root} has no tests/ and {PIPELINE}: run "
                       "compress doctor --gpu from a source checkout (pip install -e .)").as_dict()]}
    steps = []
    for name, argv, passing in gpu_commands():
        say(f"doctor --gpu: {name}: {' '.join(argv[1:])}")
        step = run_step(name, argv, passing, root)
        if passing == RAN and step.passed:  # it ran: the INT8 engine must be among what it made
            built, summary = engine_summary(root / RUN_DIR)
            step.passed, step.detail = built, "; ".join(d for d in (step.detail, summary) if d)
        steps.append(step)
    return {"gpu": gpu, "reason": None, "steps": [s.as_dict() for s in steps], "passed": all(s.passed for s in steps)}
