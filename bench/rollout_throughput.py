"""Rollout throughput: concurrent multi-turn episodes batched into shared ``generate`` calls vs one at a time,
and the transformers backend vs vLLM.

Plays N episodes of a T-turn chat env with the embedded tiny model twice, on the same model and
sampling settings:

- ``batched``:    all episodes at once (``play_episodes(..., max_concurrency=N)``); the
                  transformers backend serves every episode's turn in one padded ``generate`` call;
- ``sequential``: one episode at a time (``max_concurrency=1``), one ``generate`` call per turn.

Every reply samples exactly ``--max-new-tokens`` tokens (the end-of-sequence tokens are masked out
of the model's logits for this comparison), so both modes do the same generation work.

``--backends transformers,vllm-colocate,vllm-server --concurrency 64,256`` instead compares the policy
backends: every episode of each row at once, episodes/s and sampled tokens/s (replies stop at the
end-of-turn token, so tokens/s is the fair measure). ``vllm-colocate`` is an in-process engine,
``vllm-server`` a server on loopback started by this script. On a GPU machine the same command is the
GPU benchmark (``--model`` a local path of a real model).

    MULTIAGENT_RL_CACHE=/tmp/mrlcache HF_HUB_OFFLINE=1 python bench/rollout_throughput.py
    python bench/rollout_throughput.py --backends transformers,vllm-colocate,vllm-server --concurrency 64,256
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from multiagent_rl import (  # noqa: E402
    Agent, AgentConfig, Env, SamplingParams, Task, TaskData, TransformersBackend, play_episodes, run_sync,
)
from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402

FOLLOW_UPS = ("Tell me more.", "And then what happened?", "Why?", "Say it differently.")


class MultiTurnChat(Env):
    """One seat, ``turns`` replies: the task's prompt, then fixed follow-up questions."""

    name = "multi_turn_chat"
    roles = ("agent",)

    def __init__(self, turns: int):
        self.turns = turns

    async def run(self, task, agents):
        async with agents["agent"].interaction(task) as it:
            await it.send()
            for k in range(self.turns - 1):
                await it.send(FOLLOW_UPS[k % len(FOLLOW_UPS)])
        it.trace.add_reward("turns", float(it.turns))


def _never_stop(model, eos_ids: list[int]) -> None:
    """Mask end-of-sequence tokens out of the logits so every reply has exactly max_new_tokens tokens."""
    ids = torch.tensor(eos_ids)

    def hook(_module, _inputs, output):
        output.logits[..., ids.to(output.logits.device)] = torch.finfo(output.logits.dtype).min
        return output

    model.register_forward_hook(hook)


def play(mode: str, model, tok, tasks, env, sampling: SamplingParams, concurrency: int) -> dict:
    backend = TransformersBackend(model, tok, model_id="tiny")
    agent = Agent(AgentConfig(model="tiny", sampling=sampling), backend)
    start = time.perf_counter()
    episodes = asyncio.run(play_episodes(env, tasks, {"agent": agent}, max_concurrency=concurrency))
    seconds = time.perf_counter() - start
    failed = [ep for ep in episodes if not ep.ok]
    if failed:
        raise RuntimeError(f"{mode}: {len(failed)} episodes failed; first error:\n{failed[0].errors[0]}")
    tokens = sum(t.num_action_tokens for ep in episodes for t in ep.traces)
    return {
        "mode": mode, "episodes": len(episodes), "seconds": seconds, "episodes_per_s": len(episodes) / seconds,
        "generate_calls": backend.num_generate_calls, "action_tokens": tokens,
    }


def make_backend(kind: str, model, tok, path: str, servers: list):
    if kind == "transformers":
        return TransformersBackend(model, tok, model_id="policy")
    if kind == "vllm-colocate":
        from multiagent_rl.backends.vllm_colocated import VLLMColocatedBackend

        return VLLMColocatedBackend(path, tok, max_model_len=1024, kv_cache_memory_bytes=512 << 20)
    if kind == "vllm-server":
        from multiagent_rl.backends import EndpointBackend, EndpointConfig
        from multiagent_rl.backends.vllm_server import start_vllm_server

        process, url = start_vllm_server(path, log_path="bench_vllm_server.log", max_model_len=1024)
        servers.append(process)
        return EndpointBackend(EndpointConfig(base_url=url, model=path, max_concurrency=512), tokenizer=tok)
    raise ValueError(f"unknown backend {kind!r}: transformers, vllm-colocate or vllm-server")


def raw_vllm(path: str, tok, concurrencies: list[int], sampling: SamplingParams) -> list[dict]:
    from vllm import LLM
    from vllm import SamplingParams as VLLMParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=path, max_model_len=1024, seed=0, enforce_eager=True, logprobs_mode="processed_logprobs",
              **({} if torch.cuda.is_available() else {"dtype": "float32", "kv_cache_memory_bytes": 512 << 20}))
    # the same work the policy backend asks for: the sampled tokens' logprobs (training needs them)
    params = VLLMParams(temperature=sampling.temperature, max_tokens=sampling.max_new_tokens, logprobs=0)
    rows = []
    for n in concurrencies:
        prompts = [TokensPrompt(prompt_token_ids=tok.apply_chat_template(
            [{"role": "user", "content": f"Episode {i} (raw): tell me a short story."}], tokenize=True,
            add_generation_prompt=True)["input_ids"]) for i in range(n)]
        llm.generate(prompts[:4], params, use_tqdm=False)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        rows.append({"backend": "vllm-raw", "concurrency": n, "seconds": seconds, "episodes_per_s": n / seconds,
                     "tokens_per_s": tokens / seconds})
    del llm
    return rows


