"""The transformers backend's decoding: a conversation's earlier turns are not encoded again (prefix_cache.py), and
requests join a running decode (decoding.py); nothing sampled changes.

Oracles: the same backend with the cache off (token for token, logprobs to 1e-6), each request decoded alone, and the
model's own full forward pass over the whole conversation (``token_logprobs``), which never saw a cache.
"""

import asyncio
import copy

import pytest
import torch

from multiagent_rl.backends import SamplingParams, TransformersBackend
from multiagent_rl.backends.prefix_cache import PrefixCache
from multiagent_rl.backends.scoring import token_logprobs
from multiagent_rl.models import build_tiny_model, load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny")


def _conversations(backend, prompts, params, turns, observation):
    """Each prompt grows turn by turn: prompt, reply, observation, reply, ... (the way traces extend)."""
    seqs, gens_per_turn = [list(p) for p in prompts], []
    for _ in range(turns):
        gens = backend.generate_batch(seqs, params)
        gens_per_turn.append(gens)
        seqs = [s + g.token_ids + observation for s, g in zip(seqs, gens)]
    return gens_per_turn, seqs


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=10, seed=5),
    SamplingParams(max_new_tokens=10, seed=6, temperature=0.7, top_p=0.9, stop=("e",)),
    SamplingParams(max_new_tokens=1, seed=7),
    SamplingParams(max_new_tokens=6, temperature=0),
])
def test_later_turns_read_earlier_ones_from_the_cache_and_sample_exactly_the_same(tiny, params):
    model, tok = tiny
    prompts = [tok.encode(f"Hello {i}, how are you? " * (1 + i % 3)) for i in range(5)]
    observation = tok.encode(" And then?")
    cached = TransformersBackend(model, tok, prefix_cache_mb=64)
    cached.prefix_min_tokens = 0  # keep even these short conversations
    plain = TransformersBackend(model, tok, prefix_cache_mb=0)
    with_cache, seqs = _conversations(cached, prompts, params, 4, observation)
    without, _ = _conversations(plain, prompts, params, 4, observation)
    for turn_a, turn_b in zip(with_cache, without):
        for a, b in zip(turn_a, turn_b):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6, rtol=0)
    stats = cached.prefix_cache
    assert stats.reused_tokens > stats.encoded_tokens  # turns 2-4 read most of their prompt from the cache
    assert len(stats) == len(prompts)  # one entry per conversation: each turn's entry replaces the last
    # The full forward pass over each whole conversation gives the logprobs the sampler recorded.
    if params.temperature == 1.0:
        scored = token_logprobs(model, seqs)
        for i, seq in enumerate(seqs):
            start = len(prompts[i])
            for turn in with_cache:
                reply = turn[i].token_ids
                torch.testing.assert_close(torch.tensor(scored[i][start:start + len(reply)]),
                                           torch.tensor(turn[i].logprobs), atol=1e-5, rtol=0)
                start += len(reply) + len(observation)


def test_the_cache_empties_when_the_weights_change(tiny):
    _, tok = tiny
    model = build_tiny_model(len(tok), seed=3)  # its own copy: the test writes to its weights
    backend = TransformersBackend(model, tok, prefix_cache_mb=64)
    backend.prefix_min_tokens = 0
    params = SamplingParams(max_new_tokens=4, seed=1)
    prompt = tok.encode("Tell me a story.")
    gen = backend.generate_batch([prompt], params)[0]
    follow = prompt + gen.token_ids + tok.encode(" More.")
    with torch.no_grad():  # what an optimizer step does: an in-place write
        model.model.norm.weight.mul_(2.0)
    reused = backend.prefix_cache.reused_tokens
    again = backend.generate_batch([follow], params)[0]
    assert backend.prefix_cache.reused_tokens == reused  # nothing read from before the write
    fresh = TransformersBackend(model, tok, prefix_cache_mb=0).generate_batch([follow], params)[0]
    assert again.token_ids == fresh.token_ids and again.logprobs == pytest.approx(fresh.logprobs, abs=1e-6)


