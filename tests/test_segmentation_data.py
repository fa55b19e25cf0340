"""Segmentation data: a mask folder, the VOC layout and COCO polygons load into the model's frame with every mask
exact (nearest for masks, the letterbox border ignored), the generated scenes read back like a user's folder, bad
masks fail naming the file and the fix, and the pipeline file ties task, data and red-line metric together."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from compress.config import PipelineConfig
from train.data import DataSpec
from train.datasets import DataError
from train.detection.coco_folder import PAD_VALUE
from train.segmentation.data import load_segmentation
from train.segmentation.folders import MaskReading, load_coco_masks, load_mask_folder, load_voc


def _scene(h: int, w: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A grey image with a block of class 1 and a block of class 2 (k shifts them), and its exact mask."""
    img = np.full((h, w, 3), 40, dtype=np.uint8)
    mask = np.zeros((h, w), dtype=np.uint8)
    img[4:20, 4 + k:20 + k] = (220, 30, 30)
    mask[4:20, 4 + k:20 + k] = 1
    img[h - 20:h - 4, w - 24:w - 8] = (30, 220, 30)
    mask[h - 20:h - 4, w - 24:w - 8] = 2
    return img, mask


def mask_folder(root, n: int = 12, h: int = 48, w: int = 64):
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        img, mask = _scene(h, w, i % 5)
        Image.fromarray(img).save(root / "images" / f"im{i}.png")
        Image.fromarray(mask).save(root / "masks" / f"im{i}.png")
    (root / "classes.txt").write_text("ground\nred\ngreen\n")
    return root


def test_a_mask_folder_is_letterboxed_with_the_border_ignored_and_every_id_kept(tmp_path):
    raw = load_mask_folder(mask_folder(tmp_path / "m"), MaskReading(size=32, ignore_index=255))
    assert raw.images.shape == (12, 3, 32, 32) and raw.masks.shape == (12, 32, 32)
    assert raw.class_names == ["ground", "red", "green"]
    # 64×48 → 32×24, centred: 4 rows above and 4 below are border: grey 114 in the image, ignored in the mask
    assert (raw.images[:, :, :4] == PAD_VALUE).all() and (raw.masks[:, :4] == 255).all()
    assert (raw.masks[:, -4:] == 255).all()
    inside = raw.masks[:, 4:-4]
    assert set(np.unique(inside.numpy()).tolist()) == {0, 1, 2}  # nearest: no blended id between classes
    # the red block lands where the image is red (the mask followed the image)
    red = raw.masks[0] == 1
    assert (raw.images[0, 0][red].float().mean() > 180) and (raw.images[0, 1][red].float().mean() < 80)


def test_stretch_moves_the_mask_with_the_image(tmp_path):
    raw = load_mask_folder(mask_folder(tmp_path / "m", n=2), MaskReading(size=32, mode="stretch"))
    assert not (raw.masks == 255).any()
    green = raw.masks[1] == 2
    assert green.any() and raw.images[1, 1][green].float().mean() > 180


def test_bad_masks_are_refused_naming_the_file(tmp_path):
    root = mask_folder(tmp_path / "m", n=3)
    Image.fromarray(np.zeros((10, 10), dtype=np.uint8)).save(root / "masks" / "im1.png")
    with pytest.raises(DataError, match=r"im1\.png: the mask is 10×10 but its image im1\.png is 64×48"):
        load_mask_folder(root, MaskReading(size=32))
    root = mask_folder(tmp_path / "k", n=3)
    bad = np.zeros((48, 64), dtype=np.uint8)
    bad[0, 0] = 7
    Image.fromarray(bad).save(root / "masks" / "im2.png")
    with pytest.raises(DataError, match=r"im2\.png: class id 7 is out of range: there are 3 classes"):
        load_mask_folder(root, MaskReading(size=32))
    root = mask_folder(tmp_path / "n", n=3)
    (root / "masks" / "im0.png").unlink()
    with pytest.raises(DataError, match=r"im0\.png: no mask .*masks/im0\.png"):
        load_mask_folder(root, MaskReading(size=32))


