"""ONNX export and the ONNX Runtime backend: graphs of BERT, ELECTRA and GPT bodies equal lmforge's torch outputs
(1e-4) at other batch sizes and lengths than the traced one, padding included; ``encode --backend onnx`` gives
torch's vectors; ``auto`` measures once and caches its choice; ``--quantize int8`` is close to fp32 and reports its
fidelity; the backends are refused where they do not apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_export_electra_runs import tiny_electra
from test_transfer_families import tiny_bert, tiny_gpt

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.models import onnx_backend
from lmforge.nn import autotune
from lmforge.transfer.benchmarks import domain_text

TEXTS = domain_text("en-tweets")[:48]


def _batch(seed: int, vocab: int, B: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, T // 2 :] = 0  # one padded row
    return ids.numpy(), mask.numpy()


@pytest.mark.parametrize("family", ["bert", "electra", "gpt"])
def test_body_graph_equals_torch(family, wordpiece_tokenizer, bpe_tokenizer):
    maker, tok = {"bert": (tiny_bert, wordpiece_tokenizer), "electra": (tiny_electra, wordpiece_tokenizer),
                  "gpt": (tiny_gpt, bpe_tokenizer)}[family]
    body = maker(tok).eval()
    body.tokenizer = tok
    forward = onnx_backend.onnx_forward(body)
    top = onnx_backend.TopStates(body)
    for seed, (B, T) in enumerate([(1, 3), (3, 17), (5, 40)]):
        ids, mask = _batch(seed, tok.vocab_size, B, T)
        with torch.no_grad():
            ref = top(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        got = forward(ids, mask)
        real = mask.astype(bool)  # padded positions' states are never read
        assert got.shape == ref.shape
        assert np.abs(got - ref)[real].max() <= 1e-4


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory, wordpiece_tokenizer):
    d = tmp_path_factory.mktemp("onnx") / "bert"
    tiny_bert(wordpiece_tokenizer).save_pretrained(d, wordpiece_tokenizer)
    return d


def test_encode_onnx_gives_torch_vectors(bert_folder, tmp_path):
    model = lmforge.load(bert_folder)
    exact = model.encode(TEXTS, pool="mean+specials")
    got = model.encode(TEXTS, pool="mean+specials", backend="onnx")
    assert np.abs(got - exact).max() <= 1e-4
    assert onnx_backend.cosines(got, exact).min() >= 0.99999
    assert len(list(onnx_backend.cache_dir().glob("*.onnx"))) >= 1  # the graph is cached for the next run


def test_auto_measures_once_and_caches_its_choice(bert_folder):
    model = lmforge.load(bert_folder)
    exact = model.encode(TEXTS, pool="mean+specials")
    got = model.encode(TEXTS, pool="mean+specials", backend="auto")
    assert np.abs(got - exact).max() <= 1e-4
    answers = autotune.lookup_prefix("encode backend |")
    assert answers and all(e["choice"] in ("torch", "onnx") for e in answers.values())
    assert all(set(e["seconds"]) == {"torch", "onnx"} for e in answers.values())


def test_int8_is_close_and_reports_its_fidelity(bert_folder, tmp_path, capsys):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    assert main(["encode", str(bert_folder), "--file", str(src), "--out", str(out), "--pool", "mean+specials",
                 "--backend", "onnx", "--quantize", "int8", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    exact = lmforge.load(bert_folder).encode(TEXTS, pool="mean+specials")
    cos = onnx_backend.cosines(np.load(out), exact)
    assert record["backend"] == "onnx" and record["quantize"] == "int8"
    assert record["fidelity"]["texts"] == len(TEXTS)
    assert record["fidelity"]["worst_cosine"] == pytest.approx(cos.min(), abs=1e-6)
    assert record["fidelity"]["mean_cosine"] == pytest.approx(cos.mean(), abs=1e-6)
    assert 0.9 < cos.min() and not np.allclose(np.load(out), exact, atol=1e-6)  # approximate, yet close


def test_backends_are_refused_where_they_do_not_apply(bert_folder, tmp_path, capsys):
    model = lmforge.load(bert_folder)
    with pytest.raises(LmforgeError, match="sentence pipeline"):
        model.encode(TEXTS[:2], backend="onnx")  # lmforge's own mean pooling: torch only
    with pytest.raises(LmforgeError, match="ONNX Runtime"):
        model.encode(TEXTS[:2], pool="mean+specials", quantize="int8")  # int8 needs onnx or auto
    src = tmp_path / "t.txt"
    src.write_text("a text\n")
    assert main(["encode", str(bert_folder), "--file", str(src), "--out", str(tmp_path / "v.npy"), "--layer", "1",
                 "--backend", "onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err.split("lmforge encode: error:")[-1] and "--layer" in err
    assert not (tmp_path / "v.npy").exists()


def test_embeddings_route_takes_the_backend(bert_folder):
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app
    from lmforge.serve.registry import open_entries

    exact = lmforge.load(bert_folder).encode(TEXTS[:8], pool="mean+specials", normalize=True)
    with TestClient(create_app(open_entries([bert_folder]))) as client:
        body = {"model": "bert", "input": TEXTS[:8], "pool": "mean+specials", "backend": "onnx"}
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        assert np.abs(got - exact).max() <= 1e-4
        r = client.post("/v1/embeddings", json={**body, "pool": "mean"})  # lmforge's own pooling: torch only
        assert r.status_code == 400 and "sentence pipeline" in r.json()["error"]["message"]


# -- fine-tuned runs ---------------------------------------------------------------------------------------------
def _conll(path, n: int, seed: int):
    import random

    rng = random.Random(seed)
    sents = []
    for _ in range(n):
        pairs = [(rng.choice(["moses", "aaron"]), "B-PER") if rng.random() < 0.3 else (rng.choice(["the", "a", "of"]),
                                                                                       "O")
                 for _ in range(rng.randint(3, 6))]
        sents.append("\n".join(f"{w} {t}" for w, t in pairs))
    path.write_text("\n\n".join(sents) + "\n")
    return path


@pytest.mark.parametrize("task", ["classify", "tokens"])
def test_run_graph_gives_torch_logits_and_labels(task, bert_folder, tmp_path):
    from test_transfer_families import rows

    from lmforge.data.tasks import load_task
    from lmforge.transfer import load_run, run_transfer

    if task == "classify":
        data = tmp_path / "d.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows(24, 1)))
    else:
        data = _conll(tmp_path / "d.conll", 24, 1)
    run_transfer(bert_folder, task, data, data, mode="finetune", out_dir=tmp_path / "run", epochs=1, max_len=32,
                 seed=0, device="cpu", precision="fp32")
    test = load_task(data, task)
    run = load_run(tmp_path / "run")
    encs = run.encode(test)
    exact = run._logits(test, encs, use_cache=False)
    preds = run.predict(test, use_cache=False)
    run.set_backend("onnx")
    got = run._logits(test, encs, use_cache=False)
    assert max(float((a - b).abs().max()) for a, b in zip(exact, got)) <= 1e-4
    key = "label" if task == "classify" else "tags"
    assert [p[key] for p in run.predict(test, use_cache=False)] == [p[key] for p in preds]
    run.set_backend("auto")  # the faster of the two, measured once and cached: the same labels either way
    assert [p[key] for p in run.predict(test, use_cache=False)] == [p[key] for p in preds]
    assert any(e["choice"] in ("torch", "onnx") for e in autotune.lookup_prefix("predict backend |").values())


def test_evaluate_run_in_int8_shows_the_fp32_score_beside(model_folders, capsys):
    assert main(["evaluate", "run", str(model_folders["run"]), "--test", str(model_folders["data"]), "--backend",
                 "onnx", "--quantize", "int8", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    exact = lmforge.transfer.load_run(model_folders["run"]).evaluate(lmforge.data.tasks.load_task(
        model_folders["data"], "classify"))[0]
    assert record["quantize"] == "int8" and record["fp32"] == pytest.approx(exact)
    assert 0 <= record["accuracy"] <= 1


@pytest.mark.parametrize("what", ["bert", "run"])
def test_export_onnx_writes_a_graph_onnxruntime_runs(what, bert_folder, model_folders, tmp_path, capsys):
    import onnxruntime as ort

    source = bert_folder if what == "bert" else model_folders["run"]
    out = tmp_path / "g.onnx"
    assert main(["export-onnx", str(source), "--out", str(out), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    names = {i.name for i in ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).get_inputs()}
    assert record["bytes"] == out.stat().st_size and {"input_ids", "attention_mask"} <= names
    if what == "bert":  # the file is the graph --backend onnx runs
        ids, mask = _batch(0, 50, 2, 9)
        want = onnx_backend.onnx_forward(lmforge.load(bert_folder))(ids, mask)
        got = ort.InferenceSession(str(out)).run(None, {"input_ids": ids, "attention_mask": mask})[0]
        assert np.array_equal(got, want)
    assert main(["export-onnx", str(source), "--out", str(tmp_path / "g.txt")]) == 2


# -- neighbors and serve -----------------------------------------------------------------------------------------
def _neighbor_corpus() -> list[str]:
    """Tweets, and one text three windows long (64 positions): embed reads it in overlapping windows."""
    return [*TEXTS[:20], " ".join(TEXTS[20:40])]


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_neighbors_on_onnx_give_torch_words_and_cosines(family, wordpiece_tokenizer, bpe_tokenizer):
    from lmforge.models.neighbors import corpus_word_vectors, neighbors

    maker, tok = {"bert": (tiny_bert, wordpiece_tokenizer), "gpt": (tiny_gpt, bpe_tokenizer)}[family]
    body = maker(tok).eval()
    body.tokenizer = tok
    corpus = _neighbor_corpus()
    assert len(tok.encode(corpus[-1])) > 2 * 64
    words, exact, counts = corpus_word_vectors(body, corpus, batch_size=8)
    got_words, got, got_counts = corpus_word_vectors(body, corpus, batch_size=8,
                                                     forward=onnx_backend.onnx_forward(body))
    assert got_words == words and got_counts == counts
    assert np.abs(got - exact).max() <= 1e-4
    query = words[int(np.argmax(counts))]  # the corpus's most frequent word
    want = neighbors(body, query, 8, corpus)
    for backend in ("onnx", "auto"):
        found = neighbors(body, query, 8, corpus, backend=backend)
        assert [w for w, _ in found] == [w for w, _ in want]
        assert [s for _, s in found] == pytest.approx([s for _, s in want], abs=1e-4)


def test_a_body_without_a_runnable_graph_is_refused_in_one_line_and_auto_takes_torch(wordpiece_tokenizer):
    from test_transfer_families import tiny_elmo

    from lmforge.models.neighbors import neighbors

    body = tiny_elmo(wordpiece_tokenizer).eval()
    body.tokenizer = wordpiece_tokenizer
    corpus = _neighbor_corpus()[:8]
    with pytest.raises(LmforgeError, match="does not run on ONNX Runtime.*--backend torch"):
        neighbors(body, "the", 5, corpus, backend="onnx")
    assert neighbors(body, "the", 5, corpus, backend="auto") == neighbors(body, "the", 5, corpus)


def test_neighbors_cli_takes_the_backend(bert_folder, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(_neighbor_corpus()) + "\n", encoding="utf-8")
    answers = {}
    for backend in ("torch", "onnx"):
        assert main(["neighbors", str(bert_folder), "the", "--corpus", str(corpus), "--top-k", "5", "--backend",
                     backend, "--json"]) == 0
        answers[backend] = json.loads(capsys.readouterr().out)
    assert answers["onnx"]["backend"] == "onnx"
    assert [n["word"] for n in answers["onnx"]["neighbors"]] == [n["word"] for n in answers["torch"]["neighbors"]]
    # the graph holds the top layer alone: another layer is refused in one line, naming the way out
    assert main(["neighbors", str(bert_folder), "the", "--corpus", str(corpus), "--layer", "0", "--backend",
                 "onnx"]) == 2
    err = capsys.readouterr().err
    assert "top layer" in err and "--backend torch" in err and "Traceback" not in err


def test_serve_backend_runs_predict_and_embeddings_on_onnx_where_it_applies(bert_folder, model_folders):
    from fastapi.testclient import TestClient

    from lmforge.data.tasks import TaskData, example_from_fields
    from lmforge.serve import create_app
    from lmforge.serve.registry import open_entries
    from lmforge.transfer import load_run

    run = load_run(model_folders["run"])
    texts = TEXTS[:6]
    want = run.predict(TaskData("classify", [example_from_fields("classify", t) for t in texts], run.labels),
                       use_cache=False)
    entries = open_entries([model_folders["run"], bert_folder])
    with TestClient(create_app(entries, backend="onnx")) as client:
        card = client.get("/v1/models/run").json()
        assert card["backend"] == "onnx" and card["quantize"] == "none"
        for t, w in zip(texts, want):
            r = client.post("/v1/predict", json={"model": "run", "text": t})
            assert r.status_code == 200, r.text
            assert r.json()["prediction"]["label"] == w["label"]
            assert r.json()["prediction"]["probs"] == pytest.approx(w["probs"], abs=1e-4)
        assert entries["run"].obj._onnx is not None  # the answers came from ONNX Runtime
        exact = lmforge.load(bert_folder).encode(texts, pool="mean+specials", normalize=True)
        r = client.post("/v1/embeddings", json={"model": "bert", "input": texts, "pool": "mean+specials"})
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        assert np.abs(got - exact).max() <= 1e-4
        assert onnx_backend._FORWARDS.get(entries["bert"].obj)  # the server's backend ran them
        # lmforge's own pooling has no graph: the server's backend does not apply, torch answers
        r = client.post("/v1/embeddings", json={"model": "bert", "input": texts})
        want_mean = lmforge.load(bert_folder).encode(texts, normalize=True)
        assert r.status_code == 200 and np.array_equal(
            np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32), want_mean)


def test_serve_refuses_int8_on_torch_before_loading(bert_folder, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["serve", str(bert_folder), "--port", str(port), "--quantize", "int8"]) == 2
    err = capsys.readouterr().err
    assert "int8 runs on ONNX Runtime" in err and "--backend onnx" in err and "Traceback" not in err
