"""The pipeline schema: what a pipeline file may say, checked once at load.

Stage entries are validated against the config class their ``kind`` registered, so the
schema grows with the stages and a typo in any setting is caught before anything runs.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from train.detection.postprocess import NmsSettings

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(Strict):
    """The images every stage reads, split once into train, validation and test (calibration images are a
    seeded subset of train)."""

    name: Literal["digits", "mnist5k", "imagefolder", "cifar10", "synthetic", "coco", "shapes", "masks", "voc",
                  "coco_masks", "scenes"] = Field(
        ..., description="digits, mnist5k (built in); imagefolder (your class-per-folder images); cifar10 (its "
                         "python folder); synthetic (random, latency only); coco (your COCO folder); shapes "
                         "(generated detection images); segmentation: masks (your images/ and masks/ folders), voc "
                         "(the Pascal VOC layout), coco_masks (COCO polygons or RLE painted into class masks), scenes "
                         "(generated scenes with exact masks)")
    path: str | None = Field(None, description="folder of the data set (imagefolder, cifar10; coco: the folder "
                                               "holding images/ and the instances JSON)")
    image_size: int | None = Field(None, gt=0, le=1024, description="resize every image once to this square size")
    channels: Literal[1, 3] | None = Field(None, description="convert to 1 (grey) or 3 (RGB) channels")
    mean: list[float] | None = Field(None, description="per-channel mean; default: measured on the train split")
    std: list[float] | None = Field(None, description="per-channel std; default: measured on the train split")
    val_fraction: float = Field(0.1, gt=0, lt=1, description="share of the images left after the test split that "
                                                              "is held out for validation (what stages judge on)")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share of the images held out for the test split "
                                                               "(stages report it, the bench gates on it; no stage "
                                                               "decides on it); unused where the data has an official "
                                                               "test set (cifar10) or test_path is given")
    test_path: str | None = Field(None, description="imagefolder: a folder of your own (the same class sub-folders) "
                                  "that is the whole test split, kept apart from data.path (test_fraction is then "
                                  "unused): how to measure a model trained elsewhere on images you know are new to it")
    calib_size: int = Field(256, gt=0, description="calibration images, a seeded subset of the train split")
    split_seed: int = Field(0, ge=0, description="seed of the split permutation; kept apart from the run seed so "
                            "runs with different seeds are measured on the same test images")
    synthetic_samples: int = Field(1024, gt=0, description="synthetic, shapes: images generated")
    synthetic_classes: int = Field(10, ge=2, description="synthetic: the number of (random) classes")
    decode_cache: Literal["auto", "on", "off"] = Field(
        "auto", description="imagefolder: decode once into an on-disk uint8 cache read through a memory map "
                            "(auto: when the decoded images would exceed 2 GiB; off: always decode into memory)")
    decode_cache_check: Literal["sample", "stat", "content"] = Field(
        "sample", description="how a later run sees that a cached folder changed: sample (size, mtime, ctime and "
                              "12 KiB of each file's head, middle and tail), stat (size, mtime, ctime; opens no "
                              "file), content (every file hashed on every load; any byte change is seen)")
    cache_dir: str | None = Field(None, description="where decoded caches live; default $COMPRESS_CACHE_DIR, "
                                  "else ~/.cache/compress/decoded")
    decode_workers: int | None = Field(None, ge=1, description="processes decoding into the cache; default: one per CPU")
    independent_test: bool = Field(False, description="the test split shares no image with the data the input "
                                   "models were trained on, although its split digest differs from theirs: "
                                   "measure them anyway (default: refuse)")
    annotations: str | None = Field(None, description="coco: the instances JSON (relative to path or absolute); "
                                                      "default: the one JSON in path/annotations/ or path")
    resize: Literal["letterbox", "stretch"] = Field(
        "letterbox", description="coco, shapes and segmentation data: letterbox (longest side to image_size, aspect "
                                 "kept, padded with grey 114 and, in masks, ignore_index, centred) or stretch (both "
                                 "sides to image_size; masks by nearest neighbour); recorded in the ONNX metadata")
    ignore_index: int = Field(255, ge=0, le=255, description="segmentation: the mask value never scored or trained on "
                                                             "(VOC's void border is 255)")
    class_names: list[str] | None = Field(None, min_length=2, description="segmentation: the classes in index order "
                                          "(default: classes.txt in the folder, VOC's 21, COCO's categories after "
                                          "background, else class_0…class_k by the largest id found)")
    palette: list[list[int]] | None = Field(None, description="segmentation: RGB masks: the colour [r, g, b] of each "
                                            "class in index order (index PNGs, mode P or L, need none)")

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.name in ("imagefolder", "cifar10", "coco", "masks", "voc", "coco_masks") and not self.path:
            raise ValueError(f"data.path is required for {self.name}")
        if self.test_path and self.name != "imagefolder":
            raise ValueError("data.test_path is a test folder beside an imagefolder data.path; use name: imagefolder")
        if (self.mean is None) != (self.std is None):
            raise ValueError("give both mean and std, or neither (then both are measured on the train split)")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise ValueError("every std value must be > 0")
        if self.palette is not None and any(len(c) != 3 or not all(0 <= v <= 255 for v in c) for c in self.palette):
            raise ValueError("data.palette: give one [r, g, b] per class, each value 0…255")
        train_share = (1 - self.test_fraction) * (1 - self.val_fraction)  # val is a share of what test leaves
        if train_share < 0.1:
            raise ValueError(f"test_fraction {self.test_fraction} and val_fraction {self.val_fraction} leave "
                             f"{train_share:.0%} of the images for training; leave at least 10%")
        return self


class ModelConfig(Strict):
    """The model: an architecture by name (with trained weights, the run starts from them instead of training),
    or an ONNX classifier file trained elsewhere. Either one is the run's first artifact, ``model``."""

    name: str | None = Field(None, description="resnet20/32/56, a torchvision model name, 'timm:<name>', or "
                                               "'package.module:callable'")
    weights: str | None = Field(None, description="local state dict (.safetensors, or .pt read with weights_only): "
                                                  "the trained model the run starts from")
    onnx: str | None = Field(None, description="an ONNX classifier file as the model (instead of name): "
                                               "quantize, export, bench and release it; pruning, distillation "
                                               "and QAT need the torch model (name + weights)")
    args: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments of the builder")
    head: Literal["auto", "keep", "reset"] = Field(
        "auto", description="weights trained on other classes: auto re-makes the classifier for the data where it "
        "does not fit (every other tensor loaded as it is); keep refuses such weights; reset re-makes it even where "
        "it fits (as many classes, but other ones)")
    classifier: str | None = Field(None, description="the module that maps features to classes (re-made by "
                                   "model.head, trained alone by freeze_backbone_epochs), where it is not timm's "
                                   "get_classifier() or the model's last nn.Linear")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if (self.name is None) == (self.onnx is None):
            raise ValueError("give model.name (an architecture, with weights: to start from a trained model) or "
                             "model.onnx (an ONNX file), not both and not neither")
        if self.onnx is not None and (self.weights or self.args):
            raise ValueError("model.onnx carries its own weights and architecture: drop model.weights and model.args")
        if self.weights is None and self.head != "auto":
            raise ValueError(f"model.head: {self.head} says how model.weights load: give model.weights, or drop it")
        return self

    @property
    def given(self) -> bool:
        """A model the user already trained (weights or an ONNX file): the run starts from it."""
        return bool(self.weights or self.onnx)


