"""An adversarial sweep's causes (issue 50, items 4-7 and 12), each made a general rule and tested here: a model
folder's tokenizer is checked by the hash its card records; every text entering the tokenizer is valid Unicode;
record fields of the wrong type are refused; the server answers bad bodies, hosts and preflights with 4xx JSON.

Every refusal is one line on stderr, exit status 2, no traceback (the CLI) or a 4xx JSON answer (the server).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from test_reliability_cli import cli, refused
from test_serve_openai import build_folders, uvicorn_thread

import lmforge
from lmforge.errors import LmforgeError
from lmforge.serve import ServeLimits, create_app
from lmforge.serve.guard import ServeAccess
from lmforge.storage.cards import update_card
from lmforge.storage.folders import MARKER
from lmforge.tokenization import Tokenizer

BAD_BYTE = b"a\xff".decode("utf-8", "surrogateescape")  # what Python makes of `--prompt $'a\xff'`


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer, bpe_shards, wordpiece_shards) -> dict[str, Path]:
    """Tiny model folders of every family; gpt's and bert's cards record the shards they were pretrained on."""
    out = build_folders(tmp_path_factory.mktemp("sweep"), wordpiece_tokenizer, bpe_tokenizer)
    update_card(out["gpt"], shards=bpe_shards)
    update_card(out["bert"], shards=wordpiece_shards)
    return out


def swap_two_tokens(folder: Path) -> None:
    """Replace ``folder``'s tokenizer with one of the same kind and size whose ids of two pieces are swapped."""
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = [t for t in vocab if t.isalpha() and len(t) > 2][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    hf = __import__("tokenizers").Tokenizer.from_str(json.dumps(data))
    Tokenizer(hf).save(folder)


# -- 4: the tokenizer a model was pretrained with --------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_a_swapped_tokenizer_of_the_same_kind_and_size_is_refused(folders, family, tmp_path):
    folder = tmp_path / family
    shutil.copytree(folders[family], folder)
    lmforge.load(folder)  # the card's hash is the tokenizer's own
    before = Tokenizer.load(folder)
    swap_two_tokens(folder)
    after = Tokenizer.load(folder)
    assert (after.kind, after.vocab_size) == (before.kind, before.vocab_size) and after.hash != before.hash
    with pytest.raises(LmforgeError, match="pretrained with"):
        lmforge.load(folder)
    if family == "gpt":
        refused(cli("generate", folder, "--prompt", "the python", "--max-new-tokens", "2"), "pretrained with")
    else:
        refused(cli("fill-mask", folder, "the [MASK] ."), "pretrained with")


def test_a_server_keeps_the_model_when_its_tokenizer_is_swapped(folders, tmp_path):
    """Before: a running server reloaded the swapped tokenizer and answered garbage."""
    served = tmp_path / "gpt"
    shutil.copytree(folders["gpt"], served)
    app = create_app([served])
    body = {"model": "gpt", "prompt": "the python", "max_new_tokens": 3}
    with uvicorn_thread(app) as base:
        want = httpx.post(base + "/v1/generate", json=body).json()["text"]
        swap_two_tokens(served)
        answer = httpx.post(base + "/v1/generate", json=body)
        models = httpx.get(base + "/v1/models").json()["data"]
    assert answer.status_code == 200 and answer.json()["text"] == want  # the copy in memory, as loaded
    assert "pretrained with" in models[0]["stale"]


# -- 7: text that is not valid Unicode --------------------------------------------------------------------------
def test_invalid_unicode_from_the_command_line_is_one_line(folders, tmp_path):
    refused(cli("generate", folders["gpt"], "--prompt", BAD_BYTE, "--max-new-tokens", "2"), "0xff", "UTF-8")
    refused(cli("fill-mask", folders["bert"], f"the [MASK] {BAD_BYTE}"), "0xff", "UTF-8")
    refused(cli("tokenizer", "encode", "--tokenizer", folders["bert"], BAD_BYTE), "0xff", "UTF-8")
    refused(cli("tokenizer", "encode", "--tokenizer", folders["gpt"], "ok\ud800"), "U+D800")


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"model": "gpt", "prompt": "a\ud800", "max_tokens": 2}),
    ("/v1/embeddings", {"model": "bert", "input": ["fine", "a\ud800"]}),
    ("/v1/fill-mask", {"model": "bert", "text": "a [MASK] \ud800"}),
    ("/v1/generate", {"model": "gpt", "prompt": "\udcff", "max_new_tokens": 2}),
    ("/v1/embed", {"model": "bert", "texts": ["a\ud800 b"]}),
])
def test_a_lone_surrogate_in_a_json_body_is_a_400(folders, route, body):
    """Before: HTTP 500 from inside ``tokenizers``."""
    from fastapi.testclient import TestClient

    app = create_app([folders["gpt"], folders["bert"]])

    raw = json.dumps(body)  # ensure_ascii writes the surrogate as \ud800, as a client would
    with TestClient(app) as client:
        r = client.post(route, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "surrogate" in json.dumps(r.json()) or "not UTF-8" in json.dumps(r.json())


def test_every_encode_checks_unicode(bpe_tokenizer):
    for call in (bpe_tokenizer.encode, bpe_tokenizer.encode_with_offsets, lambda t: bpe_tokenizer.encode_batch([t])):
        with pytest.raises(LmforgeError, match=r"U\+DFFF"):
            call("x\udfff")
    assert bpe_tokenizer.encode("caf\u00e9") == bpe_tokenizer.encode_batch(["caf\u00e9"])[0]


# -- 5: fields of the wrong type ---------------------------------------------------------------------------------
@pytest.mark.parametrize("record,words", [
    ({"text": 5, "label": "pos"}, ["'text'", "int"]),
    ({"text": "good", "label": ["pos"]}, ["'label'", "list"]),
    ({"text": "good", "label": {"a": 1}}, ["'label'", "dict"]),
    ({"text": ["a", "b"], "label": "pos"}, ["'text'", "list"]),
])
def test_a_jsonl_field_of_the_wrong_type_is_refused(folders, tmp_path, record, words):
    data = tmp_path / "train.jsonl"
    good = [{"text": f"text number {i}", "label": "pos" if i % 2 else "neg"} for i in range(6)]
    data.write_text("".join(json.dumps(r) + "\n" for r in [*good, record]))
    line = refused(cli("finetune", folders["bert"], "--task", "classify", "--train", data, "--test", data,
                       "--out", tmp_path / "run", "--epochs", "1"), *words)
    assert ":7" in line  # the line of the file
    assert not (tmp_path / "run").exists()


def test_whole_number_labels_keep_working(tmp_path):
    from lmforge.data.task_readers import load_text_task

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n{"text": "c", "label": 1.0}\n')
    assert load_text_task(data).labels == ["0", "1"]


# -- 6 and 12: the server's edges --------------------------------------------------------------------------------
@pytest.mark.parametrize("given,name", [
    ("http://lab.example.org", "lab.example.org"),
    ("https://lab.example.org:8443/", "lab.example.org"),
    ("lab.example.org:8000", "lab.example.org"),
    ("LAB.example.org", "lab.example.org"),
])
def test_allowed_host_takes_a_url(given, name):
    from lmforge.commands.serve import _host_name

    assert _host_name(given) == name


@pytest.mark.parametrize("given", ["http://", "http:lab", "a/b", "http://user@/x"])
def test_allowed_host_refuses_what_is_not_a_host(given):
    from lmforge.commands.serve import _host_name

    with pytest.raises(LmforgeError, match="not a host name"):
        _host_name(given)


def test_a_chunked_body_over_the_limit_is_413(folders):
    """Before: 400 "There was an error parsing the body" (the limit tripped while FastAPI read the body)."""
    app = create_app([folders["bert"]], ServeLimits(max_body_bytes=1000))
    big = json.dumps({"model": "bert", "text": "a [MASK] " + "x" * 100_000}).encode()
    small = json.dumps({"model": "bert", "text": "a [MASK] ."}).encode()

    def chunks(data: bytes):
        for i in range(0, len(data), 300):
            yield data[i:i + 300]

    with uvicorn_thread(app) as base:
        over = httpx.post(base + "/v1/fill-mask", content=chunks(big), headers={"Content-Type": "application/json"})
        fine = httpx.post(base + "/v1/fill-mask", content=chunks(small), headers={"Content-Type": "application/json"})
    assert over.status_code == 413 and "--max-body-bytes" in over.json()["error"]
    assert fine.status_code == 200 and fine.json()["masks"]


def test_a_refused_cors_preflight_is_json(folders):
    from fastapi.testclient import TestClient

    app = create_app([folders["bert"]], access=ServeAccess(allow_origins=("https://app.example",)))
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "DELETE"}
    with TestClient(app) as client:
        refused_ = client.options("/v1/fill-mask", headers=headers)
        allowed = client.options("/v1/fill-mask", headers={**headers, "Access-Control-Request-Method": "POST"})
    assert refused_.status_code == 400 and refused_.headers["content-type"] == "application/json"
    assert "preflight" in refused_.json()["error"]
    assert allowed.status_code == 200


