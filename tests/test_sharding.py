"""Sharded batches and SyncBatchNorm: what makes N processes compute what one process computes."""
from __future__ import annotations

import torch
from torch import nn

from train.data import Augment, BatchStream, DataSpec, load_data
from train.distributed import from_sync_batchnorm, to_sync_batchnorm


def _stream(data, batch, shard, shuffle=True, augment=True):
    return BatchStream(data.train, data, batch, shuffle=shuffle, drop_last=shuffle, seed=3,
                       augment=Augment(pad=2, hflip=True) if augment else None, shard=shard)


def test_ranks_together_draw_exactly_the_single_process_global_batches_and_augmentation():
    data = load_data(DataSpec(name="digits"))
    single = _stream(data, 64, (0, 1))
    ranks = [_stream(data, 32, (r, 2)) for r in range(2)]
    assert len(single) == len(ranks[0]) == len(ranks[1])
    for epoch in (0, 1):
        for (x, y), (x0, y0), (x1, y1) in zip(single.epoch(epoch), ranks[0].epoch(epoch), ranks[1].epoch(epoch)):
            assert torch.equal(torch.cat([x0, x1]), x)  # same images, same shifts and flips, same order
            assert torch.equal(torch.cat([y0, y1]), y)


def test_a_resumed_rank_sees_the_batches_an_uninterrupted_one_would():
    data = load_data(DataSpec(name="digits"))
    stream = _stream(data, 16, (1, 2))
    full = list(stream.epoch(2))
    resumed = list(stream.epoch(2, start=5))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(full[5:], resumed))


def test_evaluation_shards_cover_the_split_once():
    data = load_data(DataSpec(name="digits"))
    seen = []
    for rank in range(3):
        stream = BatchStream(data.val, data, 50, shuffle=False, drop_last=False, shard=(rank, 3))
        seen += [y for _, y in stream.epoch(0)]
    assert sum(len(y) for y in seen) == len(data.val)
    assert sorted(torch.cat(seen).tolist()) == sorted(data.val.labels.tolist())


def test_sync_batchnorm_round_trip_keeps_parameters_buffers_and_classes():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Flatten(), nn.Linear(4, 2),
                                                                             nn.BatchNorm1d(2)))
    params = {id(p) for p in model.parameters()}
    mean = model[1].running_mean
    to_sync_batchnorm(model)
    assert isinstance(model[1], nn.SyncBatchNorm) and isinstance(model[2][2], nn.SyncBatchNorm)
    assert {id(p) for p in model.parameters()} == params  # the optimizer and the BN-L1 hook keep working
    from_sync_batchnorm(model)
    assert type(model[1]) is nn.BatchNorm2d and type(model[2][2]) is nn.BatchNorm1d
    assert {id(p) for p in model.parameters()} == params and model[1].running_mean is mean
