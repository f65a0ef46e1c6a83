"""The CPU engine's prefix KV cache: longest-prefix lookup, LRU budget, and what it hands back."""

from __future__ import annotations

import pytest
import torch

from slime.engine.prefix_cache import PrefixCache, common_prefix


def _kv(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake per-layer KV whose values encode (layer, token): [1, 1, n, 2]."""
    out = []
    for layer in range(layers):
        k = torch.tensor([[float(layer), float(t)] for t in tokens]).view(1, 1, len(tokens), 2)
        out.append((k, -k))
    return out


@pytest.mark.parametrize(("a", "b", "n"), [
    ((), (1, 2), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2, 3, 4), 3), ((1, 2, 9, 4), (1, 2, 3, 4), 2),
    ((5,), (6,), 0), (tuple(range(1000)), tuple(range(700)) + (-1,), 700),
])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n == common_prefix(b, a)


def test_lookup_returns_the_longest_match_and_leaves_the_last_prompt_token_to_prefill():
    cache = PrefixCache(max_tokens=1000, min_tokens=2)
    cache.put([1, 2, 3], _kv([1, 2, 3]))
    cache.put([1, 2, 3, 4, 5, 6], _kv([1, 2, 3, 4, 5, 6]))
    cache.put([7, 8, 9], _kv([7, 8, 9]))

    hit = cache.get([1, 2, 3, 4, 5, 6, 10, 11])
    assert hit.n == 6
    assert hit.layers[1][0][0, 0, :, 1].tolist() == [1, 2, 3, 4, 5, 6] and hit.layers[1][0][0, 0, 0, 0] == 1
    assert torch.equal(hit.layers[0][1], -hit.layers[0][0])
    assert cache.get([1, 2, 3, 4, 5, 6]).n == 5  # the whole prompt is cached: its last token is prefilled
    assert cache.get([1, 2, 3, 4, 99]).n == 4  # a shared prefix of a longer entry counts too
    assert cache.get([7, 99]) is None  # a 1-token match is under min_tokens
    assert cache.get([42, 43, 44]) is None
    assert cache.stats["hits"] == 3 and cache.stats["misses"] == 2 and cache.stats["cached_tokens"] == 15


def test_stored_kv_is_a_copy_and_hits_never_alias_it():
    cache = PrefixCache(max_tokens=100, min_tokens=1)
    kv = _kv([1, 2, 3])
    cache.put([1, 2, 3], kv)
    kv[0][0].zero_()  # the engine frees / reuses its batch tensors
    hit = cache.get([1, 2, 3, 4])
    assert hit.layers[0][0][0, 0, :, 1].tolist() == [1, 2, 3]


def test_least_recently_used_entries_go_first_beyond_the_token_budget():
    cache = PrefixCache(max_tokens=10, min_tokens=1)
    cache.put([1, 1, 1, 1], _kv([1, 1, 1, 1]))
    cache.put([2, 2, 2, 2], _kv([2, 2, 2, 2]))
    assert cache.get([1, 1, 1, 1, 5]).n == 4  # touches entry 1: entry 2 is now the oldest
    cache.put([3, 3, 3, 3], _kv([3, 3, 3, 3]))  # 12 > 10 tokens: evict one

    assert cache.stored_tokens() == 8 and len(cache) == 2 and cache.stats["evictions"] == 1
    assert cache.get([2, 2, 2, 2, 5]) is None and cache.get([1, 1, 1, 1, 5]).n == 4
    cache.put(list(range(11)), _kv(list(range(11))))  # larger than the whole budget: not kept
    assert cache.stored_tokens() == 8
    cache.clear()
    assert len(cache) == 0 and cache.get([1, 1, 1, 1, 5]) is None


def test_a_zero_budget_turns_it_off_and_mismatched_kv_is_refused():
    off = PrefixCache(max_tokens=0)
    off.put([1, 2, 3], _kv([1, 2, 3]))
    assert not off.enabled and len(off) == 0 and off.get([1, 2, 3, 4]) is None
    with pytest.raises(ValueError, match="KV of 2 positions for 3 tokens"):
        PrefixCache(max_tokens=100, min_tokens=1).put([1, 2, 3], _kv([1, 2]))


def test_entries_serve_only_the_weights_that_computed_them_within_one_budget():
    """KV of the base, of an adapter, and of the same adapter's next load (a LoRA weight sync) never mix."""
    cache = PrefixCache(max_tokens=12, min_tokens=1)
    tokens = [1, 2, 3, 4]
    cache.put(tokens, _kv(tokens), ("policy", 1))
    assert cache.get(tokens + [5]) is None  # base
    assert cache.get(tokens + [5], ("policy", 2)) is None  # the adapter reloaded under the same name
    assert cache.get(tokens + [5], ("other", 1)) is None
    assert cache.get(tokens + [5], ("policy", 1)).n == 4
    cache.put(tokens, _kv([9, 9, 9, 9]))  # the same tokens under the base: a separate entry
    assert len(cache) == 2 and cache.get(tokens + [5]).layers[0][0][0, 0, :, 1].tolist() == [9, 9, 9, 9]
    assert cache.get(tokens + [5], ("policy", 1)).layers[0][0][0, 0, :, 1].tolist() == tokens

    cache.put([7, 7, 7, 7], _kv([7, 7, 7, 7]), ("policy", 2))
    cache.put([8, 8, 8, 8], _kv([8, 8, 8, 8]))  # 16 > 12 tokens: the least recent goes, whatever its weights
    assert cache.stored_tokens() == 12 and cache.stats["evictions"] == 1
    assert cache.get(tokens + [5]) is None  # the base entry: the adapter's was touched after it
    assert cache.get(tokens + [5], ("policy", 1)).n == 4
    # unloading the adapter frees all its loads' KV; the base's stays
    assert cache.drop_adapter("policy") == 8 and cache.stored_tokens() == 4 and len(cache) == 1
    assert cache.get([7, 7, 7, 7, 1], ("policy", 2)) is None and cache.get([8, 8, 8, 8, 1]).n == 4
