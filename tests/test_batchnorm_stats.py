"""BatchNorm statistics re-estimated: the running figures become the images' own, in a module model and in a graph
captured for QAT, with the model's mode and momenta as they were."""
from __future__ import annotations

import torch
from torch import nn

from train.batchnorm_stats import batchnorm_count, reestimate


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, momentum=0.01), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 3)).eval()


def _images() -> torch.Tensor:
    return torch.randn(256, 1, 8, 8, generator=torch.Generator().manual_seed(1)) * 3 + 1


def test_a_module_models_statistics_become_the_mean_of_its_batches_in_whole_batches():
    model, x = _model(), _images()
    with torch.no_grad():
        conv = model[0](x)
    used = reestimate(model, [(x[i:i + 32], None) for i in range(0, 256, 32)], 200)
    assert used == 224  # whole batches of 32 until 200 were seen: each batch weighs the same
    bn = model[1]
    assert torch.allclose(bn.running_mean, conv[:used].mean((0, 2, 3)), atol=1e-5)
    # the mean of the batches' (unbiased) variances, as torch's cumulative average gives it
    batch_vars = torch.stack([conv[i:i + 32].var((0, 2, 3)) for i in range(0, used, 32)]).mean(0)
    assert torch.allclose(bn.running_var, batch_vars, rtol=1e-4)
    assert bn.momentum == 0.01 and not model.training
    assert reestimate(model, [x], 0) == 0 and reestimate(nn.Linear(2, 2), [x], 100) == 0
    kept = bn.running_mean.clone()
    assert reestimate(model, [], 100) == 0 and torch.equal(bn.running_mean, kept)  # no batch: left as it was


def test_a_qat_graphs_spoiled_statistics_come_back_and_its_momentum_and_mode_stay():
    from compress.quantization.qat_pt2e import observe, observers_paused, prepare

    model, x = _model(), _images()
    reestimate(model, [x[i:i + 32] for i in range(0, 256, 32)], 256)
    prepared = prepare(model, x[:2])
    observe(prepared, x[:64])
    prepared.eval()
    assert batchnorm_count(prepared) == 1
    with torch.no_grad():
        agree = (prepared(x) - model(x)).abs().max().item()  # fake quantization's own error
        for name, buffer in prepared.named_buffers():
            if name.endswith("running_mean"):
                buffer.add_(2.0)
        spoiled = (prepared(x) - model(x)).abs().max().item()
        with observers_paused(prepared):
            assert reestimate(prepared, [x[i:i + 32] for i in range(0, 256, 32)], 256) == 256
        restored = (prepared(x) - model(x)).abs().max().item()
    assert spoiled > 20 * agree and restored < 2 * agree, (agree, spoiled, restored)
    momenta = [n.args[6] for n in prepared.graph.nodes if str(n.target) == "aten.batch_norm.default"]
    training = [n for n in prepared.graph.nodes if str(n.target) == "aten._native_batch_norm_legit_no_training.default"
                or (str(n.target) == "aten.batch_norm.default" and n.args[5])]
    assert all(m == 0.1 for m in momenta) and not training  # back in eval mode, the capture's momentum
