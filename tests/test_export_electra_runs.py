"""``lmforge export-hf RUN_DIR OUT`` of fine-tuned ELECTRA runs: ``ElectraForSequenceClassification``,
``...ForTokenClassification`` and ``...ForQuestionAnswering`` whose logits are the run's within 1e-5 and whose
``transformers`` pipelines give the labels ``lmforge predict`` gives (a tiny random ELECTRA trained a few steps)."""

from __future__ import annotations

import json
import os
import random
import shlex

import pytest
import torch
import torch.nn.functional as F
from test_export_runs import FILL, NAMES, as_data, export, texts, train, write_jsonl

from lmforge.cli import main
from lmforge.data.tasks import QAExample, TaskData, TokensExample
from lmforge.errors import LmforgeError
from lmforge.families.electra.model import ElectraConfig, ElectraForPreTraining
from lmforge.families.electra.runs import classification_head
from lmforge.interop.runs import check_exportable
from lmforge.transfer import load_run
from lmforge.transfer.encoding import join_words

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers  # noqa: E402

TOL = 1e-5
# features mode folds the standardisation into the weights: W / std reaches ~100 where a channel of the tiny body
# barely varies, and float32 sums of such products carry ~1e-5 of rounding (the hidden states themselves are equal)
FOLDED_TOL = 1e-4


def tiny_electra(tok, seed: int = 0) -> ElectraForPreTraining:
    """Embeddings of width 16 projected to 32 (HF's ``embeddings_project``), 2 layers, a generator of width 16."""
    torch.manual_seed(seed)
    cfg = ElectraConfig(vocab_size=tok.vocab_size, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        generator_size_divisor=2)
    m = ElectraForPreTraining(cfg)
    m.tokenizer = tok
    return m.eval()


@pytest.fixture(scope="module")
def electra_dir(tmp_path_factory, wordpiece_tokenizer):
    d = tmp_path_factory.mktemp("electra")
    tiny_electra(wordpiece_tokenizer).save_pretrained(d, wordpiece_tokenizer)
    return d


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_jsonl(texts(60, 1), d / "train.jsonl")
    write_jsonl(texts(40, 3, pair=True), d / "pair.jsonl")
    return d