def test_rgb_masks_read_through_the_palette_and_an_unknown_colour_is_named(tmp_path):
    root = mask_folder(tmp_path / "m", n=2)
    palette = [[0, 0, 0], [128, 0, 0], [0, 128, 0]]
    for i in range(2):
        mask = np.asarray(Image.open(root / "masks" / f"im{i}.png"))
        Image.fromarray(np.asarray(palette, dtype=np.uint8)[mask]).save(root / "masks" / f"im{i}.png")
    with pytest.raises(DataError, match="an RGB mask; give data.palette"):
        load_mask_folder(root, MaskReading(size=32))
    raw = load_mask_folder(root, MaskReading(size=32, mode="stretch", palette=palette))
    assert set(np.unique(raw.masks.numpy()).tolist()) == {0, 1, 2}
    with pytest.raises(DataError, match=r"colour \(0, 128, 0\), which is not in data.palette"):
        load_mask_folder(root, MaskReading(size=32, palette=palette[:2]))


def voc_folder(root, n: int = 10):
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / sub).mkdir(parents=True)
    ids = [f"2007_{i:06d}" for i in range(n)]
    for i, image_id in enumerate(ids):
        img, mask = _scene(48, 64, i % 5)
        mask[0] = 255  # VOC's void border
        Image.fromarray(img).save(root / "JPEGImages" / f"{image_id}.jpg", quality=95)
        indexed = Image.new("P", (64, 48))  # VOC's masks are palette PNGs: the index is the class
        indexed.putdata(mask.reshape(-1).tolist())
        indexed.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])
        indexed.save(root / "SegmentationClass" / f"{image_id}.png")
    (root / "ImageSets/Segmentation/train.txt").write_text("\n".join(ids[:7]) + "\n")
    (root / "ImageSets/Segmentation/val.txt").write_text("\n".join(ids[7:]) + "\n")
    (root / "ImageSets/Segmentation/trainval.txt").write_text("\n".join(ids) + "\n")
    return root, ids


def test_voc_lists_are_the_splits_and_its_void_border_is_ignored(tmp_path):
    root, ids = voc_folder(tmp_path / "VOC2012")
    raw = load_voc(root, MaskReading(size=32, mode="stretch"))
    assert raw.class_names[0] == "background" and len(raw.class_names) == 21
    assert raw.lists == {"train": list(range(7)), "val": [7, 8, 9]}
    assert (raw.masks[:, 0] == 255).all()
    bundle = load_segmentation(DataSpec(name="voc", path=str(root), image_size=32, resize="stretch", val_fraction=0.3))
    assert bundle.split_indices["test"].tolist() == [7, 8, 9]  # the val list is what the field reports on
    assert sorted(bundle.split_indices["train"].tolist() + bundle.split_indices["val"].tolist()) == list(range(7))
    assert bundle.task == "segmentation" and bundle.preprocessing()["ignore_index"] == 255


def test_coco_polygons_are_painted_into_class_masks_with_crowds_ignored(tmp_path):
    root = tmp_path / "coco"
    (root / "images").mkdir(parents=True)
    Image.fromarray(np.full((40, 60, 3), 90, dtype=np.uint8)).save(root / "images" / "a.png")
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 60, "height": 40}],
            "categories": [{"id": 5, "name": "road"}, {"id": 3, "name": "car"}],
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 5, "area": 1200, "iscrowd": 0,
                 "segmentation": [[0, 20, 60, 20, 60, 40, 0, 40]]},  # the lower half: road
                {"id": 2, "image_id": 1, "category_id": 3, "area": 100, "iscrowd": 0,
                 "segmentation": [[10, 25, 20, 25, 20, 35, 10, 35]]},  # a car on the road (smaller: painted last)
                {"id": 3, "image_id": 1, "category_id": 3, "area": 50, "iscrowd": 1,
                 "segmentation": [[40, 2, 50, 2, 50, 8, 40, 8]]}]}
    (root / "instances.json").write_text(json.dumps(coco))
    raw = load_coco_masks(root, MaskReading(size=60, mode="stretch"))  # rows × 1.5, columns as they are
    assert raw.class_names == ["background", "car", "road"]  # categories by id after background: 3 car, 5 road
    mask = raw.masks[0].numpy()
    assert mask[8, 5] == 0 and mask[45, 50] == 2 and mask[45, 15] == 1 and mask[8, 45] == 255


