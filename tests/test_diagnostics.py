"""The pretraining diagnostics: ``token_cos`` (top-layer token-vector collapse) and ELECTRA's ``rtd_auc``, on
constructed inputs, in each family's validation forward (and never in the training one), in validation's
averaging, and from ``lmforge pretrain`` to the model card."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from lmforge.cli import main
from lmforge.families.bert.model import BertConfig, BertForPreTraining
from lmforge.families.electra.model import ElectraConfig, ElectraForPreTraining, _detector_diagnostics
from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig
from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
from lmforge.models.base import ModelOutput
from lmforge.nn.diagnostics import roc_auc, token_cosine
from lmforge.storage.card_diagnostics import diagnostics_section
from lmforge.train.config import TrainConfig
from lmforge.train.distributed import init_distributed
from lmforge.train.evaluation import evaluate

V = 97


# -- the measures on constructed inputs ------------------------------------------------------------------------
def test_token_cosine_is_one_for_identical_and_zero_for_orthogonal_vectors():
    torch.manual_seed(0)
    same = torch.randn(1, 1, 16).expand(3, 5, 16)  # every token of every row the same vector
    assert token_cosine(same).item() == pytest.approx(1.0, abs=1e-6)
    scaled = same * torch.arange(1.0, 6.0)[None, :, None]  # lengths do not matter, directions do
    assert token_cosine(scaled).item() == pytest.approx(1.0, abs=1e-6)
    eye = torch.eye(8)[None]  # 8 orthogonal tokens
    assert token_cosine(eye).item() == pytest.approx(0.0, abs=1e-7)
    # a second row alternating two orthogonal directions: of its 8 x 7 ordered pairs, 2 x 4 x 3 are alike
    two = -eye[:, :2].repeat(1, 4, 1)
    assert token_cosine(torch.cat([eye, two])).item() == pytest.approx((0.0 + 24 / 56) / 2, abs=1e-6)


def test_token_cosine_is_the_mean_pairwise_cosine_of_each_row_without_padding():
    torch.manual_seed(1)
    h = torch.randn(4, 7, 12) + 0.5  # a shared direction, as trained encoders have
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0  # a row of one token: no pair, not counted
    h[1, 4:] = 100.0  # padding vectors must not count
    want = []
    for b in range(4):
        x = h[b, mask[b].bool()]
        n = len(x)
        if n < 2:
            continue
        cos = torch.nn.functional.cosine_similarity(x[:, None], x[None, :], dim=-1)
        want.append(float((cos.sum() - cos.diagonal().sum()) / (n * (n - 1))))
    assert len(want) == 3
    assert token_cosine(h, mask).item() == pytest.approx(sum(want) / 3, abs=1e-5)
    assert token_cosine(h.bfloat16(), mask).dtype == torch.float32
    assert math.isnan(token_cosine(h, torch.zeros(4, 7)).item())  # no row with two tokens: undefined


def test_roc_auc_on_known_rankings_and_as_sklearn_counts_ties():
    labels = torch.tensor([0, 0, 1, 1, 0, 1], dtype=torch.bool)
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9, 0.3, 0.7]), labels).item() == 1.0
    assert roc_auc(-torch.tensor([0.1, 0.2, 0.8, 0.9, 0.3, 0.7]), labels).item() == 0.0
    assert roc_auc(torch.zeros(6), labels).item() == 0.5  # one score for all: chance
    # 3 positives x 3 negatives: positive 0.5 ties negative 0.5 (half), beats 0.1 and 0.2 -> (2 + 0.5 + 3 + 3) / 9
    assert roc_auc(torch.tensor([0.1, 0.2, 0.5, 0.9, 0.5, 0.7]), labels).item() == pytest.approx(8.5 / 9)
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.random(300) < 0.2
        s = np.round(rng.normal(size=300) + y, 1)  # rounded: many ties
        assert roc_auc(torch.from_numpy(s), torch.from_numpy(y)).item() == pytest.approx(roc_auc_score(y, s), abs=1e-6)
    assert math.isnan(roc_auc(torch.rand(5), torch.zeros(5, dtype=torch.bool)).item())  # no positive


def test_rtd_auc_leaves_out_cls_and_sep():
    """A detector that ranks replaced tokens above ordinary originals but scores [CLS]/[SEP] highest of all:
    1.0 over the tokens the recipe could mask; counting the specials would pull it down."""
    original = torch.tensor([[2, 10, 11, 12, 13, 3, 0], [2, 14, 15, 3, 16, 3, 0]])  # 2 = [CLS], 3 = [SEP], 0 = pad
    real = original != 0
    replaced = torch.zeros_like(real)
    replaced[0, 2] = replaced[1, 4] = True
    logits = replaced.float() + 5.0 * ((original == 2) | (original == 3))  # specials score 5, replaced 1
    h = torch.randn(2, 7, 8)
    out = _detector_diagnostics(h, logits, replaced, original, real)
    assert out["rtd_auc"].item() == 1.0
    assert roc_auc(logits[real], replaced[real]).item() < 0.8  # with the specials counted
    assert out["token_cos"].item() == pytest.approx(token_cosine(h, real).item())


# -- in each family's validation forward, and never in the training one --------------------------------------
def _mlm_batch(B: int = 3, T: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    pick = torch.rand(B, T, generator=g) < 0.15
    pick[:, 0] = pick[:, -1] = False
    pick[0, 5] = True
    mask = torch.ones(B, T, dtype=torch.long)
    mask[2, 12:] = 0
    ids[2, 11] = 3
    ids[2, 12:] = 0
    pick[2, 11:] = False
    return dict(input_ids=torch.where(pick, torch.full_like(ids, 4), ids), attention_mask=mask,
                labels=torch.where(pick, ids, torch.full_like(ids, -100)))


def test_bert_validation_reads_the_full_top_layer_with_the_same_loss():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                     max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                     next_sentence=False)
    model = BertForPreTraining(cfg)
    batch = _mlm_batch()
    with torch.no_grad():
        train = model.train()(**batch)  # the sparse top layer (15 % of the positions), no diagnostic
        val = model.eval()(**batch)
        h = model.bert(batch["input_ids"], batch["attention_mask"])
    assert "token_cos" not in train.metrics
    torch.testing.assert_close(val.loss, train.loss, rtol=1e-6, atol=1e-6)
    assert val.metrics["token_cos"].item() == pytest.approx(token_cosine(h, batch["attention_mask"]).item())


def test_electra_validation_reports_token_cos_and_rtd_auc_without_drawing_random_numbers():
    torch.manual_seed(0)
    cfg = ElectraConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = ElectraForPreTraining(cfg)
    batch = _mlm_batch()
    batch["sample_noise"] = torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        train = model.train()(**batch)
        state = torch.get_rng_state()
        val = model.eval()(**batch)
        assert torch.equal(torch.get_rng_state(), state)
        h = model.electra(val.discriminator_input, batch["attention_mask"])
    assert not {"token_cos", "rtd_auc"} & set(train.metrics)
    torch.testing.assert_close(val.loss, train.loss)
    real = batch["attention_mask"].bool()
    original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
    ordinary = real & (original > 3)  # text tokens, not [CLS]/[SEP] (whatever the generator put there)
    assert val.replaced[ordinary].any()
    want = roc_auc(val.logits[ordinary], val.replaced[ordinary])
    assert val.metrics["rtd_auc"].item() == pytest.approx(want.item())
    assert val.metrics["token_cos"].item() == pytest.approx(token_cosine(h, real).item(), abs=1e-6)


def test_gpt_and_elmo_validation_report_token_cos():
    torch.manual_seed(0)
    ids = torch.randint(0, V, (2, 12))
    gpt = GPTLMHeadModel(GPTConfig(vocab_size=V, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    elmo = ElmoBiLM(ElmoConfig(vocab_size=V, token_encoder="word", projection_dim=16, cell_size=32, num_layers=1))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        assert not gpt.train()(ids, labels=ids).metrics
        out = gpt.eval()(ids, labels=ids)
        top = gpt(ids, output_hidden_states=True).hidden_states[-1]
        assert out.metrics["token_cos"].item() == pytest.approx(token_cosine(top).item(), abs=1e-6)
        assert "token_cos" not in elmo.train()(ids, mask, labels=ids).metrics
        got = elmo.eval()(ids, mask, labels=ids).metrics["token_cos"].item()
        layers = elmo.hidden_states(ids, mask)
    assert got == pytest.approx(token_cosine(layers[-1], mask).item(), abs=1e-5)


# -- validation's averaging: a metric a batch cannot define ----------------------------------------------------
class _Sometimes(nn.Module):
    """Loss = the batch's mean id; ``odd`` = the same, defined (not NaN) only when the first id is odd."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        v = x.double().mean().float()
        return ModelOutput(loss=v + self.w, metrics={"odd": torch.where(x[0, 0] % 2 == 1, v, float("nan"))})


