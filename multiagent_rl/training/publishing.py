"""What a trained policy takes to the Hub: its model card, its weights without the run's traces, an adapter that
names its base by Hub id."""

from __future__ import annotations

from pathlib import Path

from ..data.hub import base_model_id, fix_adapter_base, model_card_text, without_traces


class PublishingMixin:
    """Model card, ``push_to_hub`` and ``save_model`` of [`MixedAlgorithmTrainer`][multiagent_rl.training.trainer.MixedAlgorithmTrainer]
    (mixed into TRL's trainer: ``experiment``, ``model_card_results`` and the Trainer's attributes come from there)."""

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The model card (``output_dir/README.md``, pushed with the model): the real base model's Hub id, the
        environments, roles and algorithms, `model_card_results` and the command."""
        if self.is_world_process_zero():
            text = model_card_text(self.experiment, hub_model_id=self.hub_model_id, results=self.model_card_results,
                                   adapter=self.experiment.model.lora is not None)
            Path(self.args.output_dir, "README.md").write_text(text, encoding="utf-8")

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        """TRL's ``push_to_hub`` (weights, tokenizer, the model card), without the run's traces and episode logs:
        push those to a dataset repository with [`multiagent_rl.data.hub.push_traces`][]."""
        with without_traces():
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():  # a LoRA adapter names its base by Hub id, not the local path it came from
            fix_adapter_base(output_dir or self.args.output_dir, base_model_id(self.experiment.model.name))
