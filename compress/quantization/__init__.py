"""INT8: post-training quantization with onnxruntime, the ladder PTQ → partial fallback → QAT,
torchao PT2E QAT, Q/DQ lint and rewrites. Takes plain arrays, paths and settings; never imports
the pipeline or stage layers.
"""