def predicted(run_dir, data_file, tmp_path) -> list[dict]:
    """``lmforge predict RUN --file F --out P``'s records, as a user reads them."""
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(run_dir), "--file", str(data_file), "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_classify(run_dir, out, rows, tmp_path, pair=False, tol=TOL):
    """HF logits = the run's within ``tol``, text by text; the pipeline's labels = ``lmforge predict``'s."""
    run = load_run(run_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(hf).__name__ == "ElectraForSequenceClassification"
    for r in rows:
        data = as_data([r])
        (ours,) = run._logits(data, run.encode(data))  # (K,)
        batch = hf_tok(r["text"], r.get("text_pair"), return_tensors="pt")
        assert batch["input_ids"][0].tolist() == run.encode(data)[0].input_ids
        with torch.no_grad():
            theirs = hf(**batch).logits[0]
        assert (theirs - ours).abs().max() < tol, (theirs, ours)
    preds = predicted(run_dir, write_jsonl(rows, tmp_path / "rows.jsonl"), tmp_path)
    pipe = transformers.pipeline("text-classification", model=str(out), device="cpu")
    inputs = [{"text": r["text"], "text_pair": r["text_pair"]} if pair else r["text"] for r in rows]
    labels = [(o[0] if isinstance(o, list) else o)["label"] for o in (pipe(x) for x in inputs)]
    assert labels == [p["pred"] for p in preds]
    assert len(set(labels)) > 1  # the run tells texts apart: the comparison is not vacuous
    return run


def test_classify_finetune_exports_through_the_gelu_head(electra_dir, data_dir, tmp_path):
    run_dir = train(electra_dir, "classify", data_dir / "train.jsonl", tmp_path / "run", mode="finetune", epochs=6,
                    lr=3e-3, batch_size=8, pool="cls")
    out = tmp_path / "hf"
    export(run_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["ElectraForSequenceClassification"] and cfg["model_type"] == "electra"
    assert cfg["id2label"] == {"0": "mid", "1": "neg", "2": "pos"}
    hf, info = transformers.ElectraForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    run = check_classify(run_dir, out, texts(8, 5), tmp_path)
    # the fine-tuned discriminator went out, not the pretrained one, and neither the generator nor its RTD head
    emb = run.body.electra.embeddings.word_embeddings.weight.detach()
    assert torch.equal(hf.electra.embeddings.word_embeddings.weight, emb)
    pretrained = ElectraForPreTraining.from_pretrained(electra_dir).electra.embeddings.word_embeddings.weight
    assert not torch.equal(emb, pretrained.detach())
    card = (out / "README.md").read_text()  # titled with the folder's name, not the staging folder's
    assert "pipeline_tag: text-classification" in card and "\n# hf: an lmforge electra classify run as " in card


def test_pair_features_folds_the_standardisation(electra_dir, data_dir, tmp_path):
    # features mode with a torch head on the top [CLS] (a pair's default read-out): standardised inputs
    run_dir = train(electra_dir, "pair", data_dir / "pair.jsonl", tmp_path / "run", mode="features",
                    classifier="linear", layer=-1, epochs=4)
    head = load_run(run_dir).model.head
    assert not torch.allclose(head.feat_std, torch.ones_like(head.feat_std))
    export(run_dir, tmp_path / "hf")
    check_classify(run_dir, tmp_path / "hf", texts(8, 6, pair=True), tmp_path, pair=True, tol=FOLDED_TOL)


def test_tokens_and_qa(electra_dir, tmp_path):
    rng = random.Random(0)
    sents = []
    for _ in range(24):
        words = [rng.choice(NAMES) if rng.random() < 0.3 else rng.choice(FILL) for _ in range(rng.randint(3, 6))]
        sents.append((words, ["B-PER" if w in NAMES else "O" for w in words]))
    conll = tmp_path / "t.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in sents) + "\n")
    run_dir = train(electra_dir, "tokens", conll, tmp_path / "run", mode="finetune", epochs=3, lr=5e-3, batch_size=8)
    out = tmp_path / "hf"
    export(run_dir, out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ElectraForTokenClassification"]
    run = load_run(run_dir)
    test = [["moses", "is", "in", "the", "language"], ["a", "pythonic", "david"]]  # "pythonic": two pieces
    data = TaskData("tokens", [TokensExample(w, ["O"] * len(w)) for w in test], run.labels)
    encs = run.encode(data)
    ours = run._logits(data, encs)  # (words, K) at each word's first sub-token
    (tmp_path / "test.conll").write_text("\n\n".join("\n".join(f"{w} O" for w in ws) for ws in test) + "\n")
    preds = predicted(run_dir, tmp_path / "test.conll", tmp_path)
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
            theirs = hf(**batch).logits[0][enc.rows]  # (words, K)
        assert (theirs - lg).abs().max() < TOL
        by_index = {e["index"]: e for e in pipe(text)}
        assert [by_index[r]["entity"] for r in enc.rows] == pred["pred"]
    assert {t for p in preds for t in p["pred"]} == {"B-PER", "O"}  # not vacuous: it tags the names

    paras = []
    for i in range(24):
        name = rng.choice(NAMES)
        ctx = f"{' '.join(rng.choice(FILL) for _ in range(rng.randint(1, 4)))} was written by {name} and the language"
        qa = {"id": f"q{i}", "question": "who wrote it",
              "answers": [{"text": name, "answer_start": ctx.index(f"by {name}") + 3}]}
        paras.append({"context": ctx, "qas": [qa]})
    squad = tmp_path / "q.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paras}]}))
    run_dir = train(electra_dir, "qa", squad, tmp_path / "qa-run", mode="finetune", epochs=2, lr=5e-3, max_len=48)
    export(run_dir, tmp_path / "hf-qa")
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "hf-qa").eval()
    assert type(hf).__name__ == "ElectraForQuestionAnswering"
    run = load_run(run_dir)
    examples = [QAExample(f"q{k}", "who wrote it", p["context"], []) for k, p in enumerate(paras[:4])]
    data = TaskData("qa", examples, [])
    encs = run.encode(data)
    for ex, enc, lg in zip(examples, encs, run._logits(data, encs)):
        batch = hf_tok(ex.question, ex.context, return_tensors="pt")
        assert batch["input_ids"][0].tolist() == enc.input_ids
        with torch.no_grad():
            o = hf(**batch)
        assert (o.start_logits[0] - lg[:, 0]).abs().max() < TOL
        assert (o.end_logits[0] - lg[:, 1]).abs().max() < TOL


def test_the_gelu_head_is_the_linear_head():
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    head = classification_head(W * 4, b * 4)  # logits of a few units, as a trained head gives
    x = torch.randn(5, 8, generator=g)
    z = F.gelu(x @ head["classifier.dense.weight"].T + head["classifier.dense.bias"])  # HF's head, dropout off
    got = z @ head["classifier.out_proj.weight"].T + head["classifier.out_proj.bias"]
    assert (got.double() - (x.double() @ (W * 4).T + b * 4)).abs().max() < TOL
    with pytest.raises(LmforgeError, match="at most 4 labels"):
        classification_head(torch.zeros(5, 8, dtype=torch.float64), torch.zeros(5, dtype=torch.float64))


def test_what_cannot_map_is_refused_in_one_line(electra_dir, data_dir, tmp_path, capsys):
    run_dir = train(electra_dir, "classify", data_dir / "train.jsonl", tmp_path / "run", mode="frozen", layer=-1,
                    epochs=1)
    base = json.loads((run_dir / "config.json").read_text())
    assert base["pool"] == "mean"  # a fixed ELECTRA's single-text default: its [CLS] was never trained as a summary
    assert main(["export-hf", str(run_dir), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "reads the mean of the token vectors (--pool mean), but ElectraForSequenceClassification reads " in err
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    # the refusal names the command that retrains the run in a form that exports; as given, it works
    retrain = err.split("exports: ", 1)[1].split(" (TRAIN", 1)[0]
    assert retrain.startswith("lmforge finetune ") and retrain.endswith(f"--pool cls --train TRAIN --test TEST "
                                                                        f"--out {run_dir}-retrained")
    train_file = str(data_dir / "train.jsonl")
    argv = shlex.split(retrain.replace("TRAIN", train_file).replace("TEST", train_file))
    assert main(argv[1:] + ["--cache-dir", str(tmp_path / "cache")]) == 0
    export(tmp_path / "run-retrained", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [
        "ElectraForSequenceClassification"]

    def refusal(**change) -> str:
        data = json.loads(json.dumps(base))
        data["transfer"].update(change.pop("transfer", {}))
        data.update(change)
        with pytest.raises(LmforgeError) as e:
            check_exportable(data)
        return str(e.value)

    assert "--classifier linear" in refusal(pool="cls", transfer={"classifier": "mlp"})
    assert "--layer -1" in refusal(pool="cls", layer_ids=[1])
    assert "electra runs of --task classify, pair, tokens, qa to HF classes, not --task choice" in refusal(
        pool="cls", transfer={"task": "choice"})
    assert check_exportable(dict(base, pool="cls")) == ("ElectraForSequenceClassification", "text-classification")
