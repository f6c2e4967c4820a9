"""``lmforge serve``: the HTTP API (FastAPI TestClient, no socket), its answers against the CLI and the
Python API, bad requests, micro-batching, a load test and the playground in headless Chromium against a
real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_transfer_families import rows, tiny_bert, tiny_elmo, tiny_gpt, tiny_word2vec

import lmforge
from lmforge.cli import main
from lmforge.data.tasks import TaskData, example_from_fields
from lmforge.evaluate.polysemy import word_similarities
from lmforge.generation import generate_text
from lmforge.serve import ServeLimits, create_app, pca_2d
from lmforge.transfer import load_run, run_transfer
from lmforge.transfer.specs import SPECS

SNAKE = "He got bit by Python."
LANG = "Python is my favorite programming language."
POS = ["good", "great", "fine", "nice", "happy", "love"]
NEG = ["bad", "awful", "poor", "sad", "hate", "terrible"]
FILL = ["the", "name", "of", "a", "python", "and", "it", "is", "in", "language"]
LIMITS = ServeLimits(max_new_tokens=48, max_text_chars=400, max_body_bytes=8000, max_generations=2, max_texts=12)


# -- tiny folders of every kind, built once for this module ----------------------------------------------------
def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer):
    """Four model folders (bert, gpt, elmo, w2v) and five runs (classify, pair, tokens, qa, choice)."""
    root = tmp_path_factory.mktemp("serve")
    wp, bpe = wordpiece_tokenizer, bpe_tokenizer
    f = {}
    for name, model, tok in (
        ("bert", tiny_bert(wp), wp),
        ("gpt", tiny_gpt(bpe), bpe),
        ("elmo", tiny_elmo(wp), wp),
        ("w2v", tiny_word2vec(wp), wp),
    ):
        f[name] = root / name
        model.save_pretrained(f[name], tok)
    data = root / "data"
    data.mkdir()
    cls = _write(data / "cls.jsonl", rows(24, 1))
    pair = _write(
        data / "pair.jsonl",
        [
            {"text": a["text"], "text_pair": b["text"], "label": a["label"]}
            for a, b in zip(rows(24, 2), rows(24, 3))
        ],
    )
    conll = data / "tags.conll"
    rng = random.Random(4)
    sents = []
    for _ in range(16):
        ws = [rng.choice(FILL + ["moses", "david"]) for _ in range(rng.randint(3, 5))]
        sents.append("\n".join(f"{w} {'B-PER' if w in ('moses', 'david') else 'O'}" for w in ws))
    conll.write_text("\n\n".join(sents) + "\n")
    paras = []
    for i in range(12):
        who = rng.choice(["moses", "aaron", "david"])
        ctx = f"the book was written by {who} in the language"
        paras.append(
            {
                "context": ctx,
                "qas": [
                    {
                        "id": str(i),
                        "question": "who wrote it",
                        "answers": [{"text": who, "answer_start": ctx.index(who)}],
                    }
                ],
            }
        )
    squad = data / "qa.json"
    squad.write_text(json.dumps({"data": [{"paragraphs": paras}]}))
    choice = _write(
        data / "choice.jsonl",
        [
            {"context": r["text"], "choices": ["good", "bad"], "label": 0 if r["label"] == "pos" else 1}
            for r in rows(16, 5)
        ],
    )
    cache = str(root / "cache")
    for name, model, task, path, mode in (
        ("run-cls", "bert", "classify", cls, "finetune"),
        ("run-pair", "gpt", "pair", pair, "frozen"),
        ("run-tokens", "bert", "tokens", conll, "frozen"),
        ("run-qa", "bert", "qa", squad, "frozen"),
        ("run-choice", "bert", "choice", choice, "features"),
    ):
        f[name] = root / name
        run_transfer(
            f[model], task, path, path, mode=mode, out_dir=f[name], epochs=1, max_len=32, seed=0, cache_dir=cache
        )
    f["training"] = root / "training"  # a pretraining that has written events but no model yet
    f["training"].mkdir()
    (f["training"] / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "split": "train", "loss": 5.0 - s / 10, "metrics": {}}) + "\n" for s in (1, 2, 3)
        )
    )
    return f


@pytest.fixture(scope="module")
def client(folders):
    from fastapi.testclient import TestClient

    app = create_app([folders[k] for k in folders], LIMITS)
    with TestClient(app) as c:
        yield c


def _cli(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def _one_line_error(r, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"] and "\n" not in body["error"] and "Traceback" not in r.text
    return body["error"]


# -- the API against the Python API and the CLI ----------------------------------------------------------------
def test_models_health_and_docs(client, folders):
    assert client.get("/health").json()["status"] == "ok"
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert set(models) == set(folders)
    assert models["bert"]["family"] == "bert" and set(models["bert"]["supports"]) == {"embed", "fill-mask"}
    assert set(models["gpt"]["supports"]) == {"embed", "generate"}
    assert models["w2v"]["supports"] == ["embed"] and models["elmo"]["supports"] == ["embed"]
    assert models["elmo"]["contextual"] and not models["w2v"]["contextual"]  # the playground projects a contextual one
    assert models["bert"]["parameters"] == lmforge.load(folders["bert"]).num_parameters()
    assert models["run-qa"]["task"] == "qa" and models["run-qa"]["supports"] == ["predict"]
    assert models["run-cls"]["labels"] == ["neg", "pos"]
    assert models["training"]["kind"] == "training" and models["training"]["supports"] == ["curves"]
    assert "/v1/generate" in client.get("/openapi.json").json()["paths"]
    assert client.get("/docs").status_code == 200


def test_fill_mask_equals_python_and_cli(client, folders, capsys):
    text = "the python is a large [MASK] of the [MASK] ."
    got = client.post("/v1/fill-mask", json={"model": "bert", "text": text, "top_k": 4}).json()["masks"]
    want = lmforge.load(folders["bert"]).fill_mask(text, top_k=4)
    assert [[(c["token"], c["prob"]) for c in m] for m in got] == [[(t, float(p)) for t, p in m] for m in want]
    printed = [
        ln.split()
        for ln in _cli(capsys, "fill-mask", str(folders["bert"]), text, "--top-k", "4").splitlines()
        if not ln.startswith("[MASK]")
    ]
    flat = [c for m in got for c in m]
    assert [p[0] for p in printed] == [c["token"] for c in flat]
    assert [p[1] for p in printed] == [f"{c['prob']:.4f}" for c in flat]


@pytest.mark.parametrize(
    "opts",
    [
        {"max_new_tokens": 12},
        {"max_new_tokens": 16, "temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7},
        {"max_new_tokens": 16, "temperature": 1.2, "seed": 3, "stop": ["e"], "use_cache": False},
    ],
)
def test_generate_equals_python_and_cli_and_streams(client, folders, capsys, opts):
    prompt = "The python"
    body = {"model": "gpt", "prompt": prompt, **opts}
    text = client.post("/v1/generate", json=body).json()["text"]
    gpt = lmforge.load(folders["gpt"])
    assert text == generate_text(gpt, prompt, **opts)
    argv = ["generate", str(folders["gpt"]), "--prompt", prompt, "--max-new-tokens", str(opts["max_new_tokens"])]
    for k in ("temperature", "top_k", "top_p", "seed"):
        if k in opts:
            argv += [f"--{k.replace('_', '-')}", str(opts[k])]
    for s in opts.get("stop", []):
        argv += ["--stop", s]
    if opts.get("use_cache") is False:
        argv.append("--no-cache")
    assert _cli(capsys, *argv) == prompt + text + "\n"
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = "".join(r.iter_text())
    blocks = [b for b in raw.split("\n\n") if b.strip()]
    pieces = [json.loads(b[len("data: ") :])["text"] for b in blocks if b.startswith("data: ")]
    assert blocks[-1].startswith("event: done")
    assert json.loads(blocks[-1].split("data: ", 1)[1])["text"] == text == "".join(pieces)
    if "stop" not in opts:
        assert len(pieces) >= 3  # token by token, not one block at the end


def test_embed_vectors_and_word_cosines_equal_python(client, folders):
    texts = [SNAKE, LANG, "I like python ."]
    for name in ("bert", "gpt", "elmo", "w2v"):
        model = lmforge.load(folders[name])
        r = client.post("/v1/embed", json={"model": name, "texts": texts[:2]}).json()
        want = model.embed(texts[:2])
        for got, tl in zip(r["results"], want):
            assert got["tokens"] == tl.tokens and [tuple(o) for o in got["offsets"]] == list(tl.offsets)
            np.testing.assert_allclose(np.array(got["vectors"]), tl.layers.float().numpy(), atol=1e-5)
        r = client.post("/v1/embed", json={"model": name, "texts": texts, "word": "python"}).json()
        rows = word_similarities(model, texts, "python", name)
        assert r["layer_names"] == [row.layer for row in rows]
        for got, row in zip(r["rows"], rows):
            assert {(p["a"], p["b"]): p["cosine"] for p in got["pairs"]} == pytest.approx(row.pairs, abs=2e-6)
        one = client.post("/v1/embed", json={"model": name, "texts": [SNAKE], "word": "python"}).json()
        assert np.array(one["vectors"]).shape[0] == len(rows)
    w2v = client.post("/v1/embed", json={"model": "w2v", "texts": texts, "word": "python"}).json()
    assert all(p["cosine"] == 1.0 for p in w2v["rows"][0]["pairs"])  # static vectors


def cli_cosines(model_dirs, sentences, word) -> dict:
    """What `lmforge embed` prints in its own process: {(model name, layer): cosine as printed}."""
    out = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", "-q", "embed", *map(str, model_dirs), *sentences, "--word", word],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    printed = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(\S+) \((\w+)\)\s+(\S+)\s+(-?\d\.\d{4})$", line)
        if m:
            printed[(m.group(1), m.group(3))] = m.group(4)
    return printed


def test_embed_equals_cli_subprocess(client, folders):
    """`lmforge embed` in its own process prints the cosines /v1/embed returns (4 decimals)."""
    names = ["w2v", "elmo", "gpt", "bert"]
    printed = cli_cosines([folders[n] for n in names], [SNAKE, LANG], "python")
    served = {}
    for n in names:
        r = client.post("/v1/embed", json={"model": n, "texts": [SNAKE, LANG], "word": "python"}).json()
        served.update({(n, row["layer"]): f"{row['pairs'][0]['cosine']:.4f}" for row in r["rows"]})
    assert len(printed) == len(served) == 1 + 3 + 3 + 3 and printed == served


def test_projection_is_pca_of_the_word_vectors(client, folders):
    texts = [SNAKE, LANG, "A python is a large snake.", "I wrote it in Python."]
    r = client.post("/v1/projection", json={"model": "elmo", "texts": texts, "word": "python"}).json()
    assert r["layer_name"] == "lstm2" and len(r["points"]) == 4
    from lmforge.evaluate import find_word, span_vectors

    model = lmforge.load(folders["elmo"])
    vecs = np.stack(
        [span_vectors(tl, find_word(t, "python"))[-1].double().numpy() for t, tl in zip(texts, model.embed(texts))]
    )
    centred = vecs - vecs.mean(0)
    pts = np.array([[p["x"], p["y"]] for p in r["points"]])
    # the projection keeps the distances of the points as far as two components can
    assert (
        np.linalg.norm(pts[:, None] - pts[None], axis=-1).max()
        <= np.linalg.norm(centred[:, None] - centred[None], axis=-1).max() + 1e-6
    )
    _, s, _ = np.linalg.svd(centred, full_matrices=False)
    assert r["explained_variance_ratio"] == pytest.approx((s[:2] ** 2 / (s**2).sum()).tolist(), abs=1e-9)
    flat = client.post("/v1/projection", json={"model": "w2v", "texts": texts, "word": "python"}).json()
    assert all(p["x"] == 0 and p["y"] == 0 for p in flat["points"])  # one static vector: no spread
    pts2, ratio = pca_2d(np.array([[0.0, 0.0], [2.0, 0.0], [4.0, 0.0]]))
    assert pts2[:, 0].tolist() == pytest.approx([-2.0, 0.0, 2.0]) and ratio.tolist() == pytest.approx([1.0, 0.0])


@pytest.mark.parametrize(
    "name,fields,argv",
    [
        ("run-cls", {"text": "a good name"}, ["--text", "a good name"]),
        (
            "run-pair",
            {"text": "it is good", "text_pair": "sad python"},
            ["--text", "it is good", "--text-pair", "sad python"],
        ),
        ("run-tokens", {"text": "moses and the python"}, ["--text", "moses and the python"]),
        (
            "run-qa",
            {"text": "who wrote it", "text_pair": "the book was written by david in the language"},
            ["--text", "who wrote it", "--text-pair", "the book was written by david in the language"],
        ),
        (
            "run-choice",
            {"text": "a great day", "choices": ["good", "bad"]},
            ["--text", "a great day", "--choice", "good", "--choice", "bad"],
        ),
    ],
)
def test_predict_equals_python_and_cli(client, folders, capsys, name, fields, argv):
    r = client.post("/v1/predict", json={"model": name, **fields})
    assert r.status_code == 200, r.text
    got = r.json()["prediction"]
    printed = json.loads(_cli(capsys, "predict", str(folders[name]), *argv, "--json"))  # the input plus pred
    key = SPECS[load_run(folders[name]).cfg.task].answer_key
    assert printed["pred"] == got[key] and printed.get("probs") == got.get("probs")
    run = load_run(folders[name])
    ex = example_from_fields(run.cfg.task, fields["text"], fields.get("text_pair"), fields.get("choices"))
    assert got == run.predict(TaskData(run.cfg.task, [ex], run.labels), use_cache=False)[0]


# -- bad requests ----------------------------------------------------------------------------------------------
def test_bad_requests_get_one_line_4xx_and_the_server_keeps_serving(client):
    cases = [
        ("/v1/fill-mask", {"model": "nope", "text": "a [MASK] b"}, 404, "no model named 'nope'"),
        ("/v1/fill-mask", {"model": "gpt", "text": "a [MASK] b"}, 400, "fill-mask needs a BERT"),
        ("/v1/fill-mask", {"model": "bert", "text": "no mask here"}, 400, "has no [MASK]"),
        ("/v1/fill-mask", {"model": "bert", "text": "  "}, 400, "text is empty"),
        ("/v1/fill-mask", {"model": "bert", "text": "[MASK] " + "x" * 500}, 400, "at most 400 (--max-text-chars)"),
        ("/v1/fill-mask", {"model": "bert", "text": "a [MASK]", "top_k": 0}, 422, "field 'top_k'"),
        ("/v1/fill-mask", {"text": "a [MASK]"}, 422, "field 'model' is missing"),
        ("/v1/generate", {"model": "gpt", "prompt": "hi", "max_new_tokens": 49}, 400, "over this server's cap of 48"),
        ("/v1/generate", {"model": "gpt", "prompt": ""}, 400, "prompt is empty"),
        ("/v1/generate", {"model": "gpt", "prompt": "hi", "top_p": 1.5}, 422, "field 'top_p'"),
        ("/v1/generate", {"model": "bert", "prompt": "hi"}, 400, "generate needs a GPT"),
        ("/v1/embed", {"model": "bert", "texts": [SNAKE, "no snake"], "word": "python"}, 400, "does not occur"),
        ("/v1/embed", {"model": "bert", "texts": [SNAKE] * 13}, 400, "at most 12"),
        ("/v1/embed", {"model": "run-cls", "texts": [SNAKE]}, 400, "embed needs a model folder"),
        (
            "/v1/projection",
            {"model": "bert", "texts": [SNAKE, LANG], "word": "python", "layer": 9},
            400,
            "layer 9 does not exist",
        ),
        ("/v1/predict", {"model": "run-pair", "text": "only one"}, 400, "give text_pair as well"),
        ("/v1/predict", {"model": "run-choice", "text": "ctx", "choices": ["one"]}, 400, "two or more choices"),
        ("/v1/predict", {"model": "bert", "text": "x"}, 400, "predict needs a run"),
    ]
    for path, body, status, needle in cases:
        assert needle in _one_line_error(client.post(path, json=body), status), (path, body)
    err = _one_line_error(
        client.post("/v1/embed", content=b'{"model": "bert", "texts": [', headers={"content-type": "application/json"}),
        400,
    )
    assert err.startswith("malformed JSON")
    inf = b'{"model": "gpt", "prompt": "hi", "temperature": Infinity}'  # Python's JSON reads it; the server refuses it
    err = _one_line_error(client.post("/v1/generate", content=inf, headers={"content-type": "application/json"}), 422)
    assert "field 'temperature': Input should be a finite number" in err
    assert "over 8000 bytes" in _one_line_error(
        client.post("/v1/embed", json={"model": "bert", "texts": ["a" * 9000]}), 413
    )
    assert "no such endpoint" in _one_line_error(client.get("/v1/nothing"), 404)
    assert "it has no metrics.jsonl" in _one_line_error(client.get("/v1/curves/run-cls"), 400)
    # still serving
    assert client.post("/v1/fill-mask", json={"model": "bert", "text": "a [MASK] ."}).status_code == 200


def test_generation_limit_answers_429(client):
    server = client.app.state.server
    server.generations.running = LIMITS.max_generations  # every slot taken
    try:
        r = client.post("/v1/generate", json={"model": "gpt", "prompt": "hi", "max_new_tokens": 2})
        assert "--max-generations" in _one_line_error(r, 429) and r.headers["retry-after"] == "1"
    finally:
        server.generations.running = 0
    assert client.post("/v1/generate", json={"model": "gpt", "prompt": "hi", "max_new_tokens": 2}).status_code == 200
    assert client.get("/health").json()["generations_running"] == 0


def test_serve_cli_errors(folders, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and len(err.strip().splitlines()) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["serve", str(folders["bert"]), "--port", str(s.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


# -- batching --------------------------------------------------------------------------------------------------
def test_concurrent_requests_share_batches_and_get_their_own_answers(folders):
    import httpx

    app = create_app({**{}, **_entries(folders, ["bert", "run-cls"])}, ServeLimits(max_batch=16, batch_wait_ms=20))
    server = app.state.server
    sentences = [f"{w} is a python ." for w in POS + NEG]

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            emb = [
                c.post("/v1/embed", json={"model": "bert", "texts": [s, SNAKE], "word": "python"}) for s in sentences
            ]
            pred = [c.post("/v1/predict", json={"model": "run-cls", "text": s}) for s in sentences]
            return await asyncio.gather(*emb), await asyncio.gather(*pred)

    emb, pred = asyncio.run(go())
    bert, run = lmforge.load(folders["bert"]), load_run(folders["run-cls"])
    for s, r in zip(sentences, emb):
        want = word_similarities(bert, [s, SNAKE], "python")
        assert [row["pairs"][0]["cosine"] for row in r.json()["rows"]] == pytest.approx(
            [w.pairs[(0, 1)] for w in want], abs=2e-6
        )
    for s, r in zip(sentences, pred):
        want = run.predict(TaskData("classify", [example_from_fields("classify", s)], run.labels), use_cache=False)
        assert r.json()["prediction"]["label"] == want[0]["label"]
        assert r.json()["prediction"]["probs"] == pytest.approx(want[0]["probs"], abs=2e-5)
    b_emb, b_pred = server.batchers[("bert", "embed")], server.batchers[("run-cls", "predict")]
    assert b_emb.items == 2 * len(sentences) and b_emb.calls < len(sentences)  # requests shared forward passes
    assert b_pred.items == len(sentences) and b_pred.calls < len(sentences)


def test_concurrent_embeddings_requests_share_forward_passes(folders):
    import httpx

    from lmforge.models.vectors import encode

    app = create_app(_entries(folders, ["bert"]), ServeLimits(max_batch=16, batch_wait_ms=20))
    rng = random.Random(0)
    words = [w for s in POS + NEG for w in s.split()]
    requests = [[" ".join(rng.choices(words, k=rng.randint(2, 12))) for _ in range(rng.randint(1, 3))]
                for _ in range(12)]
    options = [{}, {"normalize": False, "pool": "max"}]  # two option sets in flight: each encoded with its own

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await asyncio.gather(*[
                c.post("/v1/embeddings", json={"model": "bert", "input": texts, **options[i % 2]})
                for i, texts in enumerate(requests)
            ])

    answers = asyncio.run(go())
    bert = lmforge.load(folders["bert"])
    for i, (texts, r) in enumerate(zip(requests, answers)):
        assert r.status_code == 200, r.text
        got = np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        want = encode(bert, texts, normalize=True) if i % 2 == 0 else encode(bert, texts, pool="max")
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5  # padded beside other texts
        assert r.json()["usage"]["prompt_tokens"] == sum(len(bert.tokenizer.encode(t)) for t in texts)
    batcher = app.state.server.batchers[("bert", "encode")]
    assert batcher.items == sum(map(len, requests)) and batcher.calls < len(requests)


def test_micro_batcher_isolates_a_failing_request():
    from lmforge.serve.batching import MicroBatcher

    def square(items):
        if "bad" in items:
            raise ValueError("bad item")
        return [x * x for x in items]

    batcher = MicroBatcher(square, max_batch=8, wait_s=0.05)

    async def go():
        jobs = [batcher.submit([1, 2]), batcher.submit(["bad"]), batcher.submit([3])]
        return await asyncio.gather(*jobs, return_exceptions=True)

    ok1, bad, ok2 = asyncio.run(go())
    assert ok1 == [1, 4] and ok2 == [9] and isinstance(bad, ValueError)
    assert batcher.calls == 4  # one failed batch of three requests, then each alone
    single = MicroBatcher(square, max_batch=1, wait_s=0.05)

    async def go1():
        return await asyncio.gather(*[single.submit([k]) for k in range(5)])

    assert asyncio.run(go1()) == [[0], [1], [4], [9], [16]] and single.calls == 5


def _entries(folders, names):
    from lmforge.serve.registry import open_entry

    return {n: open_entry(folders[n], n) for n in names}


def test_curves_follow_a_growing_metrics_file(client, folders):
    r = client.get("/v1/curves/training").json()
    assert r["lines"] == 3 and [e["step"] for e in r["events"]] == [1, 2, 3]
    with open(folders["training"] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "split": "val", "loss": 4.5, "metrics": {"ppl": 90.0}}) + "\n")
        f.write('{"step": 5, "split": "tr')  # half written: left for the next poll
    r = client.get("/v1/curves/training", params={"after": 3}).json()
    assert r["lines"] == 4 and r["events"] == [{"step": 4, "split": "val", "loss": 4.5, "metrics": {"ppl": 90.0}}]
    with open(folders["training"] / "metrics.jsonl", "a") as f:
        f.write('ain", "loss": 4.6, "metrics": {}}\n')
    r = client.get("/v1/curves/training", params={"after": 4}).json()
    assert r["lines"] == 5 and [e["step"] for e in r["events"]] == [5]


# -- a real uvicorn server: load test and the playground in Chromium -------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def live(folders):
    """`lmforge serve` in its own process on a loopback port; yields (base url, pid)."""
    import httpx

    port = _free_port()
    names = ["w2v", "elmo", "gpt", "bert", "run-cls", "run-qa", "training"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmforge.cli",
            "-q",
            "serve",
            *[str(folders[n]) for n in names],
            "--port",
            str(port),
            "--max-generations",
            "8",
            "--max-new-tokens",
            "48",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(0.3)
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


@pytest.mark.slow
def test_load_240_requests_from_8_clients(live, folders):
    import httpx

    base, pid = live
    texts = [f"{w} {f} python" for w in POS + NEG for f in ("the", "a")]
    bert, run = lmforge.load(folders["bert"]), load_run(folders["run-cls"])
    gpt = lmforge.load(folders["gpt"])
    want_fm = {t: bert.fill_mask(t + " [MASK] .", top_k=3) for t in texts}
    want_pred = {
        t: run.predict(TaskData("classify", [example_from_fields("classify", t)], run.labels), use_cache=False)[0]
        for t in texts
    }
    want_cos = {t: [r.pairs[(0, 1)] for r in word_similarities(bert, [t, SNAKE], "python")] for t in texts}
    want_gen = {t: generate_text(gpt, t, max_new_tokens=6) for t in texts[:4]}

    def request(c: httpx.Client, k: int) -> bool:
        t = texts[k % len(texts)]
        kind = k % 4
        if kind == 0:
            r = c.post("/v1/fill-mask", json={"model": "bert", "text": t + " [MASK] .", "top_k": 3}).json()
            return [[(x["token"], x["prob"]) for x in m] for m in r["masks"]] == want_fm[t]
        if kind == 1:
            r = c.post("/v1/predict", json={"model": "run-cls", "text": t}).json()["prediction"]
            return r["label"] == want_pred[t]["label"] and r["probs"] == pytest.approx(want_pred[t]["probs"], abs=2e-5)
        if kind == 2:
            r = c.post("/v1/embed", json={"model": "bert", "texts": [t, SNAKE], "word": "python"}).json()
            return [x["pairs"][0]["cosine"] for x in r["rows"]] == pytest.approx(want_cos[t], abs=2e-6)
        t = texts[k % 4]
        return (
            c.post("/v1/generate", json={"model": "gpt", "prompt": t, "max_new_tokens": 6}).json()["text"]
            == want_gen[t]
        )

    def client_loop(cid: int, n: int, results: list) -> None:
        with httpx.Client(base_url=base, timeout=60) as c:
            for i in range(n):
                try:
                    results.append(request(c, cid * 1000 + i))
                except Exception as e:  # a lost or broken answer is a failure, counted below
                    results.append(repr(e))

    def wave(n_per_client: int) -> list:
        results: list = []
        threads = [threading.Thread(target=client_loop, args=(c, n_per_client, results)) for c in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        return results

    wave(5)  # warm-up: lazy allocations, thread pools
    before = _rss(pid)
    t0 = time.monotonic()
    results = wave(30)
    took = time.monotonic() - t0
    after = _rss(pid)
    assert len(results) == 240 and all(r is True for r in results), [r for r in results if r is not True][:3]
    assert after - before < max(64 << 20, 0.15 * before), (before, after)  # flat within 64 MB / 15 %
    print(f"240 requests from 8 clients in {took:.1f} s; RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MB")


@pytest.mark.slow
def test_playground_in_chromium(live, folders, tmp_path):
    from playwright.sync_api import sync_playwright

    base, _ = live
    sentences = ["A python is a large snake.", "I wrote the tool in Python."]
    cli = cli_cosines([folders[n] for n in ("w2v", "elmo", "bert")], sentences, "python")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            page.wait_for_selector("body[data-loaded='1']", timeout=60000)
            # the seed pair is preloaded and compared on load
            assert page.input_value("#poly-a") == SNAKE and page.input_value("#poly-b") == LANG
            assert page.locator("td.cos[data-model='w2v']").inner_text() == "1.0000"
            assert page.locator("#poly-chart svg path[data-series]").count() == 4  # w2v, elmo, gpt, bert
            # fill the form with other sentences: the page shows what `lmforge embed` prints
            page.fill("#poly-a", "A python is a large snake.")
            page.fill("#poly-b", "I wrote the tool in Python.")
            page.click("#poly-run")
            page.wait_for_function(
                "document.getElementById('poly-status').textContent.includes('compared') && "
                "document.querySelector('td.cos[data-model=elmo]') !== null"
            )
            page.wait_for_timeout(200)
            shown = {
                (c.get_attribute("data-model"), c.get_attribute("data-layer")): c.inner_text()
                for c in page.locator("td.cos").all()
                if c.get_attribute("data-model") != "gpt"
            }
            assert shown == cli
            assert page.locator("#proj-chart svg circle").count() == 6
            # a streamed generation
            page.fill("#gen-prompt", "The python")
            page.fill("#gen-max", "24")
            page.click("#gen-run")
            page.wait_for_selector("#gen-status[data-state='done']", timeout=60000)
            gpt = lmforge.load(folders["gpt"])
            assert page.inner_text("#gen-text") == generate_text(gpt, "The python", max_new_tokens=24)
            assert int(re.search(r"(\d+) streamed", page.inner_text("#gen-status")).group(1)) >= 3
            # a prediction
            page.select_option("#pred-model", "run-cls")
            page.fill("#pred-text", "a good name")
            page.click("#pred-run")
            page.wait_for_selector("#pred-status[data-state='done']")
            run = load_run(folders["run-cls"])
            want = run.predict(
                TaskData("classify", [example_from_fields("classify", "a good name")], run.labels), use_cache=False
            )[0]
            assert page.inner_text("#pred-label") == want["label"]
            # the curves of a folder being trained, picking up new events while the page polls
            page.select_option("#curve-model", "training")
            page.wait_for_selector("#curve-chart[data-events]")
            n_events = int(page.get_attribute("#curve-chart", "data-events"))
            assert n_events >= 3
            with open(folders["training"] / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": 9, "split": "val", "loss": 4.0, "metrics": {}}) + "\n")
            page.wait_for_selector("#curve-chart[data-last-step='9']", timeout=10000)
            assert int(page.get_attribute("#curve-chart", "data-events")) == n_events + 1
            shot = tmp_path / "playground.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20000
        finally:
            browser.close()
