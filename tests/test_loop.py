"""The training loop's contracts: precision objects, hooks, accumulation, clipping, schedules, progress."""
from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from train.activation_checkpointing import checkpoint_blocks
from train.data import BatchStream, DataSpec, load_data
from train.loop import Hooks, LoopSettings, NonFiniteLoss, fit
from train.models import build_model
from train.optim import lr_factor, make_optimizer, make_scheduler, param_groups
from train.precision import make_precision
from train.progress import StepProgress

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def digits():
    return load_data(DataSpec(name="digits"))


def _stream(bundle, batch=64):
    return BatchStream(bundle.train, bundle, batch, shuffle=True, drop_last=True, seed=0)


class Linear(nn.Module):
    """No BatchNorm, so per-sample gradients add up exactly across micro-batches."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


def _fit(model, stream, amp="off", steps_lr=0.1, optimizer="sgd", hooks=None, **settings):
    precision = make_precision(amp, CPU)
    opt = make_optimizer(model, optimizer, steps_lr, 0.0, momentum=0.0)
    total = len(stream) // settings.get("grad_accum", 1) * settings.get("epochs", 1)
    sched = make_scheduler(opt, lr_factor("constant", total))
    settings.setdefault("epochs", 1)
    return fit(model, stream, None, opt, sched, precision, LoopSettings(heartbeat_s=1e9, **settings), hooks)


def test_amp_objects():
    assert make_precision("fp16", CPU).uses_scaler and not make_precision("bf16", CPU).uses_scaler
    with make_precision("bf16", CPU).autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="amp must be one of"):
        make_precision("fp8", CPU)


def test_no_weight_decay_on_norm_and_bias():
    model = build_model("resnet20", 10, 1, {"width": 4})
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedules():
    cosine = lr_factor("cosine", 100, warmup_steps=10)
    assert cosine(0) == pytest.approx(0.1) and cosine(9) == pytest.approx(1.0) and cosine(99) < 0.01
    wsd = lr_factor("wsd", 100, warmup_steps=10, decay_fraction=0.2)
    assert wsd(10) == wsd(79) == 1.0 and wsd(89) == pytest.approx(0.5) and wsd(99) < 0.1
    step = lr_factor("step", 100, milestones=(0.5, 0.75), gamma=0.1)
    assert (step(49), step(50), step(75)) == (1.0, pytest.approx(0.1), pytest.approx(0.01))


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
@pytest.mark.parametrize("total,warmup", [(10, 0), (10, 2), (100, 10)])
def test_schedules_reach_their_floor_on_the_last_step(schedule, total, warmup):
    factor = lr_factor(schedule, total, warmup_steps=warmup, decay_fraction=0.2, min_factor=0.1)
    values = [factor(step) for step in range(total)]
    assert values[-1] == pytest.approx(0.1)  # was 0.55 (wsd) / 0.12 (cosine) with 10 steps
    assert min(values) == pytest.approx(0.1) and values[-2] > 0.1 + 1e-6
    assert max(values) == pytest.approx(1.0)


def test_gradient_accumulation_matches_the_large_batch(digits):
    torch.manual_seed(0)
    a, b = Linear(), Linear()
    b.load_state_dict(a.state_dict())
    big = _fit(a, _stream(digits, 64))
    small = _fit(b, _stream(digits, 32), grad_accum=2)
    assert big.steps == small.steps == 1294 // 64 and small.effective_batch == 64
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5)


def test_clipping_bounds_the_update(digits):
    model = Linear()
    before = [p.detach().clone() for p in model.parameters()]
    stream = BatchStream(digits.train, digits, 64, shuffle=False, drop_last=True)
    hooks = Hooks(loss=lambda x, logits, y: {"loss": 1e6 * logits.square().mean()})
    _fit(model, BatchStream(stream.split.__class__(digits.train.images[:64], digits.train.labels[:64]), digits, 64,
                            shuffle=False, drop_last=True), steps_lr=1.0, clip_grad_norm=0.5, hooks=hooks)
    moved = torch.sqrt(sum(((p - q) ** 2).sum() for p, q in zip(model.parameters(), before)))
    assert moved <= 0.5 + 1e-5


def test_after_backward_sees_unscaled_gradients_under_fp16(digits):
    seen = {}

    def record(model):
        seen.setdefault("grad", model.fc.weight.grad.detach().clone())

    torch.manual_seed(0)
    model = Linear()
    reference = Linear()
    reference.load_state_dict(model.state_dict())
    one_batch = digits.train.__class__(digits.train.images[:64], digits.train.labels[:64])
    stream = BatchStream(one_batch, digits, 64, shuffle=False, drop_last=True)
    result = _fit(model, stream, amp="fp16", hooks=Hooks(after_backward=record))
    assert make_precision("fp16", CPU).scaler.get_scale() > 1000  # the loss really was scaled
    x, y = next(iter(stream.epoch(0)))
    with make_precision("fp16", CPU).autocast():
        loss = nn.functional.cross_entropy(reference(x).float(), y)
    loss.backward()
    torch.testing.assert_close(seen["grad"], reference.fc.weight.grad, rtol=2e-2, atol=1e-4)
    assert result.skipped_steps == 0


def test_fp16_steps_with_non_finite_gradients_are_skipped_and_counted(digits):
    calls = {"n": 0}

    def poison_once(x, logits, y):
        calls["n"] += 1
        loss = nn.functional.cross_entropy(logits.float(), y)
        if calls["n"] != 3:
            return {"loss": loss}
        w = logits.float().sum()
        # Value 0, but a gradient of 1e35 that overflows once the scaler multiplies it: a real fp16 overflow.
        return {"loss": loss + (w - w.detach()) * 1e35}

    result = _fit(Linear(), _stream(digits), amp="fp16", hooks=Hooks(loss=poison_once))
    assert result.skipped_steps == 1 and result.steps == 1294 // 64


def test_non_finite_loss_stops_with_advice(digits):
    hooks = Hooks(loss=lambda x, logits, y: {"loss": logits.float().sum() * float("nan")})
    with pytest.raises(NonFiniteLoss, match=r"loss became nan at step 1/20 .*lower lr.*clip_grad_norm.*amp: off"):
        _fit(Linear(), _stream(digits), hooks=hooks)


def test_loss_replacement_and_epoch_hooks(digits):
    records = []

    def mse(x, logits, y):
        aux = 0.01 * logits.float().square().mean()
        return {"loss": (logits.float() - nn.functional.one_hot(y, 10)).square().mean() + aux, "aux": aux}

    result = _fit(Linear(), _stream(digits), epochs=2, hooks=Hooks(loss=mse, on_epoch=records.append))
    assert [r["epoch"] for r in records] == [1, 2]
    # Every loss part is logged per epoch, and the total includes the extra term.
    assert 0 < records[1]["train_aux"] < records[1]["train_loss"]
    assert result.final_loss < 1.0  # an MSE against one-hot targets, not a cross-entropy


def test_activation_checkpointing_keeps_names_and_gradients():
    torch.manual_seed(0)
    a = build_model("resnet20", 10, 1, {"width": 4})
    b = build_model("resnet20", 10, 1, {"width": 4})
    b.load_state_dict(a.state_dict())
    checkpoint_blocks(b, ["layer1", "layer2"])
    assert list(a.state_dict()) == list(b.state_dict())
    x = torch.randn(4, 1, 8, 8)
    a(x).sum().backward()
    b(x).sum().backward()
    torch.testing.assert_close(a.conv1.weight.grad, b.conv1.weight.grad)
    with pytest.raises(ValueError, match=r"no module named layer9; top-level modules: conv1"):
        checkpoint_blocks(b, ["layer9"])


def test_progress_logs_heartbeats_when_not_a_terminal(caplog):
    caplog.set_level("INFO", logger="train.progress")
    out = io.StringIO()
    progress = StepProgress("train", 10, heartbeat_s=0.0, stream=out)
    for step in range(1, 11):
        progress.update(step, loss=0.5, lr=1e-3, img_s=1000.0)
    progress.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10 and lines[-1].startswith("train: step 10/10 (100%) loss 0.5000  lr 1.00e-03  1,000 img/s")
    assert out.getvalue() == ""  # records, not prints: the run's console (or the application's logging) shows them
    caplog.clear()
    progress = StepProgress("train", 10, heartbeat_s=3600, stream=io.StringIO())
    for step in range(1, 10):
        progress.update(step, loss=0.5)
    assert caplog.records == []  # no line before the heartbeat interval, except at the end
