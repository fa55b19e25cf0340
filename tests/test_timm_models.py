"""timm architectures by name (``timm:<name>``), and pruning that works on them: a timm CNN with
BatchNorm, a ConvNeXt (LayerNorm only) and a ViT (whole attention heads), each small."""
from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from torch import nn

from compress.cli import main
from compress.errors import ConfigError
from compress.pruning.channel_pruning import PruneTarget, PruningInputError, SurgerySettings, prune
from compress.stages.prune_stage import PruneConfig, _check_criterion, _protected
from tests.conftest import TINY
from train.model_io import describe, load_model, save_model
from train.models import ModelError, build_model, check_model

VIT_ARGS = {"img_size": 32, "patch_size": 8, "depth": 2, "embed_dim": 48, "num_heads": 3}
FAMILIES = {  # name → small arguments
    "timm:mobilenetv3_small_050": {},
    "timm:convnext_atto": {},
    "timm:vit_tiny_patch16_224": VIT_ARGS,
}
CLASSIFIERS = {"timm:mobilenetv3_small_050": "classifier", "timm:convnext_atto": "head.fc",
               "timm:vit_tiny_patch16_224": "head"}
SHAPE = (3, 32, 32)


@pytest.fixture(autouse=True)
def one_thread():
    """Models this small run fastest on one thread, and a busy second core cannot stall them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _spread_gammas(model: nn.Module) -> None:
    for bn in model.modules():
        if isinstance(bn, nn.BatchNorm2d):
            bn.weight.data = torch.rand_like(bn.weight) + 0.01


@pytest.mark.parametrize("name, args", FAMILIES.items())
def test_each_family_builds_small_for_the_data_shape(name, args):
    torch.manual_seed(0)
    model = build_model(name, 7, 3, args).eval()
    assert model(torch.randn(2, *SHAPE)).shape == (2, 7)
    check_model(name, 3)  # and preflight accepts the name


def test_a_timm_model_takes_the_data_channel_count():
    model = build_model("timm:convnext_atto", 4, 1).eval()
    assert model(torch.randn(1, 1, 32, 32)).shape == (1, 4)


def test_vit_attention_reads_its_head_count_from_its_weights():
    model = build_model("timm:vit_tiny_patch16_224", 10, 3, VIT_ARGS)
    attn = model.blocks[0].attn
    assert (attn.num_heads, attn.head_dim, attn.attn_dim) == (3, 16, 48)
    assert "num_heads" not in vars(attn)  # derived, so a replayed pruning history leaves it right


@pytest.mark.parametrize("name, expected", [
    ("timm:convnxt_atto", r"model.name 'timm:convnxt_atto': timm .* has no model 'convnxt_atto'; "
                          r"close matches: timm:convnext_atto"),
    ("timm:vit_tiny_patch16", r"close matches: .*timm:vit_tiny_patch16_224"),
    ("timm:", r"write 'timm:<name>'"),
])
def test_an_unknown_timm_name_suggests_close_matches(name, expected):
    with pytest.raises(ModelError, match=expected):
        build_model(name, 10, 3)
    with pytest.raises(ModelError, match=expected):
        check_model(name, 3)


def test_pipeline_owned_arguments_are_refused():
    with pytest.raises(ModelError, match=r"model.args.pretrained .* never downloaded; give .* model.weights"):
        build_model("timm:convnext_atto", 10, 3, {"pretrained": True})
    with pytest.raises(ModelError, match=r"model.args.num_classes .* comes from the data"):
        build_model("timm:convnext_atto", 10, 3, {"num_classes": 3})
    with pytest.raises(ModelError, match=r"rejected its arguments \['embed_dim'\]"):
        build_model("timm:vit_tiny_patch16_224", 10, 3, {"embed_dim": 50})  # not divisible by 3 heads


def test_missing_timm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm now raises ImportError
    with pytest.raises(ModelError, match=r"needs the timm package.*pip install timm"):
        check_model("timm:convnext_atto", 3)


def _prune_small(name: str, args: dict, settings: SurgerySettings, macs: float = 0.6):
    torch.manual_seed(0)
    model = build_model(name, 10, 3, args).eval()
    _spread_gammas(model)
    protected = _protected(model, [], "stages.prune")
    return model, prune(model, torch.zeros(1, *SHAPE), PruneTarget(macs=macs), protected, settings)


def _round_trip(tmp_path, name: str, args: dict, model: nn.Module, history: list) -> None:
    description = describe(name, 10, 3, args, {}, pruning={"history": history, "input_shape": list(SHAPE)})
    save_model(model, tmp_path / "pruned", description)
    reloaded, _ = load_model(tmp_path / "pruned")
    x = torch.randn(3, *SHAPE)
    out = model(x)
    assert out.shape == (3, 10)
    assert torch.equal(out, reloaded.eval()(x))
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, args", FAMILIES.items())
def test_magnitude_pruning_shrinks_each_family_and_it_reloads(tmp_path, name, args):
    model, result = _prune_small(name, args, SurgerySettings(importance="magnitude"))
    print(f"{name}: MACs {result.macs_before:,} → {result.macs_after:,}, params {result.params_before:,} → "
          f"{result.params_after:,}, heads {result.heads_before} → {result.heads_after}")
    assert result.macs_after <= 0.8 * result.macs_before  # at least 20% fewer MACs
    assert result.params_after <= 0.9 * result.params_before
    assert model.get_submodule(CLASSIFIERS[name]).out_features == 10
    assert result.not_pruned["the classifier: keeps its class count"] == [CLASSIFIERS[name]]
    json.dumps(result.history)  # plain JSON, as model.json stores it
    _round_trip(tmp_path, name, args, model, result.history)


def test_vit_loses_whole_heads_and_says_what_it_kept(tmp_path):
    # Layer by layer: each attention loses ⌊0.34·3⌋ = 1 head, and the embedding width shrinks too.
    model, result = _prune_small("timm:vit_tiny_patch16_224", VIT_ARGS,
                                 SurgerySettings(importance="magnitude", head_ratio=0.34, global_pruning=False), macs=0.45)
    assert result.heads_before == {"blocks.0.attn": 3, "blocks.1.attn": 3}
    assert result.heads_after == {"blocks.0.attn": 2, "blocks.1.attn": 2}
    for block in model.blocks:
        attn = block.attn
        assert attn.qkv.out_features == 3 * attn.num_heads * 16 and attn.proj.in_features == attn.num_heads * 16
    assert result.not_pruned[next(r for r in result.not_pruned if r.startswith("attention width"))] == [
        "blocks.0.attn.qkv", "blocks.1.attn.qkv"]
    assert result.unwrapped == ["cls_token (dim 2)", "pos_embed (dim 2)"]  # pruned along the embedding width
    assert model.cls_token.shape[-1] < 48 and model.pos_embed.shape[-1] == model.cls_token.shape[-1]
    assert any("Unwrapped parameters" in w for w in result.warnings)
    _round_trip(tmp_path, "timm:vit_tiny_patch16_224", VIT_ARGS, model, result.history)


def test_global_head_ranking_keeps_a_head_in_every_attention():
    _, result = _prune_small("timm:vit_tiny_patch16_224", VIT_ARGS, SurgerySettings(importance="magnitude",
                                                                                   head_ratio=0.8), macs=0.6)
    assert sum(result.heads_after.values()) == 2 and all(n == 1 for n in result.heads_after.values())


def test_vit_head_ratio_zero_keeps_every_head():
    _, result = _prune_small("timm:vit_tiny_patch16_224", VIT_ARGS, SurgerySettings(importance="magnitude",
                                                                                   head_ratio=0.0))
    assert result.heads_after == result.heads_before and result.macs_after <= 0.6 * result.macs_before


def test_bn_scale_on_a_timm_cnn_names_the_groups_it_cannot_rank(tmp_path):
    model, result = _prune_small("timm:mobilenetv3_small_050", {}, SurgerySettings(importance="bn_scale"))
    assert result.macs_after <= 0.6 * result.macs_before
    unranked = result.not_pruned["bn_scale cannot rank it: no BatchNorm in its channel group"]
    assert "conv_head" in unranked and any(n.endswith("se.conv_reduce") for n in unranked)
    _round_trip(tmp_path, "timm:mobilenetv3_small_050", {}, model, result.history)


@pytest.mark.parametrize("name, args", [("timm:convnext_atto", {}), ("timm:vit_tiny_patch16_224", VIT_ARGS)])
def test_bn_scale_without_batchnorm_is_refused_with_the_fix(name, args):
    model = build_model(name, 10, 3, args).eval()
    with pytest.raises(PruningInputError, match=r"no BatchNorm layers.*importance: magnitude"):
        prune(model, torch.zeros(1, *SHAPE), PruneTarget(macs=0.5), _protected(model, [], "stages.prune"))
    with pytest.raises(ConfigError, match=r"stages.prune.importance: bn_scale .* no BatchNorm layers \(it normalises "
                                          r"with .*LayerNorm.*\); set importance: magnitude and sparsity.epochs: 0"):
        _check_criterion(PruneConfig(name="prune"), model, "stages.prune")
    with pytest.raises(ConfigError, match=r"stages.prune.sparsity.epochs: .*set sparsity.epochs: 0"):
        _check_criterion(PruneConfig(name="prune", importance="magnitude"), model, "stages.prune")
    _check_criterion(PruneConfig(name="prune", importance="magnitude", sparsity={"epochs": 0}), model, "stages.prune")


FAST_BENCH = {"name": "bench", "kind": "bench", "min_iters": 100, "min_samples": 100, "min_duration_s": 0.0,
              "warmup_iters": 5, "warmup_s": 0.0, "block_iters": 50, "threads": 1, "settle_s": 0.0, "block_s": 0.0,
              "profile_iters": 0, "runtimes": ["onnxruntime"]}


def _pipeline(name: str, args: dict, folder) -> dict:
    """No train stage: the run starts from freshly initialised weights given as model.weights (a brought
    model), which is what a timm user does, and keeps the slow suite short; finetune still trains."""
    from safetensors.torch import save_file

    weights = folder / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(name, 10, 3, args).state_dict().items()}, str(weights))
    config = copy.deepcopy(TINY)
    config["data"] = {"name": "digits", "channels": 3, "image_size": 32}
    config["model"] = {"name": name, "args": args, "weights": str(weights)}
    config["stages"] = []
    config["red_line"] = {"metric": "top1", "max_drop": 100.0}  # a 1-epoch model: the ladder need not climb
    config["latency"] = {"p99_budget_ms": 10000.0, "batch_size": 1}
    config["stages"] += [
        {"name": "prune", "kind": "prune", "importance": "magnitude", "target": {"macs": 0.6},
         "deployed_latency": {"enabled": False},
         "sparsity": {"epochs": 0}, "finetune": {"epochs": 1, "amp": "off", "batch_size": 64}},
        {"name": "quantize", "kind": "quantize", "flavours": ["cpu"], "calibration": {"method": "minmax", "samples": 64},
         "fallback": {"enabled": False}, "qat": {"epochs": 1}},
        {"name": "export", "kind": "export", "formats": ["onnx"], "parity": {"samples": 32}},
        FAST_BENCH]
    return config


@pytest.mark.slow  # a CNN with squeeze-excite and hard activations, and a LayerNorm transformer; ConvNeXt's
# LayerNorm CNN is pruned, refused bn_scale and round-tripped by the fast tests above
@pytest.mark.parametrize("name, args", [(n, a) for n, a in FAMILIES.items() if n != "timm:convnext_atto"])
def test_prune_quantize_export_bench_end_to_end(tmp_path, write_pipeline, capsys, name, args):
    path = write_pipeline(_pipeline(name, args, tmp_path))
    run_dir = tmp_path / "run"
    code = main(["run", str(path), "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err
    manifest = json.loads((run_dir / "manifest.json").read_text())
    metrics = manifest["stages"]["prune"]["metrics"]
    assert metrics["macs_after"] <= 0.8 * metrics["macs_before"] and metrics["importance"] == "magnitude"
    assert "the classifier: keeps its class count" in metrics["not_pruned"]
    said = " ".join(line for line in err.splitlines() if line.startswith("prune: not pruned:"))
    assert f"the classifier: keeps its class count: {CLASSIFIERS[name]}" in said
    if "vit" in name:
        assert metrics["heads_after"] < metrics["heads_before"]
        assert metrics["unwrapped_parameters"] == ["cls_token (dim 2)", "pos_embed (dim 2)"]
        assert "attention width: pruned by whole heads only" in said
        assert "pruned along the dimension torch-pruning inferred: cls_token (dim 2), pos_embed (dim 2)" in err
    model, _ = load_model(run_dir / "prune" / "model")
    assert sum(p.numel() for p in model.parameters()) == metrics["params_after"]
    assert (run_dir / "export").is_dir() and (run_dir / "bench" / "report" / "report.json").is_file()


@pytest.mark.slow
def test_bn_scale_on_convnext_stops_before_training_with_the_field_and_fix(tmp_path, write_pipeline, capsys):
    config = _pipeline("timm:convnext_atto", {}, tmp_path)
    del config["stages"][0]["importance"], config["stages"][0]["sparsity"]  # the defaults: bn_scale, 2 epochs
    code = main(["run", str(write_pipeline(config)), "--run-dir", str(tmp_path / "run")])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "stages.prune.importance: bn_scale" in err and "set importance: magnitude and sparsity.epochs: 0" in err
