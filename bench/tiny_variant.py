"""Save a wider or deeper variant of the embedded tiny model (same tokenizer, same chat template) to a folder, for
capacity experiments: does a game's policy need more than the default 64-wide, 2-layer model?

    python bench/tiny_variant.py --hidden-size 128 --output /tmp/tiny-128
    python recipes/leduc_poker.py --model /tmp/tiny-128
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from multiagent_rl.models import TINY_ARCHITECTURE, load_tokenizer  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden-size", type=int, default=TINY_ARCHITECTURE["hidden_size"])
    p.add_argument("--layers", type=int, default=TINY_ARCHITECTURE["num_hidden_layers"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    tokenizer = load_tokenizer("tiny")
    # Head size 32 as in the default (vLLM's CPU attention refuses 16); the MLP twice the width, as in the default.
    architecture = {**TINY_ARCHITECTURE, "hidden_size": args.hidden_size, "intermediate_size": 2 * args.hidden_size,
                    "num_hidden_layers": args.layers, "num_attention_heads": args.hidden_size // 32}
    config = Qwen2Config(vocab_size=len(tokenizer), **architecture, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [2, 0]
    model.generation_config.pad_token_id = 0
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(json.dumps({"output": args.output, "parameters": sum(p.numel() for p in model.parameters()),
                      **architecture}))


if __name__ == "__main__":
    main()
