"""Several learners in one trainer: one LoRA adapter per ``[policies]`` entry on one frozen base model, or one full
model per entry ([`PolicyModels`][multiagent_rl.models.policy_models.PolicyModels], when each names its ``model``).

Each collated row carries the policy that sampled it (``batch["policy"]``, from the trace's ``policy``); with several
policies the trainer adds ``policy_index`` and the loss module counts every stream per policy, so each policy's loss
is normalised as if it trained alone and the total is the sum of the single-policy losses
([`add_global_counts`][multiagent_rl.training.loss.add_global_counts]). A micro-batch is scored one policy at a time,
with that policy's adapter active (PEFT runs one adapter per forward pass in training) or by that policy's model, so
policy A's gradient from B's rows is exactly zero; under DDP those forward passes bypass its reducer and the gradients
are averaged over the processes once per optimizer step. One optimizer holds every policy, with each policy's own
learning rate on its parameter groups. Each policy saves to its own folder (``final_model/NAME``: adapter or model,
tokenizer, model card), and checkpoints hold all of them.
"""

from __future__ import annotations

import functools
import os

import torch

from ..backends import TransformersBackend, build_policy_backend
from ..backends.base import DeferredWeightPush
from ..models.adapters import add_adapters, use_adapter
from ..models.policy_models import PolicyModels, load_policies, policy_of_parameter, policy_part
from ..config import env_labels
from ..policies import learner_of_seat, policy_lora
from .logits import Scored
from .loss import add_global_counts


