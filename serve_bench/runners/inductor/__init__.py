"""torch.compile (Inductor) on the CPU as a runtime, and PyTorch's own x86 INT8 file it runs."""
from serve_bench.runners.inductor.runner import InductorRunner, native_bf16
from serve_bench.runners.inductor.settings import InductorSettings

__all__ = ["InductorRunner", "InductorSettings", "native_bf16"]
