"""Prefix KV cache of the CPU engine: a multi-turn rollout's next turn re-uses the previous turn's KV.

A multi-turn rollout sends, every turn, the whole conversation so far: the previous request's prompt
and output plus the new observation tokens. Without a cache the engine prefills all of it again, and
on CPU that prefill costs as much as the decoding (a 1,000-token context per turn). SGLang keeps a
radix tree of KV pages for this; the CPU engine keeps something smaller with the same effect: the
KV of each finished request (its prompt and output tokens, as stored rows of every layer), looked up
by longest common prefix, evicted least-recently-used beyond a token budget.

Entries hold keys already rotated (RoPE) at positions 0..n-1, so a prefix of an entry is valid for
any request whose first tokens equal it *and that runs with the same weights*. So every entry is also
keyed by the weights that computed it (`Weights`): the base model (None) or a LoRA adapter as
(name, load generation). A lookup matches only its own weights: an adapter reloaded under the same name
(every LoRA weight sync: unload, then load) gets a new generation and never sees the old one's KV, and
`drop_adapter` frees that KV at unload. Base weights change -> `clear()`: a KV from old weights is wrong.
One token budget covers all weights. Only the engine's batching thread uses a cache (no lock).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, kv_heads, n, head_dim]
# Which weights computed an entry's KV: None for the base model, (adapter name, load generation) for a LoRA adapter.
Weights = tuple[str, int] | None


@dataclass
class Hit:
    """`n` leading tokens of a request whose KV is known: `layers` (views, never written in place)."""

    n: int
    layers: Layers


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix of two token tuples (binary search over C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] always; the answer is never above hi
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """Finished sequences' KV by token prefix, LRU-evicted beyond `max_tokens` stored tokens (0: off)."""

    def __init__(self, max_tokens: int, min_tokens: int = 16) -> None:
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens  # shorter matches are not worth a separate prefill
        self._entries: OrderedDict[tuple[Weights, tuple[int, ...]], Layers] = OrderedDict()
        self._stored = 0
        self.stats = {"hits": 0, "misses": 0, "cached_tokens": 0, "evictions": 0}

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def stored_tokens(self) -> int:
        return self._stored

    def put(self, tokens: list[int], layers: Layers, weights: Weights = None) -> None:
        """Remember the KV of `tokens` computed with `weights` (layers [1, h, len(tokens), d], copied so the
        batch can be freed)."""
        if not self.enabled or len(tokens) < self.min_tokens or len(tokens) > self.max_tokens:
            return
        key = (weights, tuple(tokens))
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if any(k.shape[2] != len(tokens) or v.shape[2] != len(tokens) for k, v in layers):
            raise ValueError(f"prefix cache: KV of {layers[0][0].shape[2]} positions for {len(tokens)} tokens")
        self._entries[key] = [(k.clone(), v.clone()) for k, v in layers]
        self._stored += len(tokens)
        while self._stored > self.max_tokens:
            (_, old), _ = self._entries.popitem(last=False)
            self._stored -= len(old)
            self.stats["evictions"] += 1

    def get(self, prompt: list[int], weights: Weights = None) -> Hit | None:
        """The longest prefix of `prompt` cached under the same `weights`, leaving at least its last token
        to prefill (for logits)."""
        if not self.enabled:
            return None
        best_key, best = None, 0
        limit, wanted = len(prompt) - 1, tuple(prompt)
        for key in reversed(self._entries):  # most recent first: the previous turn is usually the match
            owner, tokens = key
            if owner != weights:  # KV of other weights is wrong for this request
                continue
            n = min(common_prefix(tokens, wanted), limit) if len(tokens) > best else 0
            if n > best:
                best_key, best = key, n
                if n == limit:
                    break
        if best_key is None or best < self.min_tokens:
            self.stats["misses"] += 1
            return None
        self._entries.move_to_end(best_key)
        self.stats["hits"] += 1
        self.stats["cached_tokens"] += best
        return Hit(best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key]])

    def drop_adapter(self, name: str) -> int:
        """Forget every entry computed with adapter `name` (any generation); how many tokens that freed.
        Unloading it calls this: those entries can never hit again, so they should not hold the budget."""
        stale = [key for key in self._entries if key[0] is not None and key[0][0] == name]
        freed = sum(len(tokens) for _, tokens in stale)
        for key in stale:
            del self._entries[key]
        self._stored -= freed
        return freed

    def clear(self) -> None:
        self._entries.clear()
        self._stored = 0
