"""Issue 50, item 12: weights of the same shapes swapped in from another model, or float tensors rewritten as
integers, loaded silently.  Now a weights file lmforge writes has its sha256 recorded in the folder's marker and
checked on every load, and a stored dtype the model cannot take without loss is refused.

Every refusal is one line on stderr, exit status 2, no traceback (the CLI); a server keeps what it serves and says
why the folder on disk is not it.  A folder written before the record (no hash) loads as before.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_reliability_cli import cli, ok, refused
from test_serve_openai import build_folders, uvicorn_thread
from test_sweep_inputs import BAD_BYTE
from test_transfer_families import tiny_bert

import lmforge
from lmforge.errors import CheckpointError, LmforgeError
from lmforge.serve import create_app
from lmforge.storage import writing
from lmforge.storage.files import file_sha256, save_safetensors
from lmforge.storage.folders import MARKER, recorded_weights

NOT_WRITTEN = "not the file lmforge wrote"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer, bpe_tokenizer) -> dict[str, Path]:
    out = build_folders(tmp_path_factory.mktemp("weights"), wordpiece_tokenizer, bpe_tokenizer)
    out["bert-1"] = out["bert"].parent / "bert-1"  # the same preset, other weights (seed 1)
    tiny_bert(wordpiece_tokenizer, seed=1).save_pretrained(out["bert-1"], wordpiece_tokenizer)
    return out


def copy(folder: Path, where: Path) -> Path:
    shutil.copytree(folder, where)
    return where


def rewrite(path: Path, change) -> None:
    """Rewrite the safetensors file ``path`` with ``change(name, tensor)`` applied to every tensor."""
    tensors = load_file(str(path))
    save_file({k: change(k, v) for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def forget_record(folder: Path) -> None:
    """Make ``folder`` what lmforge wrote before it recorded weights hashes."""
    data = json.loads((folder / MARKER).read_text())
    del data["sha256"]
    (folder / MARKER).write_text(json.dumps(data))


# -- the record ----------------------------------------------------------------------------------------------------
def test_a_save_records_the_hash_and_writes_the_same_bytes(folders, tmp_path):
    model = lmforge.load(folders["bert"])
    weights = folders["bert"] / "model.safetensors"
    assert recorded_weights(folders["bert"]) == {"model.safetensors": [file_sha256(weights)]}
    plain = tmp_path / "plain.safetensors"  # what a save wrote before the record: the bytes are unchanged
    state = {k: v for k, v in model.state_dict().items() if k not in set(model.tied_weight_keys())}
    save_safetensors(state, plain, metadata={"format": "pt", "model_type": "bert"})
    assert plain.read_bytes() == weights.read_bytes()


@pytest.mark.parametrize("family", ["bert", "gpt", "elmo", "w2v"])
def test_a_folder_without_the_record_loads_as_before(folders, family, tmp_path):
    folder = copy(folders[family], tmp_path / family)
    forget_record(folder)
    a, b = lmforge.load(folders[family]), lmforge.load(folder)
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(v, w), k
    (folder / MARKER).unlink()
    lmforge.load(folder)


# -- weights of another model ----------------------------------------------------------------------------------------
def test_same_shape_weights_of_another_model_are_refused(folders, tmp_path):
    folder = copy(folders["bert"], tmp_path / "bert")
    shutil.copyfile(folders["bert-1"] / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=NOT_WRITTEN):
        lmforge.load(folder)
    line = refused(cli("fill-mask", folder, "the [MASK] ."), NOT_WRITTEN, "model.safetensors", "re-run")
    assert str(folder) in line
    refused(cli("embed", folder, "a python here", "the python", "--word", "python"), NOT_WRITTEN)
    # the message's way out: a file replaced on purpose loads once the record is gone
    (folder / MARKER).unlink()
    assert torch.equal(lmforge.load(folder).cls.predictions.bias, lmforge.load(folders["bert-1"]).cls.predictions.bias)


def test_weights_changed_in_place_are_refused(folders, tmp_path):
    folder = copy(folders["gpt"], tmp_path / "gpt")
    rewrite(folder / "model.safetensors", lambda k, v: v * 1.01 if v.is_floating_point() else v)
    refused(cli("generate", folder, "--prompt", "the python", "--max-new-tokens", "2"), NOT_WRITTEN)


def test_a_server_keeps_its_model_when_the_weights_are_swapped(folders, tmp_path):
    served = copy(folders["bert"], tmp_path / "bert")
    app = create_app([served])
    body = {"model": "bert", "texts": ["the python"]}
    with uvicorn_thread(app) as base:
        want = httpx.post(base + "/v1/embed", json=body).json()
        shutil.copyfile(folders["bert-1"] / "model.safetensors", served / "model.safetensors")
        answer = httpx.post(base + "/v1/embed", json=body)
        models = httpx.get(base + "/v1/models").json()["data"]
        with pytest.raises(LmforgeError, match=NOT_WRITTEN):  # `lmforge serve` on such a folder: one line, exit 2
            create_app([served])
        (served / MARKER).unlink()  # the way out the message names: the new weights are served
        other = httpx.post(base + "/v1/embed", json=body).json()
        after = httpx.get(base + "/v1/models").json()["data"]
    assert answer.status_code == 200 and answer.json() == want  # the model in memory, as loaded
    assert NOT_WRITTEN in models[0]["stale"]
    assert after[0]["stale"] is None and after[0]["reloads"] == 1 and other != want


def test_a_run_with_another_head_is_refused(model_folders, tmp_path):
    run = copy(model_folders["run"], tmp_path / "run")
    assert "head.safetensors" in recorded_weights(run)
    rewrite(run / "head.safetensors", lambda k, v: torch.flip(v, dims=[0]) if v.is_floating_point() else v)
    refused(cli("predict", run, "--text", "a python"), NOT_WRITTEN, "head.safetensors")


def test_an_export_whose_weights_were_replaced_is_not_imported(folders, tmp_path):
    exports = {name: tmp_path / f"export-{name}" for name in ("bert", "bert-1")}
    for name, out in exports.items():
        ok(cli("export-hf", folders[name], "--out", out))
        assert recorded_weights(out)["model.safetensors"] == [file_sha256(out / "model.safetensors")]
    shutil.copyfile(exports["bert-1"] / "model.safetensors", exports["bert"] / "model.safetensors")
    refused(cli("import-hf", exports["bert"], "--out", tmp_path / "m"), NOT_WRITTEN, "export-bert")
    assert not (tmp_path / "m").exists()


# -- dtypes the model cannot take ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64])
def test_a_float_weight_stored_as_another_dtype_is_refused(folders, tmp_path, dtype):
    folder = copy(folders["bert"], tmp_path / "bert")
    forget_record(folder)  # as written before the record: the dtype check alone finds it
    name = "bert.embeddings.word_embeddings.weight"
    rewrite(folder / "model.safetensors", lambda k, v: (v * 100).to(dtype) if k == name else v)
    stored = str(dtype).removeprefix("torch.")
    with pytest.raises(CheckpointError, match=f"'{name}' is {stored} but the model holds float32"):
        lmforge.load(folder)
    refused(cli("fill-mask", folder, "the [MASK] ."), name, stored, "float32")


def test_a_half_precision_copy_loads_as_float32(folders, tmp_path):
    folder = copy(folders["bert"], tmp_path / "bert")
    forget_record(folder)
    rewrite(folder / "model.safetensors", lambda k, v: v.to(torch.bfloat16) if v.is_floating_point() else v)
    model = lmforge.load(folder)
    want = lmforge.load(folders["bert"]).state_dict()
    for k, v in model.state_dict().items():
        assert v.dtype == want[k].dtype and torch.equal(v, want[k].to(torch.bfloat16).to(v.dtype)), k


def test_a_run_head_stored_as_integers_is_refused(model_folders, tmp_path):
    run = copy(model_folders["run"], tmp_path / "run")
    (run / MARKER).unlink()
    rewrite(run / "head.safetensors", lambda k, v: (v * 100).long() if v.is_floating_point() else v)
    refused(cli("predict", run, "--text", "a python"), "head.safetensors", "int64", "float32")


# -- a kill while a model folder's weights are replaced in place -----------------------------------------------------
@pytest.mark.parametrize("at", ["rename", "second record"])
def test_a_kill_around_the_rename_leaves_weights_the_record_accepts(folders, tmp_path, monkeypatch, at):
    folder = copy(folders["bert"], tmp_path / "bert")
    before = file_sha256(folder / "model.safetensors")
    other = lmforge.load(folders["bert-1"])
    real_replace, real_record = writing.os.replace, writing.record_weights
    calls = []

    def replace(a, b):  # os.replace of every module: only the weights' own rename is killed
        if at == "rename" and Path(b).name == "model.safetensors":
            raise KeyboardInterrupt  # the kill: the record already holds both hashes
        real_replace(a, b)

    def record(*args):
        calls.append(args)
        if at == "second record" and len(calls) == 2:
            raise KeyboardInterrupt
        real_record(*args)

    monkeypatch.setattr(writing.os, "replace", replace)
    monkeypatch.setattr(writing, "record_weights", record)
    with pytest.raises(KeyboardInterrupt):
        other.save_pretrained(folder)
    monkeypatch.undo()
    assert len(recorded_weights(folder)["model.safetensors"]) == 2
    after = file_sha256(folder / "model.safetensors")
    assert (after == before) == (at == "rename")
    lmforge.load(folder)
    assert not list(folder.glob(".model.safetensors.*.tmp"))  # the staged file went with the kill
    other.save_pretrained(folder)  # the next save leaves one hash
    assert recorded_weights(folder)["model.safetensors"] == [file_sha256(folder / "model.safetensors")]


def test_a_reader_never_refuses_weights_a_writer_is_replacing(folders, tmp_path):
    """A server reloading a folder a pretraining re-saves: the record it reads is the one before or after."""
    import threading

    folder = copy(folders["bert"], tmp_path / "bert")
    models = [lmforge.load(folders["bert"]), lmforge.load(folders["bert-1"])]
    done, errors = threading.Event(), []

    def writer():
        try:
            for i in range(40):
                models[i % 2].save_pretrained(folder)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    loads = 0
    while not done.is_set():
        try:
            lmforge.load(folder)
            loads += 1
        except CheckpointError as e:
            errors.append(str(e))
    thread.join()
    assert not errors and loads > 0, errors[:1]


def test_a_reader_completing_a_tokenizer_save_the_writer_completes_too(tmp_path, monkeypatch):
    """Found by the sweep: a reader (``Tokenizer.load``) finishing a committed save while the writer moves the same
    files failed with "cut short and cannot be completed (No such file or directory)"."""
    from lmforge.storage.files import TOGETHER, finish_together

    (tmp_path / TOGETHER).mkdir()
    for name in ("a.json", "b.json", ".remove.json"):
        (tmp_path / TOGETHER / name).write_text("[]" if name == ".remove.json" else name)
    real = os.replace

    def writer_first(src, dst):  # the writer moves a.json between the reader's listing and its own move
        if Path(src).name == "a.json" and Path(src).exists():
            real(src, dst)
        real(src, dst)

    monkeypatch.setattr(os, "replace", writer_first)
    assert finish_together(tmp_path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json"] and (tmp_path / "b.json").read_text() == "b.json"


# -- item 3: a word that is not UTF-8 ----------------------------------------------------------------------------
def test_neighbors_of_a_word_that_is_not_utf8_is_one_line(folders):
    refused(cli("neighbors", folders["w2v"], BAD_BYTE), "the word", "0xff", "UTF-8")