def test_the_budget_evicts_the_least_recently_used_conversation():
    entry = [(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]  # 64 bytes
    cache = PrefixCache(budget_bytes=130)
    cache.store((1, 2, 3, 4), entry)
    cache.store((5, 6, 7, 8), entry)
    assert cache.lookup([1, 2, 3, 4, 0])[0] == 4  # touches the first: the second is now the oldest
    cache.store((9, 9, 9, 9), entry)
    assert cache.lookup([5, 6, 7, 8, 0]) == (0, None) and cache.lookup([1, 2, 3, 4, 0])[0] == 4
    assert cache.bytes == 128
    cache.store((1, 2, 3, 4, 0, 1), [(torch.zeros(1, 6, 2), torch.zeros(1, 6, 2))], replaces=(1, 2, 3, 4))
    assert cache.lookup([1, 2, 3, 4, 0]) == (0, None) and cache.lookup([1, 2, 3, 4, 0, 1, 2])[0] == 6
    cache.store((7,) * 100, [(torch.zeros(1, 100, 2), torch.zeros(1, 100, 2))])  # larger than the budget: not kept
    assert cache.lookup([7] * 101) == (0, None)


def test_a_sliding_window_model_encodes_every_prompt_whole_and_decodes_as_before(tiny):
    model, tok = tiny
    prompts = [tok.encode(f"Say {i} things.") for i in range(3)]
    params = SamplingParams(max_new_tokens=5, temperature=0)
    plain = TransformersBackend(model, tok, prefix_cache_mb=0).generate_batch(prompts, params)
    model.config.sliding_window, model.config.use_sliding_window = 4096, True  # a window longer than the sequences
    try:
        backend = TransformersBackend(model, tok)
        assert backend.prefix_cache is None
        assert not TransformersBackend(model, tok, continuous_batching=True).continuous_batching  # cannot merge caches
        assert [g.token_ids for g in backend.generate_batch(prompts, params)] == [g.token_ids for g in plain]
    finally:
        model.config.sliding_window, model.config.use_sliding_window = None, False


def test_columns_left_by_finished_rows_are_dropped(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok, prefix_cache_mb=0)
    long_prompt, short_prompt = tok.encode("a long question " * 20), tok.encode("hi")
    widths = []
    from multiagent_rl.backends.decoding import Decoding, Row

    decoding = Decoding(backend, SamplingParams(max_new_tokens=6, temperature=0, allowed_token_ids=(100, 101)))
    got = {}
    decoding.join([Row(long_prompt, lambda g: got.setdefault("long", g))])
    for _ in range(3):
        decoding.step()
    decoding.join([Row(short_prompt, lambda g: got.setdefault("short", g))])
    while decoding.rows:
        widths.append(decoding.mask.shape[1])
        decoding.step()
    # the long row finished first (it joined 3 tokens earlier): the short one no longer carries its prompt's columns
    assert widths[-1] < len(long_prompt)
    alone = backend.generate_batch([short_prompt], decoding.params)[0]
    assert got["short"].token_ids == alone.token_ids
    assert got["short"].logprobs == pytest.approx(alone.logprobs, abs=1e-6)


def test_requests_that_arrive_during_a_decode_join_it_and_get_what_they_would_alone(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok, prefix_cache_mb=0, continuous_batching=True)  # the default on a GPU
    # every reply runs its 12 tokens (no end-of-sequence among the allowed ones), so the decode outlasts the arrivals
    params = SamplingParams(max_new_tokens=12, temperature=0, allowed_token_ids=tuple(range(100, 140)))
    prompts = [tok.encode(f"Question {i}: what comes next?") for i in range(6)]

    async def late(prompt, ticks):
        for _ in range(ticks):  # arrives a few tokens into the running decode
            await asyncio.sleep(0)
        return await backend.generate(prompt, params)

    async def main():
        return await asyncio.gather(*(late(p, 2 * i) for i, p in enumerate(prompts)))

    replies = asyncio.run(main())
    assert backend.num_generate_calls == 1  # one decode served all six
    alone = [TransformersBackend(model, tok, prefix_cache_mb=0).generate_batch([p], params)[0] for p in prompts]
    for got, want in zip(replies, alone):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-6)


