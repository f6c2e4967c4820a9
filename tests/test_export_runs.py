"""``lmforge export-hf RUN_DIR OUT``: fine-tuned runs as HF task models whose ``transformers`` pipelines
predict what the run predicts (tiny random BERT / GPT bodies trained for a few steps)."""

from __future__ import annotations

import json
import os
import random
import shlex

import pytest
import torch

from lmforge.cli import main
from lmforge.data.tasks import QAExample, TaskData, TextExample, TokensExample
from lmforge.errors import LmforgeError
from lmforge.families.gpt.runs import bias_into_ln_f
from lmforge.interop.runs import check_exportable
from lmforge.transfer import load_run, run_transfer
from lmforge.transfer.encoding import join_words

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402

POS = ["good", "great", "fine", "happy", "love"]
NEG = ["bad", "awful", "poor", "sad", "hate"]
FILL = ["the", "name", "of", "a", "python", "and", "it", "is", "in", "language"]
NAMES = ["moses", "aaron", "david"]
TOL = 1e-4


def texts(n: int, seed: int, pair: bool = False) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg", "mid"])
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 5))]
        if label != "mid":
            words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label == "pos" else NEG))
        row = {"text": " ".join(words), "label": label}
        if pair:
            row["text_pair"] = " ".join(rng.choice(FILL) for _ in range(rng.randint(1, 4)))
        out.append(row)
    return out


def write_jsonl(rows: list[dict], path):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def as_data(rows: list[dict], task: str = "classify") -> TaskData:
    return TaskData(task, [TextExample(r["text"], r.get("text_pair"), r["label"]) for r in rows], ["mid", "neg", "pos"])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_jsonl(texts(60, 1), d / "train.jsonl")
    write_jsonl(texts(60, 3, pair=True), d / "pair.jsonl")
    return d


def train(model_dir, task, train_path, out, **opts):
    opts.setdefault("cache_dir", str(out.parent / "cache"))
    opts.setdefault("max_len", 32)
    run_transfer(str(model_dir), task, train_path, train_path, out_dir=out, seed=0, **opts)
    return out


def export(run_dir, out) -> None:
    assert main(["export-hf", str(run_dir), "--out", str(out)]) == 0


def check_classify(run_dir, out, rows, pair=False):
    run = load_run(run_dir)
    # one text at a time, as the pipeline reads them: no padding on either side (a features-mode logistic
    # regression on a random tiny body has weights in the thousands, which magnify float32 noise of padding)
    ours = [run.predict(as_data([r]), use_cache=False)[0] for r in rows]
    pipe = transformers.pipeline("text-classification", model=str(out), top_k=None, device="cpu")
    inputs = [{"text": r["text"], "text_pair": r["text_pair"]} if pair else r["text"] for r in rows]
    theirs = [pipe(x) for x in inputs]
    for p, t in zip(ours, theirs):
        t = t[0] if isinstance(t[0], list) else t  # one input: a list of {label, score} (in a list)
        probs = {d["label"]: d["score"] for d in t}
        assert set(probs) == set(p["probs"])
        assert max(abs(probs[k] - v) for k, v in p["probs"].items()) < TOL
        assert max(probs, key=probs.get) == p["label"]
    return run


