"""``lmforge serve``'s OpenAI-compatible routes, driven by the real ``openai`` Python client against a uvicorn
server on a free loopback port: embeddings equal ``lmforge.models.vectors.encode``'s, greedy completions equal
``lmforge generate``'s, a streamed completion equals the unstreamed one, errors arrive as the client's
``APIStatusError`` subclasses.  Also the helpers the guard tests share (tiny folders, servers in a thread or
in their own process)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openai
import pytest
from test_transfer_families import tiny_bert, tiny_elmo, tiny_gpt, tiny_word2vec

import lmforge
from lmforge.cli import main
from lmforge.models.vectors import encode

KEY = "test-key-0123456789"
TEXTS = ["He got bit by Python.", "Python is my favorite programming language.", "the name of a snake"]


# -- helpers shared with test_serve_guard.py ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_folders(root: Path, wordpiece, bpe) -> dict[str, Path]:
    """Tiny model folders of every family, named as the docs' examples name them: bert, gpt, elmo, w2v."""
    out = {}
    for name, model, tok in (
        ("bert", tiny_bert(wordpiece), wordpiece),
        ("gpt", tiny_gpt(bpe), bpe),
        ("elmo", tiny_elmo(wordpiece), wordpiece),
        ("w2v", tiny_word2vec(wordpiece), wordpiece),
    ):
        out[name] = root / name
        model.save_pretrained(out[name], tok)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer) -> dict[str, Path]:
    return build_folders(tmp_path_factory.mktemp("serve-openai"), wordpiece_tokenizer, bpe_tokenizer)


