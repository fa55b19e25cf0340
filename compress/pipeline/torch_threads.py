"""The pipeline's `threads:` applied while its stages run in this process.

Float sums are split by thread, so the same stage trained on 1 and on 2 threads makes different
bits: a configuration that must rebuild digest for digest (the one a search chose) pins the count.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the block, the caller's restored after."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
