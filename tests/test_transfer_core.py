"""A tiny stand-in body offering the body interface (TransferBody), and small task files.

Used by the transfer tests so that the framework is tested without any family's code: an
embedding, then two residual layers that mix each token with its neighbours and the sentence mean
(so that states are contextual, [CLS] sees the sentence, and the layers differ).  ``model_type`` is
set per instance to act as a BERT-like, ELMo-like or word2vec-like body for the support matrix.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch
from torch import nn

from lmforge.families.bert.model import BertPooler
from lmforge.models.base import PretrainedModel


@dataclasses.dataclass
class ToyConfig:
    vocab_size: int = 200
    hidden_size: int = 16
    num_layers: int = 2


class ToyBody(PretrainedModel):
    config_class = ToyConfig
    model_type = "bert"

    def __init__(self, config: ToyConfig, family: str = "bert"):
        super().__init__(config)
        self.model_type = family
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            nn.Linear(4 * config.hidden_size, config.hidden_size) for _ in range(config.num_layers)
        )
        for layer in self.layers:  # small mixing weights: each state stays close to emb + sentence mean
            nn.init.normal_(layer.weight, std=0.05)
        self.calls = 0  # how many times hidden_states ran (the features cache test counts them)
        if family == "bert":  # BERT's tanh pooler where a real BERT has it (fine-tuning reads it by default)
            self.bert = nn.Module()
            self.bert.pooler = BertPooler(config.hidden_size)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def hidden_states(self, input_ids, attention_mask=None, token_type_ids=None):
        self.calls += 1
        h = self.emb(input_ids)  # (B, T, C)
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        h = h * m[..., None]
        out = [h]
        for layer in self.layers:
            left = torch.nn.functional.pad(h, (0, 0, 1, 0))[:, :-1]
            right = torch.nn.functional.pad(h, (0, 0, 0, 1))[:, 1:]
            mean = (h.sum(1, keepdim=True) / m.sum(1)[:, None, None]).expand_as(h)  # sentence context
            h = (h + mean + torch.tanh(layer(torch.cat([left, h, right, mean], -1)))) * m[..., None]
            out.append(h)
        return out

    def transfer_layers(self):
        return [self.emb, *self.layers]


def make_body(tokenizer, family: str = "bert", hidden: int = 32, seed: int = 0) -> ToyBody:
    torch.manual_seed(seed)
    cfg = ToyConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden)
    body = ToyBody(cfg, family)
    body.tokenizer = tokenizer
    body.eval()
    return body


POS = ["good", "great", "fine", "nice", "happy", "love"]
NEG = ["bad", "awful", "poor", "sad", "hate", "terrible"]
FILL = ["the", "movie", "was", "a", "plot", "and", "it", "story", "film", "really"]


def sentiment_rows(n: int, seed: int) -> list[dict]:
    """Synthetic two-class texts: the label is which word list the content word comes from."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 6))]
        words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label == "pos" else NEG))
        rows.append({"text": " ".join(words), "label": label})
    return rows


def pair_rows(n: int, seed: int) -> list[dict]:
    """Pairs whose label is the polarity of the SECOND text (the first one is a distractor)."""
    a, b = sentiment_rows(n, seed), sentiment_rows(n, seed + 1)
    return [{"text": x["text"], "text_pair": y["text"], "label": y["label"]} for x, y in zip(a, b)]


NAMES = ["alice", "bob", "carol"]
PLACES = ["paris", "london", "rome"]


def ner_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(3, 7)):
            r = rng.random()
            if r < 0.2:
                words += [rng.choice(NAMES), "smith"]
                tags += ["B-PER", "I-PER"]
            elif r < 0.35:
                words.append(rng.choice(PLACES))
                tags.append("B-LOC")
            else:
                words.append(rng.choice(FILL))
                tags.append("O")
        out.append((words, tags))
    return out


