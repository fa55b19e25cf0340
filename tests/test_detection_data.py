"""Detection data: a COCO-format folder written by hand loads into the model's frame (letterbox recorded), the
generator writes the same format, bad files fail naming the file, the field and the fix, and the pipeline file
ties task, data and red-line metric together."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from compress.config import PipelineConfig
from train.data import DataSpec
from train.datasets import DataError
from train.detection.coco_folder import PAD_VALUE, load_coco_folder
from train.detection.data import load_detection
from train.detection.shapes import write_shapes


def hand_written_folder(root, n: int = 40, seed: int = 1):
    """COCO by hand: 96×64 (landscape) images, category ids 7 and 9, one crowd box, one image without objects."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 9, "name": "disc"}, {"id": 7, "name": "square"}]}
    for i in range(n):
        img = np.full((64, 96, 3), 30, dtype=np.uint8)
        objects = [] if i == 0 else [(int(rng.integers(0, 60)), int(rng.integers(0, 30)), 7 + 2 * int(rng.integers(0, 2)))
                                     for _ in range(2)]
        for x, y, cat in objects:
            if cat == 7:
                img[y:y + 24, x:x + 24] = (230, 40, 40)
            else:
                yy, xx = np.mgrid[0:24, 0:24]
                disc = (yy - 11.5) ** 2 + (xx - 11.5) ** 2 <= 144
                img[y:y + 24, x:x + 24][disc] = (40, 230, 40)
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": 100 + i, "category_id": cat,
                                        "bbox": [x, y, 24, 24], "area": 576, "iscrowd": int(i == 1 and x == objects[0][0])})
        Image.fromarray(img).save(root / "images" / f"img{i}.jpg", quality=95)
        coco["images"].append({"id": 100 + i, "file_name": f"img{i}.jpg", "width": 96, "height": 64})
    (root / "instances_val.json").write_text(json.dumps(coco))
    return root


def test_a_hand_written_folder_is_letterboxed_and_its_boxes_follow(tmp_path):
    raw = load_coco_folder(hand_written_folder(tmp_path / "coco"), size=64)
    assert raw.images.shape == (40, 3, 64, 64)
    assert raw.class_names == ["square", "disc"] and raw.category_ids == [7, 9]  # sorted by id: 7 → class 0
    # 96×64 → 64×43 (scale 2/3), centred: 10 rows of grey above and 11 below
    assert raw.frames[0]["pad_y"] == 10 and raw.frames[0]["new_height"] == 43
    assert (raw.images[0, :, :10] == PAD_VALUE).all() and (raw.images[0, :, -11:] == PAD_VALUE).all()
    assert len(raw.targets[0]["boxes"]) == 0
    coco = json.loads((tmp_path / "coco" / "instances_val.json").read_text())
    first = next(a for a in coco["annotations"] if a["image_id"] == 102)
    x, y, w, h = first["bbox"]
    expected = [x * 64 / 96, y * 43 / 64 + 10, (x + w) * 64 / 96, (y + h) * 43 / 64 + 10]
    assert torch.allclose(raw.targets[2]["boxes"][0], torch.tensor(expected), atol=1e-4)
    # the pixels under the box are the object's colour after the resize
    x1, y1, x2, y2 = (int(round(v)) for v in expected)
    inside = raw.images[2, :, y1 + 3:y2 - 3, x1 + 3:x2 - 3].float().mean(dim=(1, 2))
    assert (inside - torch.tensor([230.0, 40, 40] if first["category_id"] == 7 else [40.0, 230, 40])).abs().max() < 40
    assert raw.targets[1]["crowd"].any()


def test_stretch_scales_each_axis(tmp_path):
    raw = load_coco_folder(hand_written_folder(tmp_path / "coco", n=3), size=64, mode="stretch")
    assert raw.frames[1]["scale_x"] == pytest.approx(64 / 96) and raw.frames[1]["scale_y"] == 1.0


@pytest.mark.parametrize("breakage, match", [
    (lambda c: c["annotations"][0].update(category_id=3), r"category_id 3 is not in categories"),
    (lambda c: c["annotations"][0].update(image_id=999), r"image_id 999 names no image"),
    (lambda c: c["annotations"][0].update(bbox=[1, 2, 3]), r"bbox is \[1, 2, 3\]; it must be \[x, y, width, height\]"),
    (lambda c: c["images"][0].update(width=50), r"img0.jpg: is 96×64 but the JSON says 50×64"),
    (lambda c: c.pop("categories"), r"needs the lists images, annotations and categories; missing or not a list: "
                                    r"categories"),
])
def test_a_broken_folder_names_the_file_the_field_and_the_fix(tmp_path, breakage, match):
    folder = hand_written_folder(tmp_path / "coco", n=4)
    path = folder / "instances_val.json"
    coco = json.loads(path.read_text())
    breakage(coco)
    path.write_text(json.dumps(coco))
    with pytest.raises(DataError, match=match):
        load_coco_folder(folder, size=64)


def test_two_json_files_ask_which(tmp_path):
    folder = hand_written_folder(tmp_path / "coco", n=2)
    (folder / "other.json").write_text("{}")
    with pytest.raises(DataError, match="2 JSON files .* name the one to use with data.annotations"):
        load_coco_folder(folder)


def test_the_generator_writes_coco_that_the_same_loader_reads_and_splits_are_seeded(tmp_path):
    write_shapes(tmp_path / "shapes", images=60, size=64, seed=3)
    spec = DataSpec(name="coco", path=str(tmp_path / "shapes"), calib_size=16)
    a, b = load_detection(spec), load_detection(spec)
    assert a.digest() == b.digest() and len(a.test) == 12 and a.class_names == ["rectangle", "ellipse", "triangle"]
    assert sum(len(t["classes"]) for t in a.targets) >= 60
    assert a.preprocessing()["resize"] == "letterbox"
    # the digest covers the boxes: moving one box changes it
    b.targets[0]["boxes"][0, 0] += 1
    b.__dict__.pop("_digest")
    assert b.digest() != a.digest()


@pytest.mark.parametrize("change, match", [
    ({"red_line": {"metric": "top1"}}, "red_line.metric top1 does not judge detection: use map or map50"),
    ({"data": {"name": "digits"}}, "data.name digits holds no detection labels .*use one of coco, shapes"),
    ({"task": "classification"}, "data.name shapes holds no classification labels .*or add task: detection"),
])
def test_task_data_and_metric_must_agree(change, match):
    base = {"name": "d", "task": "detection", "data": {"name": "shapes"}, "model": {"name": "tiny_fcos"},
            "red_line": {"metric": "map"}, "stages": [{"name": "t", "kind": "train"}]}
    with pytest.raises(ValueError, match=match):
        PipelineConfig.model_validate({**base, **change})


def test_a_detection_pipeline_is_refused_by_search_with_the_reason(tmp_path):
    import yaml

    from compress.errors import ConfigError
    from compress.search.settings import load_search

    (tmp_path / "detection.yaml").write_text(yaml.safe_dump(
        {"name": "d", "task": "detection", "data": {"name": "shapes"}, "model": {"name": "tiny_fcos"},
         "red_line": {"metric": "map"}, "stages": [{"name": "train", "kind": "train"}]}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(
        {"name": "s", "pipeline": "detection.yaml", "space": {"stages.train.epochs": [1, 2]}}))
    with pytest.raises(ConfigError, match="task: detection cannot be searched yet"):
        load_search(tmp_path / "s.yaml")