def test_the_generated_scenes_read_back_like_a_user_folder_and_are_split_once(tmp_path):
    spec = DataSpec(name="scenes", synthetic_samples=60, image_size=48, cache_dir=str(tmp_path))
    first, again = load_segmentation(spec), load_segmentation(spec)
    assert first.digest() == again.digest()
    assert first.class_names == ["background", "rectangle", "ellipse", "triangle"]
    assert first.train.labels.shape[1:] == (48, 48) and first.train.labels.dtype.is_floating_point is False
    sizes = {s: len(getattr(first, s)) for s in ("train", "val", "test")}
    assert sum(sizes.values()) == 60 and min(sizes.values()) > 0
    # every kind is present, painted exactly: scored pixels of each class exist in the train split
    assert set(np.unique(first.train.labels.numpy()).tolist()) == {0, 1, 2, 3}


def test_the_pipeline_file_ties_segmentation_to_mask_data_and_miou():
    base = {"name": "s", "model": {"name": "tiny_segmenter"}, "stages": [{"name": "t", "kind": "train"}]}
    PipelineConfig.model_validate({**base, "task": "segmentation", "data": {"name": "scenes"},
                                   "red_line": {"metric": "miou"}})
    with pytest.raises(ValueError, match="data.name digits holds no segmentation labels"):
        PipelineConfig.model_validate({**base, "task": "segmentation", "data": {"name": "digits"},
                                       "red_line": {"metric": "miou"}})
    with pytest.raises(ValueError, match="red_line.metric top1 does not judge segmentation: use miou or pixel_acc"):
        PipelineConfig.model_validate({**base, "task": "segmentation", "data": {"name": "scenes"}})
    with pytest.raises(ValueError, match="add task: segmentation"):
        PipelineConfig.model_validate({**base, "data": {"name": "scenes"}})


def test_object_masks_saved_as_0_and_255_are_refused_not_read_as_all_background(tmp_path):
    root = mask_folder(tmp_path / "m", n=3)
    (root / "classes.txt").write_text("background\nobject\n")
    for i in range(3):
        mask = np.asarray(Image.open(root / "masks" / f"im{i}.png"))
        Image.fromarray(np.where(mask > 0, 255, 0).astype(np.uint8)).save(root / "masks" / f"im{i}.png")
    # a quarter of the pixels would be ignored and class 1 would never be scored
    blocks = np.zeros((48, 64), dtype=np.uint8)
    blocks[:24] = 255
    Image.fromarray(blocks).save(root / "masks" / "im0.png")
    with pytest.raises(DataError, match=r"are ignore_index 255 and no mask holds object: object masks saved as 0/255"):
        load_mask_folder(root, MaskReading(size=32))


def test_voc_lists_that_share_an_image_are_refused_and_the_digest_covers_what_masks_mean(tmp_path):
    root, ids = voc_folder(tmp_path / "VOC2012")
    (root / "ImageSets/Segmentation/train.txt").write_text("\n".join(ids[:8]) + "\n")  # ids[7] also in val
    with pytest.raises(DataError, match="1 images are in the train list and in a held-out list"):
        load_segmentation(DataSpec(name="voc", path=str(root), image_size=32, resize="stretch"))
    root, _ = voc_folder(tmp_path / "again")
    spec = DataSpec(name="voc", path=str(root), image_size=32, resize="stretch")
    renamed = DataSpec(**{**spec.__dict__, "class_names": [f"c{i}" for i in range(21)]})
    assert load_segmentation(spec).digest() != load_segmentation(renamed).digest()