# -- 9 and 12: one seed range, everywhere ------------------------------------------------------------------------
def test_a_seed_beyond_32_bits_reaches_scikit_learn(folders, tmp_path):
    """Before: ``finetune --seed 4294967296`` was a scikit-learn traceback (its random_state stops at 2**32-1)."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"text {i} " + ("good" if i % 2 else "bad"),
                                        "label": "pos" if i % 2 else "neg"}) + "\n" for i in range(20)))
    for seed in ("4294967296", str(2**63 - 1)):
        rc, _, err = cli("finetune", folders["bert"], "--task", "classify", "--train", data, "--mode", "frozen",
                         "--epochs", "1", "--seed", seed, "--out", tmp_path / f"run{seed[:3]}")
        assert rc == 0, err


@pytest.mark.parametrize("value", ["-1", str(2**63), str(2**70)])
def test_set_seed_and_seed_say_the_same_range(tmp_path, value):
    by_set = refused(cli("pretrain", "gpt", "--data", tmp_path / "d", "--out", tmp_path / "m",
                         "--set", f"seed={value}"))
    by_flag = refused(cli("generate", tmp_path, "--prompt", "a", "--seed", value))
    assert f"from 0 to {2**63 - 1}" in by_set and f"from 0 to {2**63 - 1}" in by_flag, (by_set, by_flag)


# -- 12: a stalled streaming client, a CSV field over 131,072 characters, rewritten weights ------------------------
def test_a_stalled_stream_gives_up_its_slot_and_a_reading_one_gets_every_piece():
    """Before: a streaming client that never read held its generation slot (two such clients blocked everyone)."""
    import asyncio

    from lmforge.serve.generating import AHEAD, Generations

    def work(slot, emit):
        for i in range(3 * AHEAD):
            emit(str(i))
        return "done"

    async def read_all(messages):
        async for kind, value in messages:
            yield f"{kind}:{value if kind == 'piece' else ''}|"

    async def stalled():
        gens = Generations(1, stall_s=0.2)
        gens.stream(work, read_all)  # nobody reads the response
        assert gens.running == 1
        for _ in range(100):
            await asyncio.sleep(0.05)
            if gens.running == 0:
                break
        return gens.running

    async def reading():
        gens = Generations(1, stall_s=0.2)
        response = gens.stream(work, read_all)
        text = "".join([chunk async for chunk in response.body_iterator])
        return text, gens.running

    assert asyncio.run(stalled()) == 0
    text, running = asyncio.run(reading())
    assert text == "".join(f"piece:{i}|" for i in range(3 * AHEAD)) + "done:|" and running == 0


def test_a_csv_field_over_the_csv_modules_limit_is_read(tmp_path):
    """Before: a text over 131,072 characters got a hint about quotes."""
    from lmforge.data.task_readers import load_text_task

    long = "word " * 40_000  # 200,000 characters
    data = tmp_path / "d.csv"
    data.write_text(f"text,label\n\"{long}\",pos\nshort,neg\n")
    loaded = load_text_task(data)
    assert [len(ex.text) for ex in loaded.examples] == [len(long), 5] and loaded.labels == ["neg", "pos"]


def test_float_weights_rewritten_as_integers_are_refused(folders, tmp_path):
    from lmforge.storage.files import load_safetensors, save_safetensors

    folder = tmp_path / "gpt"
    shutil.copytree(folders["gpt"], folder)
    (folder / MARKER).unlink()  # as an lmforge that recorded no weights hash wrote it: the dtype check finds it
    state = load_safetensors(folder / "model.safetensors")
    name = next(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)
    save_safetensors({**state, name: state[name].round().long()}, folder / "model.safetensors")
    with pytest.raises(LmforgeError, match=f"weight '{name}' is int64 but the model holds float32"):
        lmforge.load(folder)
    refused(cli("generate", folder, "--prompt", "the", "--max-new-tokens", "2"), "int64", "model.safetensors")