class RedLine(Strict):
    metric: Literal["top1", "top5", "map", "map50", "miou", "pixel_acc"] = Field(
        "top1", description="classification: top1, top5; detection: map (COCO mAP@0.5:0.95) or map50 (mAP@0.5); "
                            "segmentation: miou (mean IoU over the classes) or pixel_acc")
    max_drop: float = Field(1.0, ge=0, le=100, description="percentage points (accuracy or mAP points) below the "
                                                          "trained baseline")
    collapse_margin: float | None = Field(
        20.0, gt=0, le=100, description="points: a stage (prune, distill, quantize) whose model falls more than this "
        "below its input's on the validation split stops the pipeline with both figures instead of handing a broken "
        "model on; well above any red line (a model within max_drop is never stopped); null: never stop")
    fall_back: bool = Field(True, description="each model a stage makes is judged on the validation split against "
                            "this line; where the model wired to a stage that makes deployable files (quantize, export, "
                            "nncf) is past it, that stage makes them from the last model within it, said in the log and "
                            "recorded in the manifest; false: every stage uses the model wired to it")


class Latency(Strict):
    """The latency a release must meet, and under what traffic.

    ``single-stream`` gates on the closed-loop P99 (one request at a time: the service time);
    ``server`` on the P99 at ``target_qps`` Poisson arrivals per second, measured with MLPerf LoadGen
    from each query's scheduled send time, so queueing behind a slow request counts.
    """

    p99_budget_ms: float | None = Field(None, gt=0, description="the p99 latency a released file must meet, in ms; "
                                                                "none: latency is measured, not gated")
    batch_size: int = Field(1, ge=1, description="images per request the latency is measured at")
    scenario: Literal["single-stream", "server"] = Field(
        "single-stream", description="single-stream: closed loop; server: Poisson arrivals at target_qps")
    target_qps: float | None = Field(None, gt=0, description="server: the arrival rate the service must carry")
    measured_at: Literal["in_process", "served"] = Field(
        "in_process", description="server: where the gated p99 is measured. in_process: the file in the bench's "
                                  "own serving loop; served: through the model server it ships on (Ray Serve, on "
                                  "loopback), as a client sees it; a file no server here runs then cannot pass")

    @model_validator(mode="after")
    def _traffic(self) -> "Latency":
        if self.scenario == "server" and self.target_qps is None:
            raise ValueError("scenario server needs target_qps (queries per second the service must carry), "
                             "e.g. latency: {scenario: server, target_qps: 1000}")
        if self.scenario != "server" and self.target_qps is not None:
            raise ValueError("target_qps applies to the server scenario: add scenario: server, or drop target_qps")
        if self.measured_at == "served" and self.scenario != "server":
            raise ValueError("measured_at served measures the p99 at target_qps through the model server: add "
                             "scenario: server and target_qps, or drop measured_at")
        return self


