"""Segmenters through the stages' algorithms: built by name with their class convolutions named, pruned with the
classes kept, distilled pixel by pixel, exported with parity judged on pixels, and reduced to masks in a
runtime's worker."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from compress.distillation.loss import DistillationLoss, soft_term
from train.models import build_model
from train.segmentation.training import pixel_loss


@pytest.mark.parametrize("name, heads", [
    ("tiny_segmenter", ("classifier",)),
    ("lraspp_mobilenet_v3_large", ("classifier.low_classifier", "classifier.high_classifier")),
    ("deeplabv3_mobilenet_v3_large", ("classifier.4", "aux_classifier.4")),
    ("smp:Unet", ("segmentation_head.0",)),
])
def test_a_segmenter_answers_logits_at_the_input_resolution(name, heads):
    model = build_model(name, 5, 3, {"encoder_name": "resnet18"} if name.startswith("smp:") else {})
    assert model.head_convs == heads
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 48)).shape == (2, 5, 64, 48)
    model.train()
    out = model(torch.randn(2, 3, 64, 48))
    if name.startswith("deeplabv3"):  # the auxiliary head trains beside the main one, and only in training
        assert isinstance(out, tuple) and out[1].shape == (2, 5, 64, 48)


def test_torchvision_checkpoint_keys_load_into_the_wrapper_key_for_key():
    from torchvision.models import segmentation

    reference = segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4,
                                                          aux_loss=True)
    ours = build_model("deeplabv3_mobilenet_v3_large", 4, 3, {})
    assert set(ours.state_dict()) == set(reference.state_dict())
    ours.load_state_dict(reference.state_dict())
    ours.eval(), reference.eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(ours(x), reference(x)["out"], atol=1e-5)


def test_the_pixel_loss_leaves_ignored_pixels_out_and_weighs_the_auxiliary_head():
    logits = torch.randn(2, 3, 8, 8)
    masks = torch.randint(0, 3, (2, 8, 8), dtype=torch.uint8)
    masks[:, :4] = 255
    alone = pixel_loss(logits, masks, 255)["loss"]
    assert alone == pytest.approx(float(F.cross_entropy(logits[:, :, 4:], masks[:, 4:].long())), rel=1e-5)
    both = pixel_loss((logits, logits * 2), masks, 255)
    assert both["loss"] == pytest.approx(float(both["out"] + 0.5 * both["aux"]), rel=1e-6)


def test_the_soft_term_is_batchmean_for_a_classifier_and_the_pixel_mean_for_a_segmenter():
    s, t = torch.randn(4, 6), torch.randn(4, 6)
    batchmean = F.kl_div(F.log_softmax(s / 2, 1), F.log_softmax(t / 2, 1), reduction="batchmean", log_target=True) * 4
    assert float(soft_term(s, t, 2.0)) == pytest.approx(float(batchmean), rel=1e-6)
    s4, t4 = torch.randn(2, 6, 5, 7), torch.randn(2, 6, 5, 7)
    per_pixel = [soft_term(s4[:, :, i, j], t4[:, :, i, j], 2.0) for i in range(5) for j in range(7)]
    assert float(soft_term(s4, t4, 2.0)) == pytest.approx(float(torch.stack(per_pixel).mean()), rel=1e-5)


def test_a_segmenter_distils_with_its_own_hard_loss():
    teacher, student = build_model("tiny_segmenter", 3, 3, {"width": 8}), build_model("tiny_segmenter", 3, 3, {"width": 8})
    masks = torch.randint(0, 3, (2, 32, 32), dtype=torch.uint8)
    masks[:, :8] = 255
    kd = DistillationLoss(teacher, temperature=2.0, alpha=0.25,
                          hard_loss=lambda x, out, y: pixel_loss(out, y, 255))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        terms = kd(x, student(x), masks)
    assert float(terms["loss"]) == pytest.approx(0.25 * float(terms["kd"]) + 0.75 * float(terms["ce"]), rel=1e-5)
    with torch.no_grad():
        assert float(terms["ce"]) == pytest.approx(float(pixel_loss(student(x), masks, 255)["loss"]), rel=1e-4)
        kd.ignore_index = 255  # the soft term leaves the void rows out too, as the hard term does
        scored_only = soft_term(student(x)[:, :, 8:], teacher(x)[:, :, 8:], 2.0)
        assert float(kd(x, student(x), masks)["kd"]) == pytest.approx(float(scored_only), rel=1e-4)


def test_pruning_a_segmenter_keeps_its_classes_and_reaches_the_target():
    from compress.pruning.channel_pruning import PruneTarget, prune

    model = build_model("tiny_segmenter", 4, 3, {"width": 16})
    gen = torch.Generator().manual_seed(0)
    for m in model.modules():  # as a sparsity phase leaves them: scales that rank the channels
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.data = torch.rand(m.num_features, generator=gen)
    example = torch.randn(1, 3, 64, 64)
    result = prune(model, example, PruneTarget(macs=0.6), [model.classifier])
    assert result.macs_after <= 0.6 * result.macs_before
    model.eval()
    with torch.no_grad():
        assert model(example).shape == (1, 4, 64, 64)
    assert model.classifier.out_channels == 4


def test_the_export_is_judged_on_pixels_and_a_worker_hands_back_masks(tmp_path):
    from export.onnx_export import export_onnx
    from export.parity import check_parity
    from serve_bench.runners import make_runner, predict

    model = build_model("tiny_segmenter", 3, 3, {"width": 8}).eval()
    images = torch.randn(4, 3, 48, 48)
    path = tmp_path / "model.onnx"
    export_onnx(model, images[:1], path)
    results = check_parity(path, model, images, [1, 2], tolerance=1e-3, min_agreement=99.0)
    assert all(r.top1_agreement > 99.0 and r.n == 4 for r in results)
    with make_runner("onnxruntime", path, threads=1) as runner:
        masks = predict(runner, images.numpy(), 2, "argmax")
    with torch.no_grad():
        expected = model(images).argmax(1).numpy()
    assert masks.dtype == np.uint8 and masks.shape == (4, 48, 48)
    assert (masks == expected).mean() > 0.99


def test_a_from_scratch_model_with_slow_batchnorm_is_warned_about_and_the_segmenter_takes_a_momentum():
    from compress.stages.training_run import slow_batchnorm

    slow = build_model("lraspp_mobilenet_v3_large", 4, 3, {})  # torchvision's MobileNetV3: momentum 0.01
    assert "still 76% their initial values" in slow_batchnorm(slow, 27)
    assert slow_batchnorm(slow, 200) is None  # 200 steps × 0.01: the initial statistics are forgotten
    assert slow_batchnorm(build_model("lraspp_mobilenet_v3_large", 4, 3, {"bn_momentum": 0.1}), 27) is None
    trained = build_model("lraspp_mobilenet_v3_large", 4, 3, {})
    for m in trained.modules():  # statistics loaded with trained weights: nothing to forget
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.fill_(0.3)
    assert slow_batchnorm(trained, 27) is None