def qa_examples(n: int, seed: int, pre: tuple[int, int] = (1, 4), post: tuple[int, int] = (0, 0)) -> list[dict]:
    """Questions whose answer is the name after 'by': 'who wrote it' over '<pre words> was written by X
    and <post words>' (the numbers of filler words drawn from the ranges ``pre`` and ``post``)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = rng.choice(NAMES + PLACES)
        before = " ".join(rng.choice(FILL) for _ in range(rng.randint(*pre)))
        after = " ".join(rng.choice(FILL) for _ in range(rng.randint(*post))) or "the film"
        ctx = f"{before} was written by {name} and {after}"
        out.append(
            {
                "id": f"q{i}",
                "question": "who wrote it",
                "context": ctx,
                "answer": name,
                "start": ctx.index(f"by {name}") + 3,
            }
        )
    return out


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_conll(sents, path: Path) -> Path:
    path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(ws, ts)) for ws, ts in sents) + "\n")
    return path


def write_squad(rows: list[dict], path: Path) -> Path:
    paras = [
        {
            "context": r["context"],
            "qas": [
                {
                    "id": r["id"],
                    "question": r["question"],
                    "answers": [{"text": r["answer"], "answer_start": r["start"]}],
                }
            ],
        }
        for r in rows
    ]
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paras}]}))
    return path


def toy_texts() -> list[str]:
    """Text that covers every toy word, for training a toy tokenizer."""
    words = POS + NEG + FILL + NAMES + PLACES + ["smith", "who", "wrote", "written", "by", "."]
    return [" ".join(words)] * 5 + [" ".join(reversed(words))] * 5


def toy_tokenizer():
    """A WordPiece tokenizer of 120 tokens trained on :func:`toy_texts`."""
    from lmforge.tokenization import Tokenizer

    return Tokenizer.train(iter(toy_texts()), kind="wordpiece", vocab_size=120, min_frequency=1)


# ---------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------
import logging  # noqa: E402

import pytest  # noqa: E402

import lmforge.transfer as modes  # noqa: E402
from lmforge.data.tasks import load_task  # noqa: E402
from lmforge.errors import DataError, LmforgeError  # noqa: E402
from lmforge.transfer.config import TransferConfig  # noqa: E402
from lmforge.transfer.specs import SPECS  # noqa: E402


@pytest.fixture(scope="module")
def toy_tok():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def cls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cls")
    return write_jsonl(sentiment_rows(96, 1), d / "train.jsonl"), write_jsonl(sentiment_rows(48, 2), d / "test.jsonl")


# fixed epochs on all 96 examples (val_fraction 0): these test that each mode learns, not the model selection
SETTINGS = {
    "frozen": dict(epochs=30, lr=1e-2, val_fraction=0.0),
    "features": dict(epochs=40),
    "finetune": dict(epochs=15, lr=3e-3, val_fraction=0.0),
}


@pytest.mark.parametrize("mode", ["frozen", "features", "finetune"])
def test_classify_modes_learn_and_write_run(toy_tok, cls_files, tmp_path, mode):
    body = make_body(toy_tok)
    out = tmp_path / "run"
    m = modes.run_transfer(
        body,
        "classify",
        *cls_files,
        mode=mode,
        out_dir=out,
        cache_dir=str(tmp_path / "cache"),
        **SETTINGS[mode],
        seed=0,
    )
    # the label is one word of six per polarity: each mode learns it from the toy's random vectors
    assert m["accuracy"] >= 0.75, m
    assert 0 <= m["macro_f1"] <= 1 and m["n_train"] == 96 and m["n_test"] == 48
    for name in ("metrics.json", "predictions.jsonl", "config.json", "head.safetensors"):
        assert (out / name).is_file()
    assert (out / "body.safetensors").is_file() == (mode == "finetune")
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 48 and {"text", "label", "pred", "probs"} <= set(preds[0])
    assert json.loads((out / "metrics.json").read_text())["accuracy"] == m["accuracy"]


def test_frozen_mode_leaves_body_unchanged(toy_tok, cls_files):
    body = make_body(toy_tok)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    modes.run_transfer(body, "classify", *cls_files, mode="frozen", epochs=2)
    assert all(torch.equal(before[k], v) for k, v in body.state_dict().items())
    assert not any(p.requires_grad for p in body.parameters())


def test_freeze_layers_keeps_lowest_layers(toy_tok, cls_files):
    body = make_body(toy_tok)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    modes.run_transfer(body, "classify", *cls_files, mode="finetune", freeze_layers=0, epochs=2, lr=1e-2)
    after = body.state_dict()
    assert torch.equal(before["emb.weight"], after["emb.weight"])  # item 0: embeddings
    assert not torch.equal(before["layers.0.weight"], after["layers.0.weight"])
    assert not torch.equal(before["layers.1.weight"], after["layers.1.weight"])
    body = make_body(toy_tok)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    modes.run_transfer(body, "classify", *cls_files, mode="finetune", freeze_layers=1, epochs=2, lr=1e-2)
    after = body.state_dict()
    assert torch.equal(before["emb.weight"], after["emb.weight"])
    assert torch.equal(before["layers.0.weight"], after["layers.0.weight"])
    assert not torch.equal(before["layers.1.weight"], after["layers.1.weight"])
    with pytest.raises(LmforgeError, match="too large"):
        modes.run_transfer(make_body(toy_tok), "classify", *cls_files, mode="finetune", freeze_layers=2, epochs=1)


def test_layer_lr_decay_groups(toy_tok):
    body = make_body(toy_tok)
    cfg = TransferConfig(mode="finetune", lr=1.0, layer_lr_decay=0.5)
    run = modes.TransferRun(body, cfg, ["neg", "pos"])
    run.build()
    run.freeze()
    lrs = {g["name"].removesuffix(".no_decay"): g["lr"] for g in run.param_groups(1.0)}
    # body.rest: parameters outside the layer list (the pooler fine-tuning reads) train at the top rate
    assert lrs == {"head": 1.0, "body.0": 0.25, "body.1": 0.5, "body.2": 1.0, "body.rest": 1.0}


def test_features_cache_reused(toy_tok, cls_files, tmp_path, caplog):
    body = make_body(toy_tok)
    kw = dict(mode="features", cache_dir=str(tmp_path / "cache"), epochs=5)
    with caplog.at_level(logging.INFO, logger="lmforge"):
        m1 = modes.run_transfer(body, "classify", *cls_files, **kw)
    calls_first = body.calls
    assert calls_first > 0 and "cached to" in caplog.text
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2  # train and test
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmforge"):
        m2 = modes.run_transfer(body, "classify", *cls_files, **kw)
    assert "reusing cached vectors" in caplog.text
    assert body.calls == calls_first + 1  # only the one probe pass that counts the layers
    assert m1["accuracy"] == m2["accuracy"]
    # other settings -> another cache entry
    modes.run_transfer(body, "classify", *cls_files, **{**kw, "max_len": 16})
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 4


def test_runs_are_deterministic(toy_tok, cls_files):
    a = modes.run_transfer(make_body(toy_tok), "classify", *cls_files, mode="finetune", epochs=2, seed=3)
    b = modes.run_transfer(make_body(toy_tok), "classify", *cls_files, mode="finetune", epochs=2, seed=3)
    assert a["train_loss"] == b["train_loss"] and a["accuracy"] == b["accuracy"]


def test_elmo_like_scalar_mix_reported(toy_tok, cls_files, tmp_path):
    body = make_body(toy_tok, family="elmo")
    m = modes.run_transfer(body, "classify", *cls_files, mode="frozen", epochs=4)
    assert len(m["layer_weights"]) == 3 and abs(sum(m["layer_weights"]) - 1) < 1e-3
    assert m["layer_weights"] != [pytest.approx(1 / 3)] * 3  # the task moved them
    assert "gamma" in m


def test_word2vec_like_bilstm_and_support_matrix(toy_tok, cls_files, tmp_path):
    body = make_body(toy_tok, family="word2vec")
    m = modes.run_transfer(
        body,
        "classify",
        *cls_files,
        mode="features",
        classifier="bilstm",
        head_hidden=16,
        epochs=10,
        lr=1e-2,
        val_fraction=0.0,
        cache_dir=str(tmp_path),
    )
    assert m["accuracy"] >= 0.85
    for mode in ("frozen", "finetune"):  # word vectors serve every mode
        assert "accuracy" in modes.run_transfer(make_body(toy_tok, family="word2vec"), "classify", *cls_files,
                                                mode=mode, epochs=1)
    with pytest.raises(LmforgeError, match="elmo models support"):
        modes.run_transfer(make_body(toy_tok, family="elmo"), "classify", *cls_files, mode="finetune")


def test_pair_task_plain_and_bert(toy_tok, tmp_path):
    tr = write_jsonl(pair_rows(128, 5), tmp_path / "tr.jsonl")
    te = write_jsonl(pair_rows(64, 6), tmp_path / "te.jsonl")
    # ELMo-like: two means combined as [a, b, |a-b|, a*b]
    run = modes.TransferRun(
        make_body(toy_tok, family="elmo"), TransferConfig(task="pair", mode="features"), ["neg", "pos"]
    )
    assert run.pair_rows and run.build().head.out.in_features == 4 * 32
    m = modes.run_transfer(
        make_body(toy_tok, family="elmo"), "pair", tr, te, mode="features", epochs=30, cache_dir=str(tmp_path / "c")
    )
    assert m["accuracy"] >= 0.75, m
    m = modes.run_transfer(make_body(toy_tok), "pair", tr, te, mode="finetune", epochs=2)
    assert set(m) >= {"accuracy", "macro_f1"}


def test_token_task(toy_tok, tmp_path):
    tr = write_conll(ner_sentences(80, 1), tmp_path / "train.conll")
    te = write_conll(ner_sentences(30, 2), tmp_path / "test.conll")
    out = tmp_path / "run"
    m = modes.run_transfer(make_body(toy_tok), "tokens", tr, te, mode="finetune", epochs=10, lr=5e-3, out_dir=out)
    assert m["token_accuracy"] > 0.9 and m["entity_f1"] > 0.8, m
    rec = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
    assert len(rec["pred"]) == len(rec["words"]) == len(rec["tags"])


def test_token_labels_first_subtoken_only(toy_tok):
    run = modes.TransferRun(make_body(toy_tok), TransferConfig(task="tokens"), ["B-PER", "I-PER", "O"])
    from lmforge.data.tasks import TokensExample

    ex = TokensExample(["alice", "smithsmith", "paris"], ["B-PER", "I-PER", "O"])
    enc = run.fmt.encode_words(ex.words)
    n_pieces = len(toy_tok.encode("smithsmith"))
    assert n_pieces > 1
    # [CLS] alice smithsmith(n pieces) paris [SEP]: rows at the first piece of each word
    assert enc.input_ids[0] == toy_tok.cls_id and enc.rows == [1, 2, 2 + n_pieces]
    assert len(enc.input_ids) == 2 + n_pieces + len(toy_tok.encode("paris")) + 1
    enc.example = 0
    data = modes.TaskData("tokens", [ex], run.labels)
    y = SPECS["tokens"].batch(SPECS["tokens"].prepare(data, [enc], run.fmt, run.label_index), [[0]])
    assert y.tolist() == [[0, 1, 2]]  # one label per word; the other pieces are no row, so no label


def test_qa_task(toy_tok, tmp_path):
    tr = write_squad(qa_examples(64, 1), tmp_path / "train.json")
    te = write_squad(qa_examples(32, 2), tmp_path / "test.json")
    out = tmp_path / "run"
    m = modes.run_transfer(make_body(toy_tok), "qa", tr, te, mode="finetune", epochs=12, lr=5e-3, out_dir=out)
    assert m["exact_match"] >= 0.8 and m["f1"] >= m["exact_match"], m


def test_bad_data_one_line_errors(toy_tok, tmp_path, cls_files):
    p = tmp_path / "bad.csv"
    p.write_text("text,lab\nhello,pos\n")
    with pytest.raises(DataError, match="missing column 'label'"):
        load_task(p, "classify")
    unk = write_jsonl([{"text": "good", "label": "neutral"}], tmp_path / "unk.jsonl")
    with pytest.raises(DataError, match=r"label\(s\) \['neutral'\]"):
        modes.run_transfer(make_body(toy_tok), "classify", cls_files[0], unk, mode="frozen", epochs=1)
    with pytest.raises(DataError, match="not found"):
        load_task(tmp_path / "nope.jsonl", "classify")
    conll = tmp_path / "x.conll"
    conll.write_text("alice PERSON\nsmith I-PER\n")
    with pytest.raises(DataError, match="is not BIO"):
        load_task(conll, "tokens")
