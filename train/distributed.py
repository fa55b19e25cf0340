"""This process's place in a torchrun-launched group, and what the training loop needs from it.

The loop stays one code path: a single process is a group of one (``SINGLE``), whose
collectives are no-ops. Under torchrun the group comes from the environment torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK) and PyTorch's own process group and DistributedDataParallel do
the work; nothing here re-implements communication.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class ProcessGroupInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, artifacts and records; the others only compute."""
        return self.rank == 0

    @property
    def shard(self) -> tuple[int, int]:
        return self.rank, self.world

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over every rank (float64, so counts stay exact)."""
        if not self.active:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.cpu().tolist()


SINGLE = ProcessGroupInfo()


def _collective_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_backend(backend: str) -> str:
    """``auto``: NCCL where this process has a GPU, gloo on CPU (NCCL cannot run without one)."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def join_from_environment(backend: str, timeout_s: float = 1800.0) -> ProcessGroupInfo:
    """Join the process group torchrun set up for this process (rendezvous already done by torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = ProcessGroupInfo(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and not dist.is_initialized():
        chosen = resolve_backend(backend)
        if chosen == "nccl":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s))
    return info


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def to_sync_batchnorm(model: nn.Module) -> None:
    """BatchNorm layers that normalise over the global batch, in place.

    torch's converter keeps each layer's parameter and buffer objects, so anything holding
    them (the optimizer, the BN-L1 hook) is unaffected; the plain class is remembered for the way back.
    """
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and not isinstance(child, nn.SyncBatchNorm):
            synced = nn.SyncBatchNorm.convert_sync_batchnorm(child)
            synced.plain_class = type(child)
            setattr(model, name, synced)
        else:
            to_sync_batchnorm(child)


def from_sync_batchnorm(model: nn.Module) -> None:
    """Back to the plain BatchNorm classes (same parameter objects) for export, pruning and one process."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.SyncBatchNorm):
            plain = getattr(child, "plain_class", nn.BatchNorm2d)(
                child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            if child.affine:
                plain.weight, plain.bias = child.weight, child.bias
            plain.running_mean, plain.running_var = child.running_mean, child.running_var
            plain.num_batches_tracked = child.num_batches_tracked
            plain.train(child.training)
            setattr(model, name, plain)
        else:
            from_sync_batchnorm(child)
