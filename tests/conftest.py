import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """The embedded tiny model and tokenizer (built once per machine, loaded once per session)."""
    from multiagent_rl.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny")
    return model.eval(), tok


@pytest.fixture
def backend(tiny):
    from multiagent_rl.backends import TransformersBackend

    model, tok = tiny
    return TransformersBackend(model, tok, model_id="tiny")