def test_bert_classify_finetune_pooler(bert_dir, data_dir, tmp_path):
    run_dir = train(bert_dir, "classify", data_dir / "train.jsonl", tmp_path / "run", mode="finetune", epochs=3,
                    lr=2e-3, pool="pooler")
    out = tmp_path / "hf"
    export(run_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["id2label"] == {"0": "mid", "1": "neg", "2": "pos"} and cfg["label2id"]["pos"] == 2
    _, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    run = check_classify(run_dir, out, texts(12, 5))
    # the fine-tuned body went out, not the pretrained one
    hf = transformers.BertForSequenceClassification.from_pretrained(out)
    emb = run.body.bert.embeddings.word_embeddings.weight
    assert torch.equal(hf.bert.embeddings.word_embeddings.weight, emb.detach())
    assert "text-classification" in (out / "README.md").read_text()


def test_bert_features_pair_folds_the_standardisation(bert_dir, data_dir, tmp_path):
    # features mode with a torch head: the head standardises its inputs (mean, std of the training vectors)
    run_dir = train(bert_dir, "pair", data_dir / "pair.jsonl", tmp_path / "run", mode="features", pool="pooler",
                    classifier="linear", epochs=5)
    run = load_run(run_dir)
    head = run.model.head
    assert not torch.allclose(head.feat_std, torch.ones_like(head.feat_std))  # non-identity
    assert not torch.allclose(head.feat_mean, torch.zeros_like(head.feat_mean))
    export(run_dir, tmp_path / "hf")
    check_classify(run_dir, tmp_path / "hf", texts(12, 6, pair=True), pair=True)
    # features + scikit-learn's logistic regression (the features default classifier), on [CLS] through the pooler
    run_dir = train(bert_dir, "classify", data_dir / "train.jsonl", tmp_path / "logreg", mode="features",
                    pool="pooler")
    assert json.loads((run_dir / "config.json").read_text())["transfer"]["mode"] == "features"
    export(run_dir, tmp_path / "hf2")
    check_classify(run_dir, tmp_path / "hf2", texts(12, 6))


def test_bert_tokens(bert_dir, tmp_path):
    rng = random.Random(0)
    sents = []
    for _ in range(30):
        words = [rng.choice(NAMES) if rng.random() < 0.3 else rng.choice(FILL) for _ in range(rng.randint(3, 6))]
        sents.append((words, ["B-PER" if w in NAMES else "O" for w in words]))
    conll = tmp_path / "t.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in sents) + "\n")
    run_dir = train(bert_dir, "tokens", conll, tmp_path / "run", mode="finetune", epochs=3, lr=5e-3)
    out = tmp_path / "hf"
    export(run_dir, out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForTokenClassification"]
    run = load_run(run_dir)
    test = [["moses", "is", "in", "the", "language"], ["a", "pythonic", "david"]]  # "pythonic": two pieces
    data = TaskData("tokens", [TokensExample(w, ["O"] * len(w)) for w in test], run.labels)
    encs = run.encode(data)
    ours = run._logits(data, encs)  # (words, K) at each word's first sub-token
    preds = run.predict(data)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForTokenClassification.from_pretrained(out).eval()
    pipe = transformers.pipeline("token-classification", model=str(out), aggregation_strategy="none",
                                 ignore_labels=[], device="cpu")
    assert any(len(e.rows) < len(e.input_ids) - 2 for e in encs)  # some word has more than one sub-token
    for words, enc, lg, pred in zip(test, encs, ours, preds):
        text, _ = join_words(words)
        batch = hf_tok(text, return_tensors="pt")
        assert batch["input_ids"][0].tolist() == enc.input_ids
        with torch.no_grad():
            probs = torch.softmax(hf(**batch).logits[0].double(), -1)[enc.rows]  # first sub-tokens
        assert (probs - torch.softmax(lg.double(), -1)).abs().max() < TOL
        by_index = {e["index"]: e for e in pipe(text)}
        for w, r in enumerate(enc.rows):
            assert by_index[r]["entity"] == pred["tags"][w]
            assert abs(by_index[r]["score"] - float(probs[w].max())) < TOL


def test_bert_qa(bert_dir, tmp_path):
    rng = random.Random(1)
    paras = []
    for i in range(40):
        name = rng.choice(NAMES)
        ctx = f"{' '.join(rng.choice(FILL) for _ in range(rng.randint(1, 4)))} was written by {name} and the language"
        qa = {"id": f"q{i}", "question": "who wrote it",
              "answers": [{"text": name, "answer_start": ctx.index(f"by {name}") + 3}]}
        paras.append({"context": ctx, "qas": [qa]})
    squad = tmp_path / "q.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paras}]}))
    run_dir = train(bert_dir, "qa", squad, tmp_path / "run", mode="finetune", epochs=4, lr=5e-3, max_len=48)
    out = tmp_path / "hf"
    export(run_dir, out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    run = load_run(run_dir)
    examples = [QAExample(f"q{k}", "who wrote it", p["context"], []) for k, p in enumerate(paras[:6])]
    data = TaskData("qa", examples, [])
    encs = run.encode(data)
    ours = run._logits(data, encs)
    preds = run.predict(data)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
    assert len(encs) == len(examples)  # one window each
    for ex, enc, lg, pred in zip(examples, encs, ours, preds):
        batch = hf_tok(ex.question, ex.context, return_tensors="pt", return_offsets_mapping=True)
        offsets = batch.pop("offset_mapping")[0].tolist()
        assert batch["input_ids"][0].tolist() == enc.input_ids
        with torch.no_grad():
            o = hf(**batch)
        assert (o.start_logits[0] - lg[:, 0]).abs().max() < TOL
        assert (o.end_logits[0] - lg[:, 1]).abs().max() < TOL
        # transformers 5 has no question-answering pipeline: decode the HF way (best start + end score over
        # context spans of at most max_answer_tokens, the text between their character offsets)
        ctx = [i for i, s in enumerate(batch.sequence_ids(0)) if s == 1]
        best = max(((s, e) for s in ctx for e in ctx if 0 <= e - s < run.cfg.max_answer_tokens),
                   key=lambda se: float(o.start_logits[0, se[0]] + o.end_logits[0, se[1]]))
        assert ex.context[offsets[best[0]][0] : offsets[best[1]][1]] == pred["answer"]
    assert sum(p["answer"] in NAMES for p in preds) >= 3  # it learned something: the comparison is not vacuous


def check_gpt_ids(run, out, rows, pair=False):
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    for r in rows:
        enc = run.fmt.encode_text(r["text"], r.get("text_pair"))
        ids = hf_tok(r["text"], r["text_pair"])["input_ids"] if pair else hf_tok(r["text"])["input_ids"]
        assert ids == enc.input_ids and ids[-1] == run.task_token_ids[2]


def test_gpt_classify_finetune(gpt_dir, data_dir, tmp_path):
    run_dir = train(gpt_dir, "classify", data_dir / "train.jsonl", tmp_path / "run", mode="finetune", epochs=3,
                    lr=2e-3)
    run = load_run(run_dir)
    assert run.model.head.out.bias.abs().max() > 0  # a bias that must move into ln_f
    out = tmp_path / "hf"
    export(run_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["GPT2ForSequenceClassification"]
    assert cfg["pad_token_id"] == run.body.tokenizer.eot_id and cfg["vocab_size"] == run.body.tokenizer.vocab_size + 3
    hf, info = transformers.GPT2ForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not torch.equal(hf.transformer.ln_f.bias, run.body.ln_f.bias.detach())  # the bias moved
    rows = texts(12, 7)
    check_gpt_ids(run, out, rows)
    check_classify(run_dir, out, rows)


def test_gpt_pair_frozen_task_rows(gpt_dir, data_dir, tmp_path):
    run_dir = train(gpt_dir, "pair", data_dir / "pair.jsonl", tmp_path / "run", mode="frozen", epochs=3, lr=1e-2,
                    layer=-1)  # the top layer: a ScalarMix (frozen mode's default) has no HF class
    assert (run_dir / "task_tokens.safetensors").is_file()
    run = load_run(run_dir)
    out = tmp_path / "hf"
    export(run_dir, out)
    hf = transformers.GPT2ForSequenceClassification.from_pretrained(out)
    V = run.body.tokenizer.vocab_size
    assert torch.equal(hf.transformer.wte.weight[V:], run.body.wte.weight[V:].detach())  # the trained task rows
    rows = texts(10, 8, pair=True)
    check_gpt_ids(run, out, rows, pair=True)
    check_classify(run_dir, out, rows, pair=True)


def test_bias_into_ln_f_is_exact_or_refused():
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    delta = bias_into_ln_f(W, b)
    assert (W @ delta - b).abs().max() < 1e-12
    W2 = torch.cat([W, W[:1] + W[1:2]])  # a dependent row whose bias does not follow
    with pytest.raises(LmforgeError, match="cannot move into ln_f exactly"):
        bias_into_ln_f(W2, torch.cat([b, b[:1]]))
    with pytest.raises(LmforgeError, match="cannot move into ln_f exactly"):
        bias_into_ln_f(torch.randn(9, 4, generator=g, dtype=torch.float64), torch.randn(9, generator=g,
                                                                                       dtype=torch.float64))


def test_what_cannot_map_is_refused_in_one_line(bert_dir, data_dir, tmp_path, capsys):
    run_dir = train(bert_dir, "classify", data_dir / "train.jsonl", tmp_path / "run", mode="frozen", layer=-1,
                    epochs=1)
    base = json.loads((run_dir / "config.json").read_text())
    assert base["pool"] == "mean"  # frozen mode's single-text default (fine-tuning reads the pooler and exports)
    assert main(["export-hf", str(run_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--pool pooler" in err and "Traceback" not in err
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    # the refusal names the command that retrains the run in a form that exports; as given, it works
    retrain = err.split("exports: ", 1)[1].split(" (TRAIN", 1)[0]
    assert retrain.startswith("lmforge finetune ") and f"--config {run_dir}/config.json" in retrain
    argv = shlex.split(retrain.replace("TRAIN", str(data_dir / "train.jsonl")).replace("TEST", str(data_dir /
                                                                                                  "train.jsonl")))
    assert main(argv[1:] + ["--cache-dir", str(tmp_path / "cache")]) == 0
    export(tmp_path / "run-retrained", tmp_path / "hf")
    assert err.endswith(f"then lmforge export-hf {run_dir}-retrained --out OUT")

    def refusal(**change) -> str:
        data = json.loads(json.dumps(base))
        data["transfer"].update(change.pop("transfer", {}))
        data.update(change)
        with pytest.raises(LmforgeError) as e:
            check_exportable(data)
        return str(e.value)

    assert "--pool pooler" in refusal(pool="mean")
    # a key lmforge no longer has: the ordinary unknown-key error, as everywhere a run's settings are read
    assert "unknown config key 'prompt' for TransferConfig" in refusal(pool="pooler", transfer={"prompt": "[MASK]"})
    assert "--layer -1" in refusal(pool="pooler", layer_ids=[1])
    assert "ScalarMix" in refusal(pool="pooler", layer_mix=True, layer_ids=[0, 1, 2])
    assert "--classifier linear" in refusal(pool="pooler", transfer={"classifier": "mlp"})
    assert "--task choice" in refusal(pool="pooler", transfer={"task": "choice"})
    assert "--pool last" in refusal(family="gpt", pool="mean")
    assert "gpt runs of --task classify, pair to HF classes, not --task qa" in refusal(family="gpt",
                                                                                       transfer={"task": "qa"})
    assert "elmo run" in refusal(family="elmo")
    assert check_exportable(dict(base, pool="pooler")) == ("BertForSequenceClassification", "text-classification")
