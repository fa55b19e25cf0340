"""torch → ONNX export, ONNX checks and parity, ONNX → TensorRT engines.

Takes plain objects (an ``nn.Module``, paths) and returns plain results; it never imports
``compress``. The export stage adapter in ``compress`` calls into it.
"""