class _Recorder:
    def __init__(self):
        self.seen = []

    def batch(self, rngs, split):
        x = torch.tensor([[int(r.integers(0, 100)) for _ in range(3)] for r in rngs])
        self.seen.append(x)
        return {"x": x}


def test_validation_averages_a_metric_over_the_batches_that_define_it():
    sampler = _Recorder()
    cfg = TrainConfig(batch_size=2, eval_batches=8, device="cpu", precision="fp32")
    val = evaluate(_Sometimes(), sampler, cfg, init_distributed("cpu"), torch.device("cpu"))
    means = [float(x.double().mean()) for x in sampler.seen]
    odd = [m for m, x in zip(means, sampler.seen) if x[0, 0] % 2 == 1]
    assert 0 < len(odd) < len(means)
    assert val["loss"] == pytest.approx(sum(means) / len(means), rel=1e-6)
    assert val["odd"] == pytest.approx(sum(odd) / len(odd), rel=1e-6)


# -- from lmforge pretrain to the model card -------------------------------------------------------------------
def test_pretrain_logs_the_diagnostics_and_the_card_shows_them(wordpiece_shards, tmp_path):
    out = tmp_path / "bert"
    assert main(["-q", "pretrain", "bert", "--data", str(wordpiece_shards), "--out", str(out), "--config", "tiny",
                 "--precision", "fp32", "--set", "max_steps=2", "max_seq_length=32", "max_position_embeddings=64",
                 "batch_size=2", "eval_batches=1", "warmup_steps=1", "eval_every=1", "save_every=0"]) == 0
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    val = [e for e in events if e["split"] == "val"]
    assert [e["step"] for e in val] == [1, 2] and all(0.0 < e["metrics"]["token_cos"] < 1.0 for e in val)
    assert not any("token_cos" in e["metrics"] for e in events if e["split"] == "train")
    card = (out / "README.md").read_text()
    assert "## Pretraining diagnostics" in card
    assert f"| `token_cos` | {val[-1]['metrics']['token_cos']:.3f} |" in card and "rtd_auc" not in card


def test_the_card_section_reads_the_final_metrics():
    text = diagnostics_section({"loss": 3.0, "token_cos": 0.8412, "rtd_auc": 0.5})
    assert "| `token_cos` | 0.841 |" in text and "| `rtd_auc` | 0.500 |" in text and "coin toss" in text
    assert diagnostics_section({"loss": 3.0, "ppl": 20.1}) == ""