@pytest.mark.parametrize("continuous", [True, False])
def test_a_failing_forward_fails_its_requests_and_the_backend_serves_on(tiny, continuous):
    model, tok = tiny
    backend = TransformersBackend(model, tok, continuous_batching=continuous)
    params = SamplingParams(max_new_tokens=4, temperature=0)
    prompt = tok.encode("Hello")
    real_forward = model.forward
    model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("out of memory"))
    try:
        async def both():
            return await asyncio.gather(backend.generate(prompt, params), backend.generate(prompt, params),
                                        return_exceptions=True)
        results = asyncio.run(both())
    finally:
        del model.forward
    assert model.forward == real_forward
    assert all(isinstance(r, RuntimeError) and "out of memory" in str(r) for r in results)
    assert asyncio.run(backend.generate(prompt, params)).token_ids  # served again

    # a join that fails fails its joiners only: the rows already decoding go on
    from multiagent_rl.backends.decoding import Decoding, Row

    decoding, got = Decoding(backend, SamplingParams(max_new_tokens=3, temperature=0)), []
    decoding.join([Row(prompt, got.append)])
    failed = []
    backend._run(decoding, decoding.join, [Row([10 ** 9], got.append, fail=failed.append)])  # an id past the vocab
    assert len(failed) == 1 and len(decoding.rows) == 1
    while decoding.rows:
        decoding.step()
    assert got and got[0].token_ids


@pytest.mark.parametrize("continuous", [True, False])
def test_a_cancelled_request_leaves_the_decode(tiny, continuous):
    model, tok = tiny
    backend = TransformersBackend(model, tok, continuous_batching=continuous)
    params = SamplingParams(max_new_tokens=200, temperature=1.0, seed=0)
    prompt = tok.encode("Tell me everything.")

    async def main():
        impatient = asyncio.ensure_future(backend.generate(prompt, params))
        patient = asyncio.ensure_future(backend.generate(prompt, params.with_overrides(max_new_tokens=30)))
        for _ in range(10):
            await asyncio.sleep(0)
        impatient.cancel()
        return await patient

    reply = asyncio.run(main())
    assert reply.token_ids
    # the cancelled one's decode stopped within a few tokens of the cancel (not at its 200), then the other ran 30
    assert backend.num_forward_passes <= 50


def test_short_conversations_are_encoded_again_rather_than_kept(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    short, long = tok.encode("Bet or check?"), tok.encode("A long rule book. " * 40)
    assert len(short) + 4 < backend.prefix_min_tokens < len(long)
    backend.generate_batch([short, long], SamplingParams(max_new_tokens=4, temperature=0))
    assert [len(k) for k in backend.prefix_cache.entries] == [len(long) + 3]  # the long one only


def test_continuous_batching_is_on_by_default_for_a_model_on_a_gpu_only(tiny):
    model, tok = tiny
    assert not TransformersBackend(model, tok).continuous_batching  # on a CPU it was slower (docs/speed_results.md)
    if torch.cuda.is_available():
        assert TransformersBackend(copy.deepcopy(model).cuda(), tok).continuous_batching


@pytest.mark.parametrize("setting", [True, False])
def test_the_model_config_sets_continuous_batching_for_the_policy(setting):
    from multiagent_rl.rollout import Orchestrator

    orchestrator = Orchestrator.from_config({"model": {"name": "tiny", "continuous_batching": setting},
                                             "env": [{"id": "kuhn_poker", "args": {"legal_choices": True}}]})
    (backend,) = orchestrator.policies.values()
    assert backend.continuous_batching is setting