def _policy_of_parameter(name: str, policies: list[str]) -> str | None:
    """The adapter a PEFT parameter belongs to (``...lora_A.<adapter>.weight``), if it is one of ``policies``."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.startswith("lora_") and parts[i + 1] in policies:
            return parts[i + 1]
    return None


def _rows(batch: dict, rows: torch.Tensor) -> dict:
    """The sub-batch of ``rows`` (tensors and per-row lists cut along the first dimension; scalars kept)."""
    size = batch["completion_ids"].shape[0]
    picked = rows.tolist()
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == size:
            out[key] = value[rows]
        elif isinstance(value, list) and len(value) == size:
            out[key] = [value[i] for i in picked]
        else:
            out[key] = value
    return out


class PoliciesMixin:
    """The several-policy parts of [`MixedAlgorithmTrainer`][multiagent_rl.training.trainer.MixedAlgorithmTrainer] (see
    the module docstring); with one policy every method here is today's single-policy path."""

    @property
    def policy_names(self) -> list[str]:
        return self.experiment.policy_names()

    @property
    def several_policies(self) -> bool:
        return len(self.policy_names) > 1

    @property
    def saves_per_policy(self) -> bool:
        """Whether each policy saves (and pushes) on its own: adapters, or full models of their own."""
        return self.experiment.uses_adapters or self.experiment.uses_full_models

    def policy_to_train(self, model, tokenizer, use_cpu: bool = False):
        """``(model, tokenizer, peft_config)`` for TRL: ``model`` (a dict ``{name: model}`` for full-model policies)
        or, when None, the config's (``[model] name``, or each policy's own ``model``), made ready by ``with_adapters``."""
        if model is None:  # adapters are added by with_adapters, as for a model passed in
            model, loaded = load_policies(self.experiment, device="cpu" if use_cpu else None, adapters=False)
            tokenizer = tokenizer or loaded
        elif tokenizer is None:
            raise ValueError("Pass processing_class (the tokenizer) together with a model object")
        elif isinstance(model, dict):  # full-model policies, each given as an object
            model = PolicyModels(model)
        model, peft_config = self.with_adapters(model, tokenizer)
        return model, tokenizer, peft_config

    def with_adapters(self, model, tokenizer):
        """``(model, peft_config)`` for TRL: with adapters a ``PeftModel`` with one trainable adapter per policy, named
        after it (and no ``peft_config``); full-model policies their ``PolicyModels``, each told the tokenizer's pad
        token (TRL tells the first); else the model and ``[model] lora`` as a ``LoraConfig`` (or None)."""
        from peft import LoraConfig

        if self.experiment.uses_full_models:
            if not isinstance(model, PolicyModels) or list(model.policies) != self.policy_names:
                raise TypeError(f"full-model [policies] {self.policy_names} train one model each: pass model={{name: "
                                "model}} in that order (or no model: each policy's `model` is loaded)")
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            for member in model.policies.values():
                member.config.get_text_config().pad_token_id = pad
                member.generation_config.pad_token_id = pad
            return model, None
        if not self.experiment.uses_adapters:
            lora = self.experiment.model.lora
            return model, None if lora is None else LoraConfig(task_type="CAUSAL_LM", **lora)
        return add_adapters(model, {name: policy_lora(self.experiment, name) for name in self.policy_names}), None

    def fuse_policy_heads(self) -> None:
        """TRL gives the model it trains a fused LM head (per-token log-probs without the full logits), which its
        scoring pass calls; full-model policies: give it to each policy's model, the ones that are scored."""
        if not self.experiment.uses_full_models:
            return
        from trl.trainer.utils import add_fused_lm_head

        for member in self.accelerator.unwrap_model(self.model).policies.values():
            add_fused_lm_head(member, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                              outputs=("log_probs", "entropy"))

    def policy_backends(self, policy, tokenizer) -> dict:
        """Per policy, the backend its seats sample from: with adapters, the live model with that adapter active
        (requests batched per adapter); else the one policy's ``[model] backend``."""
        names, args = self.policy_names, self.args
        if self.experiment.uses_adapters and self.experiment.model.backend == "vllm":  # one engine, one adapter each
            build = lambda adapters: build_policy_backend(  # noqa: E731
                self.experiment.model, policy, tokenizer, seed=args.seed, adapters=adapters,
                max_batch_size=args.max_concurrency, endpoints=self.experiment.endpoints)
            if self.experiment.model.vllm.mode == "server":  # one client per adapter of the server's
                backends = {name: build([name]) for name in names}
            else:
                first = build(names)
                backends = {name: first if name == names[0] else first.view(name) for name in names}
            for name, backend in backends.items():
                backend.policy_name = name
            return backends
        if self.experiment.uses_adapters or self.experiment.uses_full_models:
            return {name: self._backend_of(policy, name, tokenizer, max_batch_size=args.max_concurrency)
                    for name in names}
        backend = build_policy_backend(self.experiment.model, policy, tokenizer, seed=args.seed,
                                       max_batch_size=args.max_concurrency, endpoints=self.experiment.endpoints)
        backend.policy_name = names[0]
        return {names[0]: backend}

    def _backend_of(self, policy, name: str, tokenizer, **kwargs) -> TransformersBackend:
        """A transformers backend sampling policy ``name`` of the live ``policy`` module."""
        module, adapter = policy_part(self.experiment, policy, name)
        return TransformersBackend(module, tokenizer, model_id="policy", adapter=adapter, policy_name=name,
                                   **self.experiment.model.decoding, **kwargs)

    @functools.cached_property
    def live_policies(self) -> dict:
        """Per policy, a backend on the live weights for evaluations between steps: the rollout's own, or with
        ``async_rollouts`` (whose backends sample a copy, in another thread) a transformers backend of its own."""
        if self.ahead is None:
            return self.rollout.policies
        live = self.accelerator.unwrap_model(self.model)
        return {name: self._backend_of(live, name, self.tokenizer) for name in self.rollout.policies}

    def live_policy(self, name: str | None = None):
        """The backend on the live weights of policy ``name`` (default: the first), for evaluations between steps (a
        served sampler is handed the current weights first)."""
        backend = self.live_policies[name or self.policy_names[0]]
        if isinstance(backend, DeferredWeightPush):
            backend.sync_weights(self.accelerator.unwrap_model(self.model))
        return backend

    def check_policies_supported(self) -> None:
        """Refuse, naming the way out, what several policies cannot do here yet."""
        if not self.several_policies:
            return
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            raise ValueError("several [policies] are scored one policy at a time outside the distributed wrapper, "
                             "with their gradients averaged once per step: DDP supports that, FSDP and DeepSpeed "
                             "(which shard or reduce the gradients themselves) do not; launch with DDP "
                             "(accelerate launch --multi_gpu) or train one policy")
        if any(r.needs_logits for r in self.regularisers):
            raise ValueError("a regulariser that reads the policy's logits (magnet) keeps one anchor model; with "
                             "several [policies] it is not supported yet: drop the regulariser or train one policy")

    def count_tokens(self, batch: dict, all_reduce_sum) -> None:
        """Each stream's global token count into ``batch`` (with several policies: per policy, by ``policy_index``)."""
        self.index_policies(batch)
        add_global_counts(batch, all_reduce_sum, num_policies=len(self.policy_names))

    def index_policies(self, batch: dict) -> None:
        """With several policies: ``batch["policy_index"]`` (B,), each row's policy (padding rows: the first)."""
        if not self.several_policies:
            return
        names = self.policy_names
        unknown = sorted({p for p in batch["policy"] if p is not None and p not in names})
        if unknown:
            raise RuntimeError(f"traces of policies {unknown} reached the batch, which trains {names}")
        specs = dict(zip(env_labels(self.experiment), self.experiment.env))
        learners = [p if p is not None else learner_of_seat(self.experiment, specs[env], role) if env else names[0]
                    for p, env, role in zip(batch["policy"], batch["env"], batch["role"])]  # no env: a padding row
        batch["policy_index"] = torch.tensor([names.index(p) for p in learners], device=batch["completion_ids"].device)

    def score_policies(self, model, batch: dict, compute_entropy: bool = False, need_logits: bool = False) -> Scored:
        """The scorer's per-token logprobs (and entropies) of ``batch``, each row under its own policy's adapter or
        by its own policy's model."""
        if "policy_index" not in batch:
            return self.scorer.score(model, batch, compute_entropy=compute_entropy, need_logits=need_logits)
        # One forward pass per policy, on the unwrapped module: DDP's reducer expects one forward per backward, so
        # under DDP the gradients are all-reduced once per optimizer step instead (`_sync_policy_grads`).
        live = self.accelerator.unwrap_model(model)
        index = batch["policy_index"]
        logps = entropies = None
        for k, name in enumerate(self.policy_names):
            rows = (index == k).nonzero().squeeze(1)
            if not len(rows):
                continue
            module, adapter = policy_part(self.experiment, live, name)
            with use_adapter(module, adapter):
                part = self.scorer.score(module, _rows(batch, rows), compute_entropy=compute_entropy)
            if logps is None:
                logps = part.logps.new_zeros(batch["completion_ids"].shape)
                entropies = part.logps.new_zeros(batch["completion_ids"].shape) if compute_entropy else None
            logps = logps.index_copy(0, rows.to(logps.device), part.logps)
            if compute_entropy:
                entropies = entropies.index_copy(0, rows.to(logps.device), part.entropies)
        return Scored(logps, entropies)

    def _sync_policy_grads(self, model) -> None:
        """Several policies on several processes: average the adapters' gradients over the processes (what DDP does
        for one forward pass), once per optimizer step, before the gradient norm is read or clipped."""
        if not self.several_policies or self.accelerator.num_processes == 1:
            return
        if getattr(self, "_policy_grads_synced", None) == self.state.global_step:
            return
        self._policy_grads_synced = self.state.global_step
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        torch.distributed.all_reduce(flat)
        flat /= self.accelerator.num_processes
        for p, grad in zip(params, flat.split([p.numel() for p in params])):
            p.grad = grad.view_as(p).clone()

    def _clip_grad_norm(self, model):
        self._sync_policy_grads(model)
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        self._sync_policy_grads(model)
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def create_optimizer(self, model=None):
        """TRL's optimizer, or with several policies their parameter groups at each policy's own learning rate: one
        per adapter; a full model's two (with and without weight decay, as the Trainer splits them)."""
        if not self.saves_per_policy or self.optimizer is not None:
            return super().create_optimizer(model)
        from transformers import Trainer

        opt_model = self.model if model is None else model
        names, full = self.policy_names, self.experiment.uses_full_models
        owner_of = policy_of_parameter if full else _policy_of_parameter
        decay = set(self.get_decay_parameter_names(opt_model)) if full else None
        trained = [(pname, p) for pname, p in opt_model.named_parameters() if p.requires_grad]
        groups = []
        for name in names:
            mine = [(pname, p) for pname, p in trained if owner_of(pname, names) == name]
            split = ([p for n, p in mine if n in decay], [p for n, p in mine if n not in decay]) if full \
                else ([p for _, p in mine], [])
            lr = self.experiment.policy_config(name).learning_rate or self.args.learning_rate
            groups += [{"params": params, "weight_decay": decay_rate, "lr": lr}
                       for params, decay_rate in zip(split, (self.args.weight_decay, 0.0)) if params]
        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, opt_model)
        self.optimizer = optimizer_cls(groups, **kwargs)
        return self.optimizer

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """With several policies: every policy in its own folder ``output_dir/NAME`` (adapter or full model,
        tokenizer and, for a folder saved on request, its model card); else the single-policy ``save_model``."""
        if not self.saves_per_policy:
            return super().save_model(output_dir, _internal_call)
        from ..data.hub import base_model_id, fix_adapter_base

        folder = output_dir or self.args.output_dir
        if not self.is_world_process_zero():
            return
        os.makedirs(folder, exist_ok=True)
        model = self.accelerator.unwrap_model(self.model)
        for name in self.policy_names:
            target = os.path.join(folder, name)
            if self.experiment.uses_full_models:
                model[name].save_pretrained(target)
            else:
                model.save_pretrained(folder, selected_adapters=[name])  # PEFT writes a named adapter to folder/name
            self.processing_class.save_pretrained(target)
            fix_adapter_base(target, base_model_id(self.experiment.model.name), trained_on=self.experiment.model.name)
            if not _internal_call:
                with open(os.path.join(target, "README.md"), "w", encoding="utf-8") as f:
                    f.write(self.model_card(policy=name))
        torch.save(self.args, os.path.join(folder, "training_args.bin"))

    def push_policies(self, repo: str, private: bool = True) -> dict[str, str]:
        """With several policies: every policy to its own Hub repository ``REPO-NAME`` (its adapter or model,
        tokenizer and model card, saved first); returns the repository ids by policy."""
        from huggingface_hub import HfApi

        folder = os.path.join(self.args.output_dir, "final_model")
        self.save_model(folder)
        api, pushed = HfApi(), {}
        for name in self.policy_names:
            repo_id = api.create_repo(f"{repo}-{name}", private=private, exist_ok=True).repo_id
            api.upload_folder(repo_id=repo_id, folder_path=os.path.join(folder, name), commit_message=f"policy {name}")
            pushed[name] = repo_id
        return pushed

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """With several policies: every policy's adapter or model from ``checkpoint/NAME``; else the Trainer's own
        loading."""
        if self.experiment.uses_full_models:
            live = self.accelerator.unwrap_model(model if model is not None else self.model)
            for name in self.policy_names:
                folder = os.path.join(resume_from_checkpoint, name)
                if not os.path.exists(os.path.join(folder, "config.json")):
                    raise ValueError(f"{resume_from_checkpoint} has no model of policy {name!r} ({folder}): it was "
                                     "saved by a run with other [policies]")
                member = live[name]  # from_pretrained reads shards and tied weights as they were saved
                saved = type(member).from_pretrained(folder, dtype=next(member.parameters()).dtype)
                member.load_state_dict(saved.state_dict())
            return None
        if not self.experiment.uses_adapters:
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        peft_model = self.accelerator.unwrap_model(model if model is not None else self.model)
        for name in self.policy_names:
            path = os.path.join(resume_from_checkpoint, name, "adapter_model.safetensors")
            if not os.path.exists(path):
                raise ValueError(f"{resume_from_checkpoint} has no adapter of policy {name!r} ({path}): it was saved "
                                 "by a run with other [policies]")
            device = next(peft_model.parameters()).device
            set_peft_model_state_dict(peft_model, load_file(path, device=str(device)), adapter_name=name)
