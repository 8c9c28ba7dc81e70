"""The loss streams as one table: each row says which per-token values a trace carries for a stream and how the loss
turns them into a token loss. Everything else reads this table: the fields of
[`TokenStreams`][multiagent_rl.episodes.trace.TokenStreams], what an algorithm may declare as its ``loss_types``, the
collator's batch keys, the loss and its normalisers, the trace records and the Parquet schema, the metrics and the
console line. Adding a stream is one call:

```pycon
>>> from multiagent_rl.episodes.streams import STREAMS
>>> [s.name for s in STREAMS]
['rl', 'ce', 'ref_kl']
>>> STREAMS[0].field, STREAMS[0].mask, STREAMS[0].count
('advantages', 'rl_mask', 'num_rl_tokens')

```

``register_stream(Stream("my_stream", "my_weights", token_loss=my_fn))`` adds one (``my_fn(inputs) -> (B, T)``, see
[`multiagent_rl.training.loss.StreamInputs`][]); an algorithm then writes ``TokenStreams(name, my_weights=[...])``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..registry import import_object


@dataclass(frozen=True)
class Stream:
    """One loss stream."""

    name: str
    """The stream's name (``rl``, ``ce``, ``ref_kl``): what algorithms declare in ``loss_types``, what metrics say."""
    field: str
    """The ``TokenStreams`` field holding its per-token weights (also its batch key)."""
    token_loss: Callable[[Any], Any] | str
    """Per-token loss ``(StreamInputs) -> (B, T)``, already multiplied by the weights; or an import path to it
    (the built-in ones live in the loss module, which this table must not import)."""
    counts_weighted_only: bool = True
    """True: its normaliser counts the tokens with a non-zero weight; False (rl): every action token of a sample it
    scored, zero advantages included, as TRL's DAPO normaliser counts every completion token."""
    extras: tuple[str, ...] = ()
    """Other per-token ``TokenStreams`` fields it reads (``None`` allowed per token; batch key = field)."""

    @property
    def mask(self) -> str:
        """Batch key of the tokens it counts (its normaliser N is their global sum)."""
        return f"{self.name}_mask"

    @property
    def count(self) -> str:
        """Batch key of its global token count."""
        return f"num_{self.name}_tokens"

    def loss_function(self) -> Callable[[Any], Any]:
        return import_object(self.token_loss, "token loss") if isinstance(self.token_loss, str) else self.token_loss


STREAMS: list[Stream] = [
    Stream("rl", "advantages", "multiagent_rl.training.loss:policy_gradient", counts_weighted_only=False),
    Stream("ce", "ce_weights", "multiagent_rl.training.loss:cross_entropy"),
    Stream("ref_kl", "ref_kl_weights", "multiagent_rl.training.loss:reverse_kl", extras=("ref_logprobs",)),
]
"""The loss streams: rl (clipped policy gradient on the advantages), ce (cross-entropy), ref_kl (reverse KL toward a
teacher's logprobs)."""


def register_stream(stream: Stream) -> Stream:
    """Add a loss stream (a name and fields no other stream uses)."""
    taken = {s.name for s in STREAMS} | set(stream_fields())
    clash = {stream.name, stream.field, *stream.extras} & taken
    if clash:
        raise ValueError(f"stream {stream.name!r}: {sorted(clash)} already used by a registered stream")
    STREAMS.append(stream)
    return stream


def stream_names() -> tuple[str, ...]:
    return tuple(s.name for s in STREAMS)


def stream_fields() -> list[str]:
    """Every ``TokenStreams`` field: each stream's weights, then the extras."""
    return [s.field for s in STREAMS] + [e for s in STREAMS for e in s.extras]


def stream_by_name(name: str) -> Stream:
    for s in STREAMS:
        if s.name == name:
            return s
    raise KeyError(f"no loss stream {name!r}; the streams are {list(stream_names())}")
