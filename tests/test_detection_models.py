"""The detector contract, by the project's own detector and by torchvision's SSDlite behind it: raw maps in
training, clipped boxes and scores in eval, a loss that trains, an ONNX export whose decode tail is found from
the graph, pruning that keeps the head convolutions, and distillation that pairs cells and tolerates a pruned
(narrower) student."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from compress.distillation.detection_kd import DetectionDistillation, attention_transfer, bernoulli_kd
from compress.distillation.loss import DistillationMismatch
from compress.pruning.channel_pruning import PruneTarget, SurgerySettings, prune
from compress.quantization.detection_int8 import tail_nodes
from export.onnx_export import export_onnx
from train.detection.model import TinyFCOS
from train.detection.torchvision_ssdlite import SSDLite


def _targets(n: int, size: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        xy = torch.rand(2, 2, generator=g) * size * 0.6
        boxes = torch.cat([xy, xy + 8 + torch.rand(2, 2, generator=g) * size * 0.3], 1)
        out.append({"boxes": boxes, "classes": torch.tensor([0, 2]), "crowd": torch.tensor([False, False])})
    return out


def test_tiny_fcos_answers_raw_maps_in_training_and_clipped_boxes_in_eval():
    model = TinyFCOS(3, width=8)
    x = torch.randn(2, 3, 64, 64)
    cls, box, feats = model(x)
    assert cls.shape == (2, 3, 8, 8) and box.shape == (2, 4, 8, 8) and feats.shape[0] == 2
    with torch.no_grad():
        model.box_head.bias.fill_(8.0)  # huge distances: boxes would leave the canvas
        out = model.eval()(x)
    assert out.shape == (2, 64, 7)
    assert out[..., :4].min() >= 0 and out[..., :4].max() <= 64
    assert ((out[..., 4:] >= 0) & (out[..., 4:] <= 1)).all()


@pytest.fixture(scope="module")
def ssdlite():
    torch.manual_seed(0)
    return SSDLite(3, width_mult=0.5)


def test_torchvisions_ssdlite_trains_with_its_own_loss_and_decodes_to_the_contract(ssdlite):
    model = copy.deepcopy(ssdlite).train()
    x = torch.randn(4, 3, 128, 128)
    targets = _targets(4, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        terms = model.loss(model(x), targets)
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        losses.append(float(terms["loss"]))
    assert np.isfinite(losses).all() and losses[-1] < 0.8 * losses[0]
    with torch.no_grad():
        out = model.eval()(x)
    anchors = model._anchors[next(iter(model._anchors))]
    assert out.shape == (4, anchors.shape[0], 7)
    assert out[..., :4].min() >= 0 and out[..., :4].max() <= 128
    assert torch.all(out[..., 4:].sum(-1) <= 1 + 1e-5)  # softmax without the background column


@pytest.mark.slow  # torch.export of MobileNetV3: 30 s
def test_ssdlite_exports_and_its_decode_tail_is_found_from_the_graph(ssdlite, tmp_path):
    import onnxruntime as ort

    model = copy.deepcopy(ssdlite).eval()
    x = torch.randn(2, 3, 128, 128)
    export_onnx(model, x, tmp_path / "ssd.onnx")
    session = ort.InferenceSession(str(tmp_path / "ssd.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.abs(got - expected)[..., :4].max() < 1e-2 and np.abs(got - expected)[..., 4:].max() < 1e-4
    tail = tail_nodes(tmp_path / "ssd.onnx", model.head_convs)
    assert len(tail) > 10  # the per-level reshapes, the concatenations, softmax, the box decode


def test_pruning_keeps_every_head_convolution_whole(ssdlite):
    model = copy.deepcopy(ssdlite)
    modules = dict(model.named_modules())
    heads = [modules[n] for n in model.head_convs]
    before = [(h.in_channels, h.out_channels) for h in heads]
    result = prune(model, torch.zeros(1, 3, 128, 128), PruneTarget(macs=0.6), heads,
                   SurgerySettings(importance="magnitude"))
    assert result.macs_after <= 0.6 * result.macs_before
    assert [h.out_channels for h in heads] == [b[1] for b in before]  # class count + background, 4 × anchors
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, 3, 128, 128)).shape[-1] == 7


def test_distillation_is_zero_against_itself_and_pairs_a_narrower_student():
    torch.manual_seed(0)
    teacher = TinyFCOS(3, width=16)
    x = torch.randn(2, 3, 64, 64)
    targets = _targets(2, 64)
    same = DetectionDistillation(copy.deepcopy(teacher), lambda rows: targets, stride=8, alpha=1.0)
    student = copy.deepcopy(teacher).eval()  # BatchNorm as the teacher runs it (training mode uses batch statistics)
    terms = same(x, student.maps(x), torch.arange(2))
    assert float(terms["kd_cls"]) == pytest.approx(0, abs=1e-6) and float(terms["feature"]) == pytest.approx(0, abs=1e-9)
    narrow = TinyFCOS(3, width=8).train()
    terms = same(x, narrow(x), torch.arange(2))
    assert float(terms["kd_cls"]) > 0 and np.isfinite(float(terms["loss"]))
    terms["loss"].backward()
    assert narrow.cls_head.weight.grad.abs().sum() > 0
    # cells at other places (another input size for the student) are refused, not averaged
    other = DetectionDistillation(copy.deepcopy(teacher), lambda rows: targets, stride=8)
    with pytest.raises(DistillationMismatch, match="not at the same places"):
        other(x, narrow(torch.randn(2, 3, 96, 96)), torch.arange(2))


def test_the_soft_terms_measure_disagreement():
    logits = torch.randn(2, 3, 4, 4)
    assert float(bernoulli_kd(logits, logits, 2.0)) == pytest.approx(0, abs=1e-6)
    assert float(bernoulli_kd(logits, logits + 1, 2.0)) > 0
    f = torch.randn(2, 8, 4, 4)
    assert float(attention_transfer(f, f * 3)) == pytest.approx(0, abs=1e-9)  # attention is scale-free
    assert float(attention_transfer(f[:, :3], torch.randn(2, 16, 4, 4))) > 0  # any channel counts


class UserDetector(torch.nn.Module):
    """A detector of a user's own, following the contract with the project's DecodeTail: raw maps in training,
    decoded boxes and scores in eval, ``stride`` and ``head_convs``."""

    stride = 4
    head_convs = ("cls", "box")

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        from train.detection.model import DecodeTail, conv_bn

        self.body = torch.nn.Sequential(conv_bn(in_channels, 8, 2), conv_bn(8, 16, 2))
        self.cls, self.box = torch.nn.Conv2d(16, num_classes, 1), torch.nn.Conv2d(16, 4, 1)
        self.decode = DecodeTail(self.stride)

    def forward(self, x):
        f = self.body(x)
        maps = (self.cls(f), self.box(f))
        return maps if self.training else self.decode(*maps)


def user_detector(num_classes: int, in_channels: int = 3) -> UserDetector:
    return UserDetector(num_classes, in_channels)


def test_a_users_detector_by_module_callable_trains_with_the_fcos_loss_and_decodes():
    from train.detection.training import loss_hook
    from train.models import build_model

    model = build_model("tests.test_detection_models:user_detector", 3, 3)
    targets = _targets(2, 32)

    class Bundle:
        def boxes_of(self, rows):
            return [targets[int(r)] for r in rows]

    loss = loss_hook(Bundle(), model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(2, 3, 32, 32)
    values = []
    for _ in range(8):
        terms = loss(x, model.train()(x), torch.arange(2))
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        values.append(float(terms["loss"]))
    assert values[-1] < values[0]
    with torch.no_grad():
        assert model.eval()(x).shape == (2, 64, 7)
