"""A new family is one Family object: a toy family defined in this file, registered with
:func:`lmforge.families.register`, is pretrained by the real driver on real shards, transferred in the frozen
and features modes, and served, with no other change to lmforge (docs/architecture.md, "How to add a family")."""

from __future__ import annotations

import dataclasses
import json
import random
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.data.samplers import CausalWindowSampler
from lmforge.errors import ConfigError, LmforgeError
from lmforge.families import FAMILIES, Family, folder_family, load, register
from lmforge.models.base import ModelOutput, PretrainedModel
from lmforge.storage.cards import FamilyCard, read_card_meta
from lmforge.train.pretrain import default_train_config, preset_config, pretrain
from lmforge.transfer import load_run, run_transfer


@dataclasses.dataclass
class PrefixConfig:
    vocab_size: int = 64
    hidden_size: int = 16
    seq_len: int = 16


class PrefixLM(PretrainedModel):
    """A causal LM of two layers: token embeddings, then the running mean of the prefix through a tanh mix."""

    config_class = PrefixConfig
    model_type = "prefixlm"
    embed_causal = True

    def __init__(self, config: PrefixConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mix = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def layer_names(self) -> list[str]:
        return ["emb", "mix"]

    def embed_window(self) -> int:
        return self.config.seq_len

    def transfer_layers(self) -> list[nn.Module]:
        return [self.wte, self.mix]

    def hidden_states(self, input_ids, attention_mask=None, token_type_ids=None) -> list[torch.Tensor]:
        x = self.wte(input_ids)  # (B, T, C)
        steps = torch.arange(1, x.shape[1] + 1, device=x.device).view(1, -1, 1)
        prefix = x.cumsum(dim=1) / steps  # (B, T, C): the mean of the tokens up to each position
        return [x, torch.tanh(self.mix(torch.cat([x, prefix], dim=-1)))]

    def forward(self, input_ids, labels=None, attention_mask=None) -> ModelOutput:
        logits = self.head(self.hidden_states(input_ids)[-1])  # (B, T, V)
        loss, metrics = None, {}
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
            metrics = {"lm_loss": loss.detach()}
        return ModelOutput(loss=loss, logits=logits, metrics=metrics)


class PrefixFamily(Family):
    """The whole family: its facts, its classes, its presets and its pretraining setup."""

    name, label = "prefixlm", "PrefixLM"
    transfer_modes = ("frozen", "features")
    card = FamilyCard("PrefixLM", "feature-extraction", "testing that a family is one object")
    model_class, config_class = PrefixLM, PrefixConfig

    def preset_module(self):
        return types.SimpleNamespace(
            PRESETS={"tiny": {"hidden_size": 32, "seq_len": 16}}, DEFAULT_PRESET="tiny",
            TRAIN_DEFAULTS={"lr": 1e-2, "batch_size": 8, "warmup_steps": 1, "eval_batches": 2, "eval_every": 10,
                            "save_every": 0, "log_every": 10, "device": "cpu"})

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        shards.check_tokenizer(tokenizer)
        config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
        torch.manual_seed(0)
        model = PrefixLM(config)
        model.tokenizer = tokenizer
        return model, CausalWindowSampler(shards, config.seq_len)


POS = ["good", "great", "fine", "nice", "happy", "love"]
NEG = ["bad", "awful", "poor", "sad", "hate", "terrible"]
FILL = ["the", "name", "of", "a", "python", "and", "it", "is", "in", "language"]


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILL) for _ in range(rng.randint(1, 3))]
        words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label == "pos" else NEG))
        out.append({"text": " ".join(words), "label": label})
    return out


@pytest.fixture(scope="module")
def family():
    with register(PrefixFamily()) as fam:
        yield fam
    assert "prefixlm" not in FAMILIES  # leaving the block takes it out again


@pytest.fixture(scope="module")
def pretrained(family, bpe_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("prefixlm") / "model"
    result = pretrain("prefixlm", bpe_shards, out, preset_config("prefixlm"),
                      default_train_config("prefixlm", max_steps=30, seed=0))
    return out, result


def test_register_refuses_a_taken_name_and_undo_restores_the_registry():
    before = dict(FAMILIES)
    other = type("Other", (PrefixFamily,), {"name": "bert"})()
    with pytest.raises(ConfigError, match="already registered"):
        register(other)
    reg = register(other, replace=True)
    assert FAMILIES["bert"].label == "PrefixLM"
    reg.undo()
    assert FAMILIES == before and list(FAMILIES) == list(before)


def test_the_driver_pretrains_the_toy_family(pretrained):
    out, result = pretrained
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in evals if e.get("split") == "val"]
    assert len(losses) >= 2 and losses[-1] < losses[0]  # it learned from the shards
    assert folder_family(out).name == "prefixlm"
    model = load(out)
    assert isinstance(model, PrefixLM) and model.tokenizer is not None
    meta = read_card_meta(out)  # the card's facts are the family's
    assert meta["lmforge"]["family"] == "prefixlm" and meta["pipeline_tag"] == "feature-extraction"
    assert "a PrefixLM model pretrained with lmforge" in (out / "README.md").read_text()


@pytest.mark.parametrize("mode,options", [("frozen", {"epochs": 200}), ("features", {})])
def test_the_toy_family_transfers(pretrained, tmp_path, mode, options):
    model_dir, _ = pretrained
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    for path, n, seed in ((train, 96, 1), (test, 48, 2)):
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(n, seed)))
    metrics = run_transfer(model_dir, "classify", train, test, mode=mode, out_dir=tmp_path / "run", max_len=16,
                           seed=0, cache_dir=str(tmp_path / "cache"), **options)
    assert metrics["family"] == "prefixlm" and metrics["n_test"] == 48
    majority = max(sum(r["label"] == "pos" for r in _rows(48, 2)), sum(r["label"] == "neg" for r in _rows(48, 2)))
    # the polarity word is in every text: the mean of its vectors finds it, well above always saying one label
    assert metrics["accuracy"] >= majority / 48 + 0.1
    run = load_run(tmp_path / "run")
    assert isinstance(run.body, PrefixLM)
    torch.testing.assert_close(run.body.wte.weight, load(model_dir).wte.weight, rtol=0, atol=0)  # the body kept
    with pytest.raises(LmforgeError, match="support --mode frozen / features, not finetune"):
        run_transfer(model_dir, "classify", train, test, mode="finetune", max_len=16)


def test_the_toy_family_is_served(pretrained, tmp_path):
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app

    model_dir, _ = pretrained
    texts = ["the python is a good language", "it is sad"]
    with TestClient(create_app([model_dir])) as client:
        listed = client.get("/v1/models").json()
        r = client.post("/v1/embed", json={"model": "model", "texts": texts}).json()
        refused = client.post("/v1/fill-mask", json={"model": "model", "text": "the [MASK] ."})
    (entry,) = listed["data"]
    assert entry["family"] == "prefixlm" and "embed" in entry["supports"] and entry["contextual"]
    assert not {"fill-mask", "generate"} & set(entry["supports"])  # what the family's facts allow
    want = load(model_dir).embed(texts)
    for got, tl in zip(r["results"], want):
        assert got["tokens"] == tl.tokens
        np.testing.assert_allclose(np.array(got["vectors"]), tl.layers.float().numpy(), atol=1e-5)
    assert refused.status_code == 400 and "fill-mask needs a BERT or ELECTRA model" in refused.text
