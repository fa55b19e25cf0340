"""The distillation loss by hand, α = 0, the frozen teacher, mismatches, and the distill stage."""
from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from compress.cli import main
from compress.distillation.loss import DistillationLoss, DistillationMismatch, check_pair, distillation_terms


def test_loss_equals_a_hand_computed_value_including_t_squared():
    student = torch.tensor([[2.0, 0.0, -1.0]])
    teacher = torch.tensor([[1.0, 1.0, 0.0]])
    labels = torch.tensor([0])
    T, alpha = 2.0, 0.3

    def softmax(row):
        exps = [math.exp(v / T) for v in row]
        return [e / sum(exps) for e in exps]

    p_t, p_s = softmax([1.0, 1.0, 0.0]), softmax([2.0, 0.0, -1.0])
    kl = sum(t * (math.log(t) - math.log(s)) for t, s in zip(p_t, p_s))
    ce = -math.log(math.exp(2.0) / (math.exp(2.0) + math.exp(0.0) + math.exp(-1.0)))
    terms = distillation_terms(student, teacher, labels, T, alpha)
    assert terms["kd"].item() == pytest.approx(T * T * kl, rel=1e-5)
    assert terms["ce"].item() == pytest.approx(ce, rel=1e-5)
    assert terms["loss"].item() == pytest.approx(alpha * T * T * kl + (1 - alpha) * ce, rel=1e-5)


def test_alpha_zero_is_cross_entropy():
    torch.manual_seed(0)
    student, teacher, labels = torch.randn(8, 5), torch.randn(8, 5), torch.randint(0, 5, (8,))
    terms = distillation_terms(student, teacher, labels, temperature=4.0, alpha=0.0)
    assert torch.equal(terms["loss"], nn.functional.cross_entropy(student, labels))


def test_the_hard_term_keeps_the_students_label_smoothing():
    from compress.distillation.loss import LossSettings
    from compress.stages.training_run import TrainingSettings, teacher_loss

    torch.manual_seed(0)
    teacher, x = nn.Linear(4, 5), torch.randn(16, 4)
    student, labels = torch.randn(16, 5) * 4, torch.randint(0, 5, (16,))
    loss_fn = teacher_loss(teacher, TrainingSettings(label_smoothing=0.2, amp="off", device="cpu"),
                           LossSettings(alpha=0.0), "stages.distill")
    smoothed = nn.functional.cross_entropy(student, labels, label_smoothing=0.2)
    plain = nn.functional.cross_entropy(student, labels)
    assert abs(smoothed.item() - plain.item()) > 0.1  # the setting makes a visible difference here
    assert loss_fn(x, student, labels)["loss"].item() == pytest.approx(smoothed.item(), rel=1e-6)


def test_the_teacher_gets_no_gradients_and_stays_in_eval_mode():
    teacher = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    student = nn.Linear(4, 3)
    loss_fn = DistillationLoss(teacher.train(), temperature=4.0, alpha=0.5)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    running = teacher[1].running_mean.clone()
    loss_fn(x, student(x), y)["loss"].backward()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert student.weight.grad is not None and not teacher.training
    assert torch.equal(teacher[1].running_mean, running)  # eval mode: BN statistics untouched


def test_cached_teacher_logits_are_reused():
    calls = {"n": 0}

    class Counting(nn.Module):
        def forward(self, x):
            calls["n"] += len(x)
            return x[:, :3]

    loss_fn = DistillationLoss(Counting(), cache=True)
    x = torch.randn(4, 5)
    first = loss_fn.teacher_logits(x)
    again = loss_fn.teacher_logits(x)
    assert calls["n"] == 4 and torch.equal(first, again)


def test_mismatched_classes_or_preprocessing_are_config_errors():
    teacher = {"architecture": {"num_classes": 10}, "preprocessing": {"channels": 1, "mean": [0.1], "std": [0.3]}}
    student = {"architecture": {"num_classes": 5}, "preprocessing": {"channels": 1, "mean": [0.1], "std": [0.3]}}
    with pytest.raises(DistillationMismatch, match=r"teacher train.model has 10 classes but student small has 5"):
        check_pair(teacher, student, "train.model", "small")
    student = {"architecture": {"num_classes": 10}, "preprocessing": {"channels": 1, "mean": [0.5], "std": [0.3]}}
    with pytest.raises(DistillationMismatch, match=r"expect different inputs \(mean \[0.1\] vs \[0.5\]\)"):
        check_pair(teacher, student, "train.model", "small")


def test_distill_stage_trains_a_fresh_student(tmp_path, tiny_config, write_pipeline, capsys):
    tiny_config["stages"].append({"name": "kd", "kind": "distill", "student": {"name": "resnet20", "args": {"width": 2}},
                                  "epochs": 2, "batch_size": 64, "amp": "off", "augment": {"pad": 0},
                                  "cache_teacher": True, "checkpoint_every": 0})
    run_dir = tmp_path / "run"
    path = write_pipeline(tiny_config)
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    metrics = manifest["stages"]["kd"]["metrics"]
    assert metrics["teacher"] == "train.model" and metrics["params"] < manifest["stages"]["train"]["metrics"]["params"]
    assert [set(p) >= {"epoch", "train_loss", "train_kd", "train_ce"} for p in metrics["loss_parts"]] == [True, True]
    assert sorted(manifest["artifacts"]["kd.model"]["made_from"]) == ["train.model"]
    capsys.readouterr()
    assert main(["run", str(path), "--run-dir", str(run_dir), "stages.kd.augment.pad=2"]) == 2
    assert "cache_teacher needs training without augmentation" in capsys.readouterr().err


def test_a_teacher_reference_to_a_later_stage_is_rejected(tiny_config, write_pipeline, capsys):
    tiny_config["stages"].insert(0, {"name": "kd", "kind": "distill", "teacher": "train",
                                     "student": {"name": "resnet20"}})
    assert main(["validate", str(write_pipeline(tiny_config))]) == 2
    assert "stages[0].teacher: refers to stage 'train', which is not an earlier stage (it runs later" in \
        capsys.readouterr().err
