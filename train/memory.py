"""Peak memory of a training run, so the saving from mixed precision is visible.

On CUDA the caching allocator's own peak counter is exact. On CPU torch keeps no such
counter, so the process's resident-set high-water mark (VmHWM) is read instead; it
includes everything the process ever held, which is why the benchmark measures each
precision in a fresh process.
"""
from __future__ import annotations

import resource

import torch


def _rss_peak_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak(self) -> tuple[int, str]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        return _rss_peak_bytes(), "process_peak_rss"
