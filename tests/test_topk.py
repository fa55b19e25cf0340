"""One definition of top-k: the same hits in training and in the benchmark, no top-5 of five classes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from compress.cli import main
from serve_bench.accuracy.classification import accuracy


def test_top5_exists_only_above_five_classes():
    from train.evaluate import meaningful_metrics, topk_hits

    assert meaningful_metrics(5) == ["top1"] and meaningful_metrics(6) == ["top1", "top5"]
    logits, labels = torch.randn(64, 5), torch.randint(0, 5, (64,))
    assert set(topk_hits(logits, labels)) == {"top1"}
    assert set(accuracy(logits.numpy(), labels.numpy())) == {"top1", "n"}


def test_training_and_benchmark_count_the_same_hits():
    from train.evaluate import topk_hits

    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(500, 10, generator=gen), torch.randint(0, 10, (500,), generator=gen)
    hits = topk_hits(logits, labels)
    bench = accuracy(logits.numpy(), labels.numpy())
    assert bench["top1"] == pytest.approx(100 * hits["top1"].float().mean().item(), abs=1e-3)
    assert bench["top5"] == pytest.approx(100 * hits["top5"].float().mean().item(), abs=1e-3)
    assert 40 < bench["top5"] < 60  # random logits: about half the labels are in a random top 5 of 10


@pytest.mark.parametrize("data", [
    {"name": "synthetic", "synthetic_classes": 5, "image_size": 8},
    "imagefolder-with-3-classes",
])
def test_a_top5_red_line_on_five_classes_or_fewer_is_refused_at_validation(data, tiny_config, write_pipeline,
                                                                            tmp_path, capsys):
    if data == "imagefolder-with-3-classes":
        for name in ("a", "b", "c"):
            (tmp_path / "images" / name).mkdir(parents=True)
        data = {"name": "imagefolder", "path": str(tmp_path / "images")}
    tiny_config.update(data=data, red_line={"metric": "top5", "max_drop": 1.0})
    assert main(["validate", str(write_pipeline(tiny_config))]) == 2
    assert "red_line.metric: top5 is meaningless with" in capsys.readouterr().err
    tiny_config["data"] = {"name": "synthetic", "synthetic_classes": 6, "image_size": 8}
    assert main(["validate", str(write_pipeline(tiny_config))]) == 0


def test_the_runner_refuses_a_top5_red_line_when_only_the_data_tells(tiny_config, write_pipeline, tmp_path, capsys,
                                                                    monkeypatch):
    from train import datasets

    monkeypatch.setattr(datasets, "class_count", lambda *args, **kwargs: None)  # as for a folder made later
    tiny_config.update(data={"name": "synthetic", "synthetic_classes": 4, "image_size": 8, "channels": 1},
                       red_line={"metric": "top5", "max_drop": 1.0})
    assert main(["run", str(write_pipeline(tiny_config)), "--run-dir", str(tmp_path / "run")]) == 2
    assert "red_line.metric: top5 is meaningless with 4 classes" in capsys.readouterr().err


def test_tied_scores_go_to_the_lower_class_as_argmax_breaks_them():
    """An INT8 file's logits are quantized, so exact ties happen; the recorded answer must be the served one."""
    from serve_bench.accuracy.predictions import top_k

    logits = np.random.default_rng(0).integers(0, 2, size=(5000, 10)).astype(np.float32)  # ties everywhere
    ranked = top_k(logits)
    assert (ranked[:, 0] == logits.argmax(axis=1)).all()
    assert top_k(np.array([[0, 1, 2.631, 2.631, 0, 0, 0, 0, 0, 0]], dtype=np.float32))[0].tolist() == [2, 3, 1, 0, 4]
