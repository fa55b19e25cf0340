"""Object detection: COCO-format data, the shapes generator, a small single-stage detector, its loss and decode."""
