"""One home each: the flat-index unravelling, the random-block sampler, the top-level loader, the zoo's name."""

from __future__ import annotations

import pytest
import torch

import circuitkit as ck
from circuitkit.detect.tokens import random_blocks
from circuitkit.ranking import unravel


@pytest.mark.parametrize("shape", [(3,), (2, 4), (2, 3, 2, 3, 3)])
def test_unravel_equals_torch_unravel_index(shape):
    for index in range(int(torch.tensor(shape).prod())):
        expected = tuple(int(i) for i in torch.unravel_index(torch.tensor(index), shape))
        assert unravel(index, shape) == expected


def test_random_blocks_are_distinct_rows_from_the_pool_when_it_is_large_enough():
    pool = torch.arange(10, 30)
    blocks = random_blocks(pool, 6, 8, torch.Generator().manual_seed(0))
    assert blocks.shape == (6, 8) and all(len(set(row.tolist())) == 8 for row in blocks)
    assert set(blocks.flatten().tolist()) <= set(pool.tolist())
    again = random_blocks(pool, 6, 8, torch.Generator().manual_seed(0))
    assert torch.equal(blocks, again)  # seeded


def test_random_blocks_draw_with_replacement_from_a_small_pool():
    blocks = random_blocks(torch.tensor([3, 5]), 4, 6, torch.Generator().manual_seed(0))
    assert blocks.shape == (4, 6) and set(blocks.flatten().tolist()) <= {3, 5}


def test_load_model_is_exported_at_the_top_level():
    from circuitkit.models import load_model

    assert ck.load_model is load_model and "load_model" in ck.__all__


def test_a_zoo_model_scans_under_the_name_the_cli_gives_it():
    from circuitkit import zoo

    tokens = ck.RepeatedTokens(block_len=4, batch=2)
    by_object = ck.scan(zoo.load(), tokens=tokens, ablate="none", circuit=False)
    by_name = ck.scan(None, tokens=tokens, ablate="none", circuit=False)
    assert by_object.model.name == by_name.model.name == zoo.DEFAULT == "induction-2l"
