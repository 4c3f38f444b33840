"""The length-grouped sampler, sharded by accelerate's BatchSamplerShard."""

from __future__ import annotations

import random

import pytest
from accelerate.data_loader import BatchSamplerShard

from training.data.batching import LengthGroupedBatchSampler
from training.data.errors import DataError


def lengths(n: int = 1003, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(5, 128) for _ in range(n)]


def shards(sampler: LengthGroupedBatchSampler, world: int) -> list[list[list[int]]]:
    return [list(BatchSamplerShard(sampler, num_processes=world, process_index=rank)) for rank in range(world)]


@pytest.mark.parametrize("group_by_length", [True, False])
def test_two_ranks_get_disjoint_complete_equal_shards(group_by_length):
    sizes = lengths()
    sampler = LengthGroupedBatchSampler(sizes, batch_size=16, num_replicas=2, seed=3, group_by_length=group_by_length)
    rank0, rank1 = shards(sampler, 2)
    assert len(rank0) == len(rank1) == len(sampler) // 2 == 1003 // 32
    assert all(len(batch) == 16 for batch in rank0 + rank1)
    seen0 = [i for batch in rank0 for i in batch]
    seen1 = [i for batch in rank1 for i in batch]
    assert not set(seen0) & set(seen1)  # disjoint
    assert len(set(seen0 + seen1)) == len(seen0) + len(seen1) == 1003 // 32 * 32  # no repeats
    assert 1003 - len(seen0 + seen1) < 32  # only the remainder of one global batch is left out


def test_reshuffles_per_epoch_and_is_reproducible():
    sizes = lengths()
    sampler = LengthGroupedBatchSampler(sizes, batch_size=16, num_replicas=2, seed=3)
    epoch0 = shards(sampler, 2)
    sampler.set_epoch(1)
    epoch1 = shards(sampler, 2)
    assert epoch0 != epoch1
    # each rank sees a different subset of the data in the new epoch, not the same subset reordered
    assert {i for b in epoch0[0] for i in b} != {i for b in epoch1[0] for i in b}
    fresh = LengthGroupedBatchSampler(sizes, batch_size=16, num_replicas=2, seed=3)
    fresh.set_epoch(1)
    assert shards(fresh, 2) == epoch1  # same seed + epoch -> same batches on every rank and every restart


def padding(batches: list[list[int]], sizes: list[int]) -> int:
    return sum(max(sizes[i] for i in b) * len(b) - sum(sizes[i] for i in b) for b in batches)


def test_grouping_cuts_padding_and_balances_ranks():
    sizes = lengths(4000)
    grouped = LengthGroupedBatchSampler(sizes, batch_size=32, num_replicas=2, seed=0, group_by_length=True)
    plain = LengthGroupedBatchSampler(sizes, batch_size=32, num_replicas=2, seed=0, group_by_length=False)
    assert padding(list(grouped), sizes) < 0.25 * padding(list(plain), sizes)
    rank0, rank1 = shards(grouped, 2)
    for b0, b1 in zip(rank0, rank1):  # the two ranks of one step hold texts of similar length
        assert abs(max(sizes[i] for i in b0) - max(sizes[i] for i in b1)) <= 16


def test_longest_batch_comes_first():
    sizes = lengths(2000)
    sampler = LengthGroupedBatchSampler(sizes, batch_size=8, num_replicas=2, seed=5)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        longest = max(sizes[i] for b in batches for i in b)
        assert longest in {sizes[i] for b in batches[:2] for i in b}


def test_too_little_data_for_one_optimizer_step():
    with pytest.raises(DataError, match="fewer than one optimizer step"):
        LengthGroupedBatchSampler([10] * 20, batch_size=16, num_replicas=2)
    with pytest.raises(DataError, match="2 accumulation"):
        LengthGroupedBatchSampler([10] * 10, batch_size=8, num_replicas=1, accumulation=2, seed=0)


@pytest.mark.parametrize("group_by_length", [True, False])
def test_same_global_batches_for_every_layout_of_16(group_by_length):
    """1x16, 2x8, 1x8 with accumulation 2, 2x4 with accumulation 2: each optimizer step sees the same examples."""
    sizes = lengths(1000)

    def optimizer_steps(batch_size, world, accumulation):
        sampler = LengthGroupedBatchSampler(
            sizes, batch_size, world, seed=9, group_by_length=group_by_length, accumulation=accumulation
        )
        sampler.set_epoch(2)
        per_rank = shards(sampler, world)  # what each rank's prepared loader yields
        steps = []
        for step in range(len(per_rank[0]) // accumulation):
            micro = [per_rank[r][step * accumulation + a] for r in range(world) for a in range(accumulation)]
            steps.append(sorted(i for batch in micro for i in batch))
        return steps

    reference = optimizer_steps(16, 1, 1)
    assert len(reference) == 1000 // 16
    for layout in [(8, 2, 1), (8, 1, 2), (4, 2, 2)]:
        assert optimizer_steps(*layout) == reference, layout
