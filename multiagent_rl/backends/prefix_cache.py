"""The keys and values of conversations so far, kept so that a turn's prompt is not encoded again.

A multi-turn episode's next prompt is its previous prompt, the reply sampled for it and the new observation, token
for token (traces extend verbatim). [`PrefixCache`][multiagent_rl.backends.prefix_cache.PrefixCache] keeps, per
conversation, the keys and values of everything the model has read or written so far; the next request finds the
longest stored prefix of its prompt and the model encodes only the rest. An entry is found by exact token equality,
so a prompt that does not extend a stored one (another conversation, a re-rendered chat) simply misses.

Entries are valid only for the weights that computed them: the cache remembers the models' parameter versions (the
counter PyTorch bumps on every in-place write, which an optimizer step or ``load_state_dict`` makes) and empties
itself when they change, whoever changed them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, one sequence's keys and values, each (kv_heads, length, head_dim)."""


def weights_version(model: Any) -> int:
    """A number that changes whenever any parameter of ``model`` is written in place (optimizer steps, weight loads)."""
    return sum(p._version for p in model.parameters())


class PrefixCache:
    """Per conversation, the keys and values of its tokens so far, within ``budget_bytes`` (least recently used
    entries leave first).

    ```pycon
    >>> cache = PrefixCache(budget_bytes=1 << 20)
    >>> kv = [(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))]
    >>> cache.store((1, 2, 3), kv)
    >>> cache.lookup([1, 2, 3, 9, 9])[0]       # the stored prefix's length
    3
    >>> cache.lookup([1, 2, 3])[0]             # at least one token is always left to encode
    0

    ```
    """

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[tuple[int, ...], tuple[KV, int]] = OrderedDict()
        self.lengths: Counter[int] = Counter()
        self.bytes = 0
        self.version: Any = None
        self.reused_tokens = 0
        """Prompt tokens read from the cache instead of encoded (since construction)."""
        self.encoded_tokens = 0
        """Prompt tokens encoded (since construction)."""

    def __len__(self) -> int:
        return len(self.entries)

    def validate(self, version: Any) -> None:
        """Empty the cache if the weights' ``version`` is not the one its entries were computed with."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        self.entries.clear()
        self.lengths.clear()
        self.bytes = 0

    def lookup(self, ids: list[int]) -> tuple[int, KV | None]:
        """The longest stored prefix of ``ids`` that leaves at least one token to encode: ``(length, kv)``, or
        ``(0, None)``."""
        key = tuple(ids)
        for n in sorted(self.lengths, reverse=True):
            if n < len(key) and key[:n] in self.entries:
                self.entries.move_to_end(key[:n])
                return n, self.entries[key[:n]][0]
        return 0, None

    def store(self, ids: tuple[int, ...], kv: KV, replaces: tuple[int, ...] | None = None) -> None:
        """Keep ``kv`` for the tokens ``ids``; ``replaces``: the entry this conversation continued from, which it
        supersedes."""
        if replaces is not None and replaces != ids:
            self._drop(replaces)
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if not ids or size > self.budget_bytes:
            return
        self._drop(ids)
        while self.entries and self.bytes + size > self.budget_bytes:
            self._drop(next(iter(self.entries)))
        self.entries[ids] = (kv, size)
        self.lengths[len(ids)] += 1
        self.bytes += size

    def _drop(self, ids: tuple[int, ...]) -> None:
        entry = self.entries.pop(ids, None)
        if entry is not None:
            self.bytes -= entry[1]
            self.lengths[len(ids)] -= 1
            if not self.lengths[len(ids)]:
                del self.lengths[len(ids)]


def clear_prefix_caches(backends) -> None:
    """Empty the prefix cache of every backend that has one."""
    for backend in backends:
        if (cache := getattr(backend, "prefix_cache", None)) is not None:
            cache.clear()


def cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the (B, kv_heads, length, head_dim) keys and values of a transformers ``DynamicCache``."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes each new token's keys and values into spare room, grown by half again when full,
    instead of concatenating the whole cache every token (which copied it all, and was a third of a long decode)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._length, self._keys, self._values = 0, None, None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            capacity = end + max(128, end // 2)
            keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
            values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
            if start:
                keys[..., :start, :] = self._keys[..., :start, :]
                values[..., :start, :] = self._values[..., :start, :]
            self._keys, self._values = keys, values
        self._keys[..., start:end, :] = key_states
        self._values[..., start:end, :] = value_states
        self._length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized and self._keys is not None:
            self._keys, self._values = self._keys[indices], self._values[indices]
            self.keys, self.values = self._keys[..., :self._length, :], self._values[..., :self._length, :]

    def drop_leading(self, columns: int) -> None:
        """Forget the first ``columns`` positions (padding no row reads any more)."""
        self._keys, self._values = self._keys[..., columns:, :], self._values[..., columns:, :]
        self._length -= columns
        self.keys, self.values = self._keys[..., :self._length, :], self._values[..., :self._length, :]


def _cache_of(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    for i, (keys, values) in enumerate(layers):
        cache.update(keys, values, i)
    return cache


def batched_cache(entries: list[KV | None], width: int, rows: int, device):
    """A ``DynamicCache`` of ``rows`` rows holding each entry's keys and values right-aligned in ``width`` columns
    (zeros where a row has fewer, which the attention mask hides); empty when ``width`` is 0."""
    if width == 0:
        return _cache_of([])
    first = next(kv for kv in entries if kv is not None)
    layers = []
    for layer, (k0, v0) in enumerate(first):
        keys = k0.new_zeros((rows, k0.shape[0], width, k0.shape[2]), device=device)
        values = v0.new_zeros((rows, v0.shape[0], width, v0.shape[2]), device=device)
        for i, kv in enumerate(entries):
            if kv is not None:
                n = kv[layer][0].shape[1]
                keys[i, :, width - n:] = kv[layer][0]
                values[i, :, width - n:] = kv[layer][1]
        layers.append((keys, values))
    return _cache_of(layers)


def merge_caches(cache_a, mask_a: torch.Tensor, cache_b, mask_b: torch.Tensor):
    """Two batches' caches and attention masks stacked (a's rows first), the narrower padded on the left (masked)."""
    width = max(mask_a.shape[1], mask_b.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if not missing:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim)

    layers_b = cache_layers(cache_b)
    layers = [(torch.cat([pad(ka, 2), pad(kb, 2)]), torch.cat([pad(va, 2), pad(vb, 2)]))
              for (ka, va), (kb, vb) in zip(cache_layers(cache_a), layers_b)]
    return _cache_of(layers), torch.cat([pad(mask_a, 1), pad(mask_b, 1)])