class GateRule(Strict):
    """How the release gate decides (see serve_bench.gate): on point estimates, or only where the
    95% intervals of the drop and of the p99 are within the red line and the budget."""

    decision: Literal["point", "confident"] = Field(
        "confident", description="confident: the drop's and the p99's 95% upper bounds must be within the "
                                 "limits; point: the estimates themselves")


class DistributedSettings(Strict):
    """How many processes a training stage runs on, launched with torchrun (``python -m torch.distributed.run``).

    More than one process (``nproc_per_node × nnodes``) runs the stage under DistributedDataParallel;
    ``batch_size`` is then per process, so the global batch is ``batch_size × processes × grad_accum``.
    """

    nproc_per_node: int = Field(1, ge=1, description="processes on this machine (one per GPU on a GPU machine)")
    nnodes: int = Field(1, ge=1, description="machines taking part; each runs `compress join` with its node_rank")
    node_rank: int = Field(0, ge=0, description="this machine's place; 0 runs `compress run` and writes records")
    rdzv_endpoint: str = Field("localhost:29400", description="host:port of node 0's rendezvous (nnodes > 1)")
    rdzv_id: str | None = Field(None, description="rendezvous id; default: derived from the run and the stage")
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: nccl with GPUs, gloo on CPU")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of the whole group after a failure")
    sync_batchnorm: bool | None = Field(
        None, description="BatchNorm statistics over the global batch (torch's SyncBatchNorm: GPUs only); "
                          "default: on with GPUs, off on CPU, where each process normalises over its own batch")
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="learning rate × processes (linear, for SGD), × √processes (sqrt), or as given (none)")
    join_timeout_s: float = Field(600.0, gt=0, description="how long the rendezvous waits for every node")

    @model_validator(mode="after")
    def _check(self) -> "DistributedSettings":
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nnodes {self.nnodes}")
        if ":" not in self.rdzv_endpoint:
            raise ValueError(f"rdzv_endpoint {self.rdzv_endpoint!r} must be host:port")
        return self

    @property
    def processes(self) -> int:
        return self.nproc_per_node * self.nnodes

    def result_settings(self) -> dict:
        """What changes the trained weights (a cache key part); where the processes run does not."""
        return {"processes": self.processes, "sync_batchnorm": self.sync_batchnorm, "lr_scaling": self.lr_scaling}


class MlflowSettings(Strict):
    tracking_uri: str | None = Field(
        None, description="an MLflow tracking URI (http://host:5000, sqlite:///path/mlflow.db, databricks) or a plain "
                          "folder (a local store: mlflow.db and the artifacts in it); default: MLFLOW_TRACKING_URI "
                          "where set, else a local store in the run directory's parent folder")
    experiment: str | None = Field(None, description="default: the pipeline's name")
    run_name: str | None = Field(None, description="default: the run directory's name")


