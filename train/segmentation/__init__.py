"""Semantic segmentation: masks in, mIoU out (the task module is train.tasks.segmentation)."""