@contextlib.contextmanager
def uvicorn_thread(app, port: int | None = None):
    """Serve ``app`` with uvicorn in a thread of this process on 127.0.0.1; yields the base URL."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def serve_process(args: list[str], env: dict | None = None, port: int | None = None):
    """``lmforge serve ARGS --port PORT`` in its own process; yields (base URL, Popen) once /health answers."""
    import httpx

    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmforge.cli", "serve", *map(str, args), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
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
                proc.kill()
                out, err = proc.communicate()
                raise RuntimeError(f"the server did not start (exit {proc.returncode}): {err[-2000:]}")
            time.sleep(0.2)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def openai_entries(folders: dict[str, Path]):
    from lmforge.serve.registry import open_entries

    return open_entries([folders[n] for n in ("bert", "gpt", "elmo", "w2v")])


# -- the OpenAI routes -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(folders):
    """One server with an API key, on a free port; yields (base URL, loaded entries)."""
    from lmforge.serve import ServeAccess, ServeLimits, create_app, loopback_hosts

    entries = openai_entries(folders)
    access = ServeAccess(api_key=KEY, allowed_hosts=loopback_hosts("127.0.0.1"))
    app = create_app(entries, ServeLimits(max_new_tokens=64, max_texts=8), access)
    with uvicorn_thread(app) as base:
        yield base, entries


@pytest.fixture(scope="module")
def client(served):
    base, _ = served
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.mark.parametrize("name", ["bert", "gpt", "elmo", "w2v"])
def test_embeddings_equal_vectors_encode(client, folders, name):
    model = lmforge.load(folders[name])
    want = encode(model, TEXTS, normalize=True)
    got = client.embeddings.create(model=name, input=TEXTS)  # the client asks for base64 and decodes it
    assert got.object == "list" and got.model == name and [d.index for d in got.data] == [0, 1, 2]
    assert np.array_equal(np.array([d.embedding for d in got.data], dtype=np.float32), want)
    n_tokens = sum(len(model.tokenizer.encode(t)) for t in TEXTS)
    assert got.usage.prompt_tokens == got.usage.total_tokens == n_tokens
    one = client.embeddings.create(model=name, input=TEXTS[1], encoding_format="float")  # alone, as encode([t])
    want_one = encode(model, TEXTS[1:2], normalize=True)[0]
    assert len(one.data) == 1 and np.array_equal(np.array(one.data[0].embedding, dtype=np.float32), want_one)
    raw = client.embeddings.create(
        model=name, input=TEXTS[:1], extra_body={"normalize": False, "pool": "max", "layer": 0}
    )
    assert np.array_equal(
        np.array(raw.data[0].embedding, dtype=np.float32), encode(model, TEXTS[:1], layer=0, pool="max")[0]
    )


def test_embeddings_base64_is_little_endian_float32(served, folders):
    import httpx

    base, _ = served
    r = httpx.post(
        base + "/v1/embeddings",
        json={"model": "bert", "input": "a python", "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(vec, encode(lmforge.load(folders["bert"]), ["a python"], normalize=True)[0])


def _cli_generate(capsys, folder: Path, prompt: str, n: int) -> str:
    capsys.readouterr()
    assert main(["-q", "generate", str(folder), "--prompt", prompt, "--max-new-tokens", str(n)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(prompt) and printed.endswith("\n")
    return printed[len(prompt) : -1]


def test_greedy_completion_equals_lmforge_generate(client, folders, capsys):
    prompts = ["The python", "In the beginning"]
    got = client.completions.create(model="gpt", prompt=prompts, max_tokens=14, temperature=0)
    assert got.object == "text_completion" and got.model == "gpt" and len(got.choices) == 2
    tok = lmforge.load(folders["gpt"]).tokenizer
    for i, (choice, prompt) in enumerate(zip(got.choices, prompts)):
        assert choice.index == i and choice.finish_reason == "length"
        assert choice.text == _cli_generate(capsys, folders["gpt"], prompt, 14)
    assert got.usage.completion_tokens == 28
    assert got.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens


def test_streamed_completion_equals_the_unstreamed_one(client):
    kwargs = dict(model="gpt", prompt="The python", max_tokens=20, temperature=0.9, top_p=0.95, seed=11)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert all(c.object == "text_completion" for c in chunks) and len(chunks) >= 3
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_stop_strings_and_n(client, folders):
    from lmforge.generation import generate_text

    gpt = lmforge.load(folders["gpt"])
    full = generate_text(gpt, "The python", max_new_tokens=30)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    got = client.completions.create(model="gpt", prompt="The python", max_tokens=30, temperature=0, stop=stop)
    assert got.choices[0].text == full[: full.index(stop)] and got.choices[0].finish_reason == "stop"
    sampled = client.completions.create(model="gpt", prompt="The python", max_tokens=8, temperature=1.0, n=2, seed=5)
    assert [c.index for c in sampled.choices] == [0, 1]
    assert [c.text for c in sampled.choices] == [
        generate_text(gpt, "The python", max_new_tokens=8, temperature=1.0, seed=s) for s in (5, 6)
    ]


def test_models_list(client, folders):
    models = client.models.list()
    assert [m.id for m in models.data] == ["bert", "gpt", "elmo", "w2v"]
    gpt = client.models.retrieve("gpt")
    assert gpt.object == "model" and gpt.owned_by == "lmforge"
    extra = gpt.model_extra
    assert extra["family"] == "gpt" and "generate" in extra["supports"]
    assert extra["parameters"] == lmforge.load(folders["gpt"]).num_parameters()


def test_errors_are_openai_errors_with_the_right_status(served, client):
    base, _ = served
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert "no model named 'nope'" in e.value.message and e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="bert", prompt="hi", max_tokens=2)
    assert "needs a GPT" in e.value.message and e.value.body["param"] == "model"
    bad = [
        (dict(max_tokens=65), "max_tokens"),
        (dict(max_tokens=2, seed=2**80), "seed"),
        (dict(max_tokens=2, temperature=-1), "temperature"),
        (dict(max_tokens=2, top_p=0), "top_p"),
        (dict(max_tokens=2, n=0), "n"),
        (dict(max_tokens=2, logprobs=2), "logprobs"),
    ]
    for kwargs, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="gpt", prompt="hi", **kwargs)
        assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error", kwargs
        assert "\n" not in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="gpt", prompt=[1, 2, 3], max_tokens=2)
    assert "token ids" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="bert", input=[[5, 6]])
    assert "token ids" in e.value.message and e.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="bert", input="x", encoding_format="int8")  # type: ignore[arg-type]
    assert e.value.body["param"] == "encoding_format"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.models.list()
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="bert", input="x")
    # the server still serves
    assert client.completions.create(model="gpt", prompt="hi", max_tokens=2).choices[0].text is not None


def test_raw_error_shape(served):
    import httpx

    base, _ = served
    r = httpx.post(base + "/v1/completions", json={"model": "gpt", "prompt": "hi", "temperature": "hot"},
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == "temperature"
    assert r.headers["content-type"] == "application/json"
    r = httpx.post(base + "/v1/embeddings", content=b'{"model": "bert", "input": NaN}',
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = httpx.get(base + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    stream = httpx.post(base + "/v1/completions", json={"model": "gpt", "prompt": "hi", "max_tokens": 3,
                                                         "stream": True},
                        headers={"Authorization": f"Bearer {KEY}"})
    lines = [ln for ln in stream.text.split("\n\n") if ln]
    assert stream.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][len("data: "):])["object"] == "text_completion"


def test_openai_routes_lmforge_does_not_serve_answer_in_openais_shape(served, client):
    import httpx

    base, _ = served
    with pytest.raises(openai.NotFoundError) as e:  # the openai client reads the answer as its own error
        client.chat.completions.create(model="gpt", messages=[{"role": "user", "content": "hi"}])
    body = e.value.body
    assert e.value.status_code == 404 and body["type"] == "invalid_request_error" and body["code"] == "unknown_url"
    assert "/v1/chat/completions" in body["message"] and "/v1/completions" in body["message"]
    # a path that is neither OpenAI's nor lmforge's keeps lmforge's shape
    r = httpx.post(base + "/v1/no-such-route", json={}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and r.json() == {"error": "no such endpoint: /v1/no-such-route (see /docs)"}
