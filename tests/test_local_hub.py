"""Real Hub client flows (huggingface_hub, datasets, transformers) against the loopback fake in ``_local_hub.py``.

Each test runs inside :func:`hub_env`, which points the in-process clients at a fresh :class:`LocalHub` (and turns
the suite's ``HF_HUB_OFFLINE=1`` off) only for its duration.
"""

import json
import os
import urllib.error
import urllib.request

import pytest
from _local_hub import FAKE_USER, LocalHub, hub_env  # tests/ is on sys.path, as for conftest


@pytest.fixture
def hub(tmp_path):
    with LocalHub() as served, hub_env(served.url, tmp_path / "hf"):
        yield served


def test_dataset_push_and_load(hub):
    import datasets
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    repo_id = f"{FAKE_USER}/rows"
    HfApi().create_repo(repo_id, repo_type="dataset", private=True, exist_ok=True)
    rows = {"prompt": ["a", "bb", "ccc"], "reward": [0.5, -1.0, 2.0], "n": [1, 2, 3]}
    datasets.Dataset.from_dict(rows).push_to_hub(repo_id, private=True)

    back = datasets.load_dataset(repo_id, split="train")
    assert back.to_dict() == rows
    assert {"README.md", "data/train-00000-of-00001.parquet"} <= set(hub.files(repo_id, "dataset"))
    assert HfApi().dataset_info(repo_id).private
    with pytest.raises(RepositoryNotFoundError):  # private: hidden from anonymous callers
        HfApi(token=False).dataset_info(repo_id)
    assert hub.unhandled == []


def test_model_and_tokenizer_push_and_load(hub):
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<unk>", "the", "cat", "sat", "on", "mat"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)

    repo_id, tok_repo_id = f"{FAKE_USER}/tiny-lm", f"{FAKE_USER}/tiny-tok"
    model.push_to_hub(repo_id, private=True)
    # its own repo: next to a Qwen2 config.json, AutoTokenizer would rebuild this word-level vocab as a Qwen2 BPE
    tok.push_to_hub(tok_repo_id)

    loaded = transformers.AutoModelForCausalLM.from_pretrained(repo_id)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    loaded_tok = transformers.AutoTokenizer.from_pretrained(tok_repo_id)
    assert loaded_tok("the cat sat on the mat")["input_ids"] == [2, 3, 4, 5, 2, 6]
    assert hub.is_lfs(repo_id, "model.safetensors")  # *.safetensors is an LFS pattern of the default .gitattributes
    assert hub.unhandled == []


def test_large_file_goes_through_lfs(hub, tmp_path):
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    api = HfApi()
    repo_id = f"{FAKE_USER}/blobs"
    api.create_repo(repo_id, exist_ok=True)
    big = os.urandom(10 * 1024 * 1024 + 4321)  # over the 10 MiB threshold, with a name no LFS pattern matches
    api.upload_file(path_or_fileobj=big, path_in_repo="weights/blob.dat", repo_id=repo_id)
    api.upload_file(path_or_fileobj=b"small text", path_in_repo="notes.txt", repo_id=repo_id)

    assert hub.is_lfs(repo_id, "weights/blob.dat") and not hub.is_lfs(repo_id, "notes.txt")
    assert ("POST", f"/{repo_id}.git/info/lfs/objects/batch") in hub.requests_log
    with open(hf_hub_download(repo_id, "weights/blob.dat"), "rb") as f:
        assert f.read() == big
    folder = snapshot_download(repo_id, local_dir=tmp_path / "snap")
    assert (tmp_path / "snap" / "notes.txt").read_bytes() == b"small text"
    assert os.path.getsize(os.path.join(folder, "weights", "blob.dat")) == len(big)
    assert [f.path for f in api.list_repo_tree(repo_id, recursive=True)] == [
        ".gitattributes", "notes.txt", "weights", "weights/blob.dat"]
    assert hub.unhandled == []


def test_unknown_route_is_a_logged_json_404(hub):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(f"{hub.url}/api/no-such-thing?x=1")
    assert err.value.code == 404
    assert "no route" in json.loads(err.value.read())["error"]
    assert hub.unhandled == [("GET", "/api/no-such-thing?x=1")]


def test_hub_env_restores_everything(tmp_path):
    from huggingface_hub import constants, hf_api

    before = (constants.ENDPOINT, constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, hf_api.api.endpoint,
              os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_ENDPOINT"))
    with LocalHub() as served, hub_env(served.url, tmp_path):
        assert constants.ENDPOINT == served.url and not constants.HF_HUB_OFFLINE
    assert (constants.ENDPOINT, constants.HF_HUB_OFFLINE, constants.HF_HUB_CACHE, hf_api.api.endpoint,
            os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_ENDPOINT")) == before
