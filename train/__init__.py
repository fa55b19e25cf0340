"""The training engine: data sets, model registry, model artifacts and the training loop.

This package knows nothing about pipelines or manifests; it takes plain objects (an
``nn.Module``, tensors, small dataclasses) and returns plain results, so every stage
that needs to train something (train, prune's finetune, distill, QAT) reuses one loop.
"""
