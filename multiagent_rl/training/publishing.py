"""What a trained policy takes to the Hub: its model card, its weights without the run's traces, an adapter that
names its base by Hub id. New repositories are private, as pushed trace datasets are, unless
``hub_private_repo = false``."""

from __future__ import annotations

from pathlib import Path

from ..data.hub import base_model_id, fix_adapter_base, model_card_text, without_traces


class PublishingMixin:
    """Model card, ``push_to_hub`` and ``save_model`` of [`MixedAlgorithmTrainer`][multiagent_rl.training.trainer.MixedAlgorithmTrainer]
    (mixed into TRL's trainer: ``experiment``, ``model_card_results``, ``rollout`` and the Trainer's attributes come
    from there)."""

    command: str | None = None
    """The command that reproduces the run, for the model card's "Reproduce" section (the recipes set theirs; default:
    this process's command line)."""
    model_card_datasets: list[str] | None = None
    """Hub ids of the datasets the model card names (``datasets:``): the run's pushed traces."""
    model_card_license: str | None = None
    """The model card's ``license``; default: the base model's, where it can be read (else none, with a warning)."""

    def model_card(self, policy: str | None = None) -> str:
        """The model card's text: the real base model's Hub id and license, every seat of every environment with its
        algorithm, the datasets, `model_card_results` and the command; ``policy``: the card of that one of several
        ``[policies]`` (its seats named)."""
        rollout = getattr(self, "rollout", None)  # the built envs know their seats (an env may set them per instance)
        seats = {slot.label: tuple(slot.env.roles) for slot in rollout.slots} if rollout is not None else None
        return model_card_text(self.experiment, hub_model_id=self.hub_model_id or self.args.hub_model_id,
                               results=self.model_card_results, command=self.command,
                               adapter=self.experiment.model.lora is not None or self.experiment.uses_adapters,
                               datasets=self.model_card_datasets, license=self.model_card_license, seats=seats,
                               policy=policy)

    def write_model_card(self, folder: str) -> None:
        """Write the model card to ``folder/README.md`` (on the main process)."""
        if self.is_world_process_zero():
            Path(folder, "README.md").write_text(self.model_card(), encoding="utf-8")

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The model card of ``output_dir`` (``README.md``, pushed with the model); see `model_card`."""
        self.write_model_card(self.args.output_dir)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the Hub repository: private unless ``private`` or ``hub_private_repo`` says otherwise (the Hub's own
        default is public; one default for models and trace datasets keeps a run's outputs together)."""
        if private is None and self.args.hub_private_repo is None:
            private = True
        super().init_hf_repo(token=token, private=private)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        """TRL's ``push_to_hub`` (weights, tokenizer, the model card), without the run's traces and episode logs:
        push those to a dataset repository with [`multiagent_rl.data.hub.push_traces`][]."""
        with without_traces():
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """The Trainer's ``save_model``; a folder saved on request (a recipe's ``final_model/``, not a checkpoint)
        gets the model card too, so it is ready to share as it is."""
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():  # a LoRA adapter names its base by Hub id, not the local path it came from
            fix_adapter_base(output_dir or self.args.output_dir, base_model_id(self.experiment.model.name),
                             trained_on=self.experiment.model.name)
            if not _internal_call:
                self.write_model_card(output_dir or self.args.output_dir)