class TrackingSettings(Strict):
    """Where a run is logged besides its run directory; nothing is logged where this section is absent."""

    mlflow: MlflowSettings | None = Field(None, description="log every stage's settings and metrics and the report "
                                                            "to MLflow as the run goes (pip install 'compress[tracking]')")
    tensorboard: bool = Field(False, description="TensorBoard scalars from every train stage, as a stage's own "
                                                 "tensorboard: true")


class PipelineConfig(Strict):
    name: str = Field(..., pattern=NAME_PATTERN, description="the pipeline's name: its run folder is runs/<name> "
                                                            "unless run_dir says otherwise")
    task: Literal["classification", "detection", "segmentation"] = Field(
        "classification", description="detection: boxes and classes from COCO-format data (data.name coco or "
                                      "shapes), judged by COCO mAP (red_line.metric map or map50); segmentation: a "
                                      "class per pixel (data.name masks, voc, coco_masks or scenes), judged by mIoU "
                                      "(red_line.metric miou or pixel_acc)")
    seed: int = Field(0, ge=0, description="seeds initialisation and every stage's shuffling (the "
                                                            "split has its own: data.split_seed)")
    run_dir: str | None = Field(None, description="default: runs/<name> beside the current directory")
    data: DataConfig = Field(..., description="the images: a built-in set, your image folder or COCO folder")
    model: ModelConfig = Field(..., description="the architecture and, optionally, the weights to start from")
    red_line: RedLine = Field(default_factory=RedLine, description="how much accuracy the shipped file may lose "
                                                                   "against the baseline")
    latency: Latency = Field(default_factory=Latency, description="the latency service-level objective the gate "
                                                                  "checks")
    gate: GateRule = Field(default_factory=GateRule, description="how the release gate decides")
    distributed: DistributedSettings = Field(default_factory=DistributedSettings,
                                             description="processes of the training stages (a stage may override)")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads of the stages run in this process "
                                                        "(default: torch's, one per core); float sums are split by "
                                                        "thread, so trained weights are bit-identical only at the "
                                                        "same count")
    tracking: TrackingSettings = Field(default_factory=TrackingSettings, description="experiment tracking (MLflow)")
    nms: NmsSettings = Field(default_factory=NmsSettings,
                             description="task: detection: what follows the decode of every detector, wherever mAP is "
                                         "measured (validation, the INT8 ladder, the bench) and in every timed request")
    stages: list[dict[str, Any]] = Field(..., min_length=1, description="the stages in order, each with a name and "
                                                                       "a kind (its settings below, by kind)")

    @model_validator(mode="after")
    def _task(self) -> "PipelineConfig":
        from train.tasks import task_named

        problem = task_named(self.task).red_line_problem(self.data.name, self.red_line.metric)
        if problem:
            raise ValueError(problem)
        return self


def check_metric_has_meaning(metric: str, num_classes: int | None) -> None:
    """A top-k red line on k classes or fewer would pass whatever the model does (every image is a hit)."""
    from train.evaluate import meaningful_metrics

    if metric not in ("top1", "top5"):  # mAP and mIoU have a meaning at any class count
        return
    if num_classes is not None and metric not in meaningful_metrics(num_classes):
        raise ValueError(f"{metric} is meaningless with {num_classes} classes (every image would "
                         f"count as a hit); use metric: top1")


class StageConfig(Strict):
    """Fields every stage has; each kind subclasses this with its own settings."""

    name: str = Field(..., pattern=NAME_PATTERN, description="the stage's name: its folder in the run, and how "
                                                            "later stages and the command line refer to it")
    kind: str = Field(..., description="what the stage does (train, prune, quantize, …)")
    inputs: dict[str, str] = Field(
        default_factory=dict,
        description="role -> 'stage' or 'stage.artifact'; default model: the latest earlier stage that makes one",
    )



def limit_problem(value: float, section: type[Strict], field: str) -> str | None:
    """Why ``value`` is not a valid ``field`` of ``section`` (RedLine, Latency), or None: a limit given on the
    command line obeys the rule that field has in a pipeline file."""
    try:
        section.model_validate({field: value})
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None
