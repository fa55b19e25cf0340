"""Peak memory of a training run, so the saving from mixed precision is visible.

On CUDA the caching allocator's own peak counter is exact. On CPU torch keeps no such
counter, so the process's resident-set high-water mark is used: it is reset when
training starts (Linux's /proc/self/clear_refs) and the resident size at that moment is
subtracted, leaving the memory training itself added (activations, gradients,
optimizer state) rather than what imports and data loading held before.
"""
from __future__ import annotations

import torch


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._baseline_kb = 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        elif _reset_rss_peak():
            self._baseline_kb = _status_kb("VmRSS") or 0

    def peak(self) -> tuple[int, str]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), "cuda_max_allocated"
        hwm = _status_kb("VmHWM")
        if hwm is None:
            return 0, "unavailable"
        if self._baseline_kb:
            return max(0, hwm - self._baseline_kb) * 1024, "process_rss_growth"
        return hwm * 1024, "process_peak_rss"