def compare_backends(kinds: list[str], concurrencies: list[int], args) -> list[dict]:
    from multiagent_rl.models import resolve_model

    path = resolve_model(args.model)
    model, tok = load_model_and_tokenizer(args.model)
    model.eval().requires_grad_(False)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    env = MultiTurnChat(args.turns)
    rows, servers = [], []
    try:
        for kind in kinds:
            if kind == "vllm-raw":  # vLLM alone: the same first-turn prompts straight into LLM.generate
                rows += raw_vllm(path, tok, concurrencies, sampling)
                continue
            backend = make_backend(kind, model, tok, path, servers)
            agent = Agent(AgentConfig(model="policy", sampling=sampling), backend)
            run_episodes = lambda n, tag: run_sync(play_episodes(  # noqa: E731
                env, [Task(TaskData(prompt=f"Episode {i} ({tag}): tell me a short story.")) for i in range(n)],
                {"agent": agent}, max_concurrency=n))
            run_episodes(4, "warm-up")
            for n in concurrencies:
                start = time.perf_counter()
                episodes = run_episodes(n, kind)
                seconds = time.perf_counter() - start
                failed = [ep for ep in episodes if not ep.ok]
                if failed:
                    raise RuntimeError(f"{kind}: {len(failed)} episodes failed: {failed[0].errors[0]}")
                tokens = sum(t.num_action_tokens for ep in episodes for t in ep.traces)
                rows.append({"backend": kind, "concurrency": n, "seconds": seconds, "episodes_per_s": n / seconds,
                             "tokens_per_s": tokens / seconds})
            if hasattr(backend, "llm"):
                del backend.llm
    finally:
        from multiagent_rl.backends.vllm_server import stop_vllm_server

        for process in servers:
            stop_vllm_server(process)
    device = next(model.parameters()).device
    print(f"policy backends: {args.model} on {device}, {args.turns} turns x up to {args.max_new_tokens} new tokens "
          f"per episode, all episodes of a row at once")
    print(f"{'backend':<16}{'episodes':>10}{'seconds':>10}{'episodes/s':>12}{'tokens/s':>11}")
    for r in rows:
        print(f"{r['backend']:<16}{r['concurrency']:>10}{r['seconds']:>10.2f}{r['episodes_per_s']:>12.2f}"
              f"{r['tokens_per_s']:>11.0f}")
    print("reproduce: " + " ".join(["python", "bench/rollout_throughput.py", *map(shlex.quote, sys.argv[1:])]))
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64, help="episodes per mode (all concurrent in batched mode)")
    parser.add_argument("--turns", type=int, default=3, help="replies per episode")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens sampled per reply (fixed)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default=None,
                        help="compare policy backends instead: transformers,vllm-colocate,vllm-server,vllm-raw "
                             "(vllm-raw: LLM.generate alone on the same first-turn prompts, with logprobs)")
    parser.add_argument("--concurrency", default="64,256", help="episodes in flight per row (with --backends)")
    parser.add_argument("--model", default="tiny", help="with --backends: 'tiny' or a local model path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.backends:
        return {"rows": compare_backends(args.backends.split(","), [int(n) for n in args.concurrency.split(",")],
                                         args)}

    model, tok = load_model_and_tokenizer("tiny")
    model.eval().requires_grad_(False)
    backend_probe = TransformersBackend(model, tok)
    _never_stop(model, backend_probe.eos_token_ids)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    env = MultiTurnChat(args.turns)
    tasks = [Task(TaskData(prompt=f"Episode {i}: tell me a short story.", id=str(i))) for i in range(args.episodes)]

    play("warmup", model, tok, tasks[:2], env, sampling, 2)  # first-call costs out of the timings
    rows = [
        play("batched", model, tok, tasks, env, sampling, args.episodes),
        play("sequential", model, tok, tasks, env, sampling, 1),
    ]
    expected = args.episodes * args.turns * args.max_new_tokens
    for r in rows:
        assert r["action_tokens"] == expected, f"{r['mode']}: {r['action_tokens']} tokens, expected {expected}"
    ratio = rows[0]["episodes_per_s"] / rows[1]["episodes_per_s"]

    device = next(model.parameters()).device
    print(f"rollout throughput: tiny model on {device} ({torch.get_num_threads()} torch threads), "
          f"{args.turns} turns x {args.max_new_tokens} new tokens per episode")
    print(f"{'mode':<12}{'episodes':>10}{'seconds':>10}{'episodes/s':>12}{'generate calls':>16}{'action tokens':>15}")
    for r in rows:
        print(f"{r['mode']:<12}{r['episodes']:>10}{r['seconds']:>10.2f}{r['episodes_per_s']:>12.2f}"
              f"{r['generate_calls']:>16}{r['action_tokens']:>15}")
    print(f"batched / sequential throughput: {ratio:.1f}x")
    print("reproduce: " + " ".join(["python", "bench/rollout_throughput.py", *map(shlex.quote, sys.argv[1:])]))
    return {"rows": rows, "ratio": ratio}


if __name__ == "__main__":
    main()
