"""The transformers backend's decode loop: rows that share a sampling setting decode together, join while it runs and
leave when they finish (continuous batching), each row reading its prompt's longest cached prefix.

Layout of the running batch: every row's next input goes in the same column. A joining row is prefilled first, laid
out as its cached prefix right-aligned in P columns, then its uncached prompt tokens right-aligned in S columns; then
it and the running rows are padded on the left to one width and stacked. The attention mask marks every padding column
and position ids count a row's own tokens only, so each row computes what it would alone (to float rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from ..models.adapters import use_adapter
from .base import Generation, SamplingParams
from .prefix_cache import batched_cache, cache_layers, merge_caches, weights_version
from .scoring import eval_mode, model_device


@dataclass
class Row:
    """One request being decoded."""

    prompt: list[int]
    deliver: Callable[[Generation], None]
    """Called with the reply once the row finishes."""
    reused: int = 0
    """Prompt tokens read from the prefix cache."""
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    cancelled: Callable[[], bool] = lambda: False
    """True once nobody waits for the reply (an episode timed out): the row leaves without finishing."""
    fail: Callable[[BaseException], None] = lambda exc: None
    """Called instead of ``deliver`` when the decode fails."""


class Decoding:
    """The rows of one backend decoding with one ``SamplingParams``: ``join`` prefills new rows (sampling their first
    token), ``step`` samples one more token for every row; each returns after the finished rows were delivered and
    left the batch."""

    def __init__(self, backend, params: SamplingParams):
        self.backend, self.params = backend, params
        self.device = model_device(backend.model)
        self.generator = None
        if params.seed is not None and params.temperature > 0:
            self.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.rows: list[Row] = []
        self.kv = None
        self.mask: torch.Tensor | None = None  # (B, width): which columns of the cache are each row's own tokens
        self.positions: torch.Tensor | None = None  # (B, 1): the position of each row's last input
        self.last: torch.Tensor | None = None  # (B,): each row's last sampled token, its next input

    def join(self, rows: list[Row]) -> None:
        backend, cache = self.backend, self.backend.prefix_cache
        with torch.no_grad(), use_adapter(backend.model, backend.adapter), eval_mode(backend.model):
            if cache is not None:
                cache.validate(weights_version(backend.model))
            hits = [cache.lookup(r.prompt) if cache is not None else (0, None) for r in rows]
            B, P = len(rows), max(n for n, _ in hits)
            S = max(len(r.prompt) - n for r, (n, _) in zip(rows, hits))
            ids = torch.full((B, S), backend.pad_token_id, dtype=torch.long)
            positions = torch.zeros((B, S), dtype=torch.long)
            mask = torch.zeros((B, P + S), dtype=torch.long)
            for i, (row, (n, _)) in enumerate(zip(rows, hits)):
                s = len(row.prompt) - n
                ids[i, S - s:] = torch.tensor(row.prompt[n:])
                positions[i, S - s:] = torch.arange(n, n + s)
                mask[i, P - n:P] = 1
                mask[i, P + S - s:] = 1
                row.reused = n
            if cache is not None:
                cache.reused_tokens += sum(n for n, _ in hits)
                cache.encoded_tokens += sum(len(r.prompt) - n for r, (n, _) in zip(rows, hits))
            mask, positions = mask.to(self.device), positions.to(self.device)
            if self._one_shot(rows, P):  # one-token replies (game moves): no cache to build, nothing decodes on
                kv = None
            elif backend.reusable_cache:
                kv = batched_cache([kv for _, kv in hits], P, B, self.device)
            else:
                kv = DynamicCache(config=backend.model.config)
            logits = self._forward(ids.to(self.device), mask, positions, kv)
        if self.rows:
            self.kv, self.mask = merge_caches(self.kv, self.mask, kv, mask)
            self.positions = torch.cat([self.positions, positions[:, -1:]])
        else:
            self.kv, self.mask, self.positions = kv, mask, positions[:, -1:]
        self.rows += rows
        self._sampled(logits, len(self.rows) - B)

    def _one_shot(self, rows: list[Row], reused: int) -> bool:
        """Whether ``rows`` finish after the token their prefill samples, with no keys or values to keep or read."""
        return self.params.max_new_tokens == 1 and not self.rows and not reused and not any(
            self._worth_keeping(len(r.prompt) + 1) for r in rows)

    def _worth_keeping(self, tokens: int) -> bool:
        """Whether a conversation of ``tokens`` tokens goes into the prefix cache once its reply is sampled."""
        return self.backend.prefix_cache is not None and tokens > self.backend.prefix_min_tokens

    def step(self) -> None:
        backend = self.backend
        with torch.no_grad(), use_adapter(backend.model, backend.adapter), eval_mode(backend.model):
            self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], 1)
            self.positions = self.positions + 1
            logits = self._forward(self.last[:, None], self.mask, self.positions, self.kv)
        self._sampled(logits, 0)

    def _forward(self, ids, mask, positions, kv) -> torch.Tensor:
        """The last position's logits; ``kv`` None: a forward that keeps no cache."""
        backend = self.backend
        backend.num_forward_passes += 1
        cache = {} if kv is None else {backend.cache_argument: kv}
        return backend.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=kv is not None,
                             logits_to_keep=1, **cache).logits[:, -1].float()

    def _sampled(self, logits: torch.Tensor, first: int) -> None:
        """Record the tokens sampled from ``logits`` for rows ``first`` on, then deliver the rows that finished."""
        tokens, logps = sample(logits, self.params, self.generator)
        last = tokens if first == 0 else torch.cat([self.last, tokens])
        for row, token, lp in zip(self.rows[first:], tokens.tolist(), logps.tolist()):
            row.tokens.append(token)
            row.logps.append(lp)
        done = [j for j, row in enumerate(self.rows) if row.cancelled() or (j >= first and self._stops(row))]
        self.last = last
        if not done:
            return
        backend = self.backend
        for j in done:
            row = self.rows[j]
            if row.cancelled():
                continue
            reply = backend.finish(row.tokens, row.logps, self.params)
            if self._worth_keeping(len(row.prompt) + len(reply.token_ids)):
                self._keep(j, row, reply.token_ids)
            row.deliver(reply)
        keep = [j for j in range(len(self.rows)) if j not in set(done)]
        if not keep:
            self.rows, self.kv, self.mask, self.positions, self.last = [], None, None, None, None
            return
        index = torch.tensor(keep, device=self.device)
        self.kv.batch_select_indices(index)
        self.rows = [self.rows[j] for j in keep]
        self.mask, self.positions, self.last = self.mask[index], self.positions[index], self.last[index]
        dead = int(self.mask.any(0).int().argmax())  # leading columns no remaining row reads (left by those that left)
        if dead and backend.reusable_cache:
            self.mask = self.mask[:, dead:]
            for layer in self.kv.layers:
                layer.drop_leading(dead)

    def _stops(self, row: Row) -> bool:
        params, backend = self.params, self.backend
        if len(row.tokens) >= params.max_new_tokens or row.tokens[-1] in backend.eos_token_ids:
            return True
        if not params.stop:
            return False
        # a stop string completed by the last token lies in the last few tokens (``finish`` finds the exact end)
        tail = backend.tokenizer.decode(row.tokens[-(2 * max(map(len, params.stop)) + 8):], skip_special_tokens=True)
        return any(s in tail for s in params.stop)

    def _keep(self, j: int, row: Row, kept: list[int]) -> None:
        """Store row ``j``'s keys and values for its prompt and kept reply but the reply's last token (never fed
        back): what the conversation's next prompt starts with. It supersedes the entry it was read from."""
        ids = tuple(row.prompt) + tuple(kept[:-1])
        columns = self.mask[j].nonzero().squeeze(1)[: len(ids)]
        self.backend.prefix_cache.store(ids, [(k[j][:, columns], v[j][:, columns]) for k, v in cache_layers(self.kv)],
                                        replaces=tuple(row.prompt[: row.reused]) if row.reused else None)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None):
    """One token per row from raw ``logits`` (B, V), with transformers' temperature and top-p rules, and its
    log-probability at the sampling temperature over the allowed tokens (greedy: at temperature 1)."""
    from transformers.generation.logits_process import TopPLogitsWarper

    logits = allow_only(logits, params.allowed_token_ids)
    if params.temperature == 0:
        tokens = logits.argmax(-1)
        logps = torch.log_softmax(logits, -1)
    else:
        scaled = logits / params.temperature
        logps = torch.log_softmax(scaled, -1)
        if params.top_p < 1.0:
            scaled = TopPLogitsWarper(params.top_p)(None, scaled)
        tokens = torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator).squeeze(-1)
    return tokens, logps.gather(-1, tokens[:, None]).squeeze(-1)


def allow_only(logits: torch.Tensor, allowed: tuple[int, ...] | None) -> torch.Tensor:
    """``logits`` with every token outside ``allowed`` at -inf (unchanged when ``allowed`` is None)."""
    if allowed is None:
        return logits
    keep = torch.zeros(logits.size(-1), dtype=torch.bool, device=logits.device)
    keep[list(allowed)] = True
    return logits.masked_fill(~keep, float("-inf"))
