"""One policy for an existing output, in every command that writes (docs/cli.md, "Existing outputs").

For each writing command: an output that exists is refused (exit 2, one line naming --overwrite, nothing
changed); with --overwrite the new output is complete and the files the user put in an output folder are
kept; a write that fails half-way leaves the old output as it was.  And a transfer run that diverges is
never saved.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_reliability_cli import cli, digest, ok, refused
from test_transfer_families import rows

from lmforge.storage.folders import MARKER, folder_kind


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("labelled") / "cls.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows(24, 3)))
    return f


@pytest.fixture(scope="module")
def hf_export(tmp_path_factory, gpt_dir) -> Path:
    out = tmp_path_factory.mktemp("hf") / "export"
    ok(cli("export-hf", gpt_dir, "--out", out))
    return out


@dataclass
class Writer:
    """A writing command: its argv for an output path, and whether that output is a folder (else a file)."""

    name: str
    argv: Callable[[dict, Path], list]
    folder: bool
    suffix: str = ""
    kind: str | None = None  # the folder's kind marker (None: a plain folder of files)


FT = ["--epochs", "1", "--batch-size", "8", "--max-len", "16", "--seed", "0", "--device", "cpu",
      "--precision", "fp32"]
WRITERS = [
    Writer("finetune", lambda f, out: ["finetune", f["gpt"], "--task", "classify", "--train", f["data"],
                                       "--test", f["data"], "--mode", "frozen", "--out", out, *FT], True, kind="run"),
    Writer("pretrain", lambda f, out: ["pretrain", "gpt", "--data", f["shards"], "--out", out, "--config", "tiny",
                                       "--device", "cpu", "--set", "max_steps=1", "n_positions=32", "batch_size=2",
                                       "eval_batches=1"], True, kind="model"),
    Writer("tokenizer", lambda f, out: ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", out,
                                        f["corpus"]], True, kind="tokenizer"),
    Writer("prepare", lambda f, out: ["prepare", "--tokenizer", f["bpe"], "--out", out, f["corpus"]], True,
           kind="shards"),
    Writer("export-hf", lambda f, out: ["export-hf", f["gpt"], "--out", out], True, kind="export"),
    Writer("import-hf", lambda f, out: ["import-hf", f["hf"], "--out", out], True, kind="model"),
    Writer("benchmark-data", lambda f, out: ["benchmark", "data", "en-tweets", "--out", out, "--n-train", "20",
                                             "--n-test", "10"], True),
    Writer("predict", lambda f, out: ["predict", f["run"], "--file", f["data"], "--out", out], False, ".jsonl"),
    Writer("evaluate-run", lambda f, out: ["evaluate", "run", f["run"], "--test", f["data"], "--out", out], False,
           ".jsonl"),
    Writer("encode", lambda f, out: ["encode", f["gpt"], "--file", f["texts"], "--out", out], False, ".npy"),
    Writer("benchmark-text", lambda f, out: ["benchmark", "text", "en-tweets", "--out", out], False, ".txt"),
    Writer("export-onnx", lambda f, out: ["export-onnx", f["gpt"], "--out", out], False, ".onnx"),
]


@pytest.fixture(scope="module")
def inputs(model_folders, bpe_shards, bpe_tokenizer_dir, tiny_corpus, labelled, hf_export) -> dict:
    return {"gpt": model_folders["gpt"], "run": model_folders["run"], "data": labelled,
            "texts": model_folders["texts"], "shards": bpe_shards, "bpe": bpe_tokenizer_dir, "corpus": tiny_corpus,
            "hf": hf_export}


def _state(path: Path) -> dict[str, str]:
    """What a user would compare: every file's content under a folder (the lock and marker aside), or one file's."""
    return digest(path) if path.is_dir() else {path.name: path.read_bytes().hex()}


def _existing(w: Writer, inputs: dict, tmp_path: Path) -> Path:
    """An output the command wrote before, holding (for a folder) the user's own notes and subfolder."""
    out = tmp_path / f"out{w.suffix}"
    ok(cli(*w.argv(inputs, out)))
    if w.folder:
        (out / "notes.txt").write_text("mine\n")
        (out / "sub").mkdir()
        (out / "sub" / "data.csv").write_text("a,b\n")
    return out


@pytest.mark.parametrize("w", WRITERS, ids=lambda w: w.name)
def test_an_existing_output_is_refused_and_left_as_it_was(w, inputs, tmp_path):
    out = _existing(w, inputs, tmp_path)
    before = _state(out)
    line = refused(cli(*w.argv(inputs, out)), "--overwrite")
    assert "already" in line or "holds" in line, line
    assert _state(out) == before


@pytest.mark.parametrize("w", [w for w in WRITERS if w.folder], ids=lambda w: w.name)
def test_a_folder_the_user_made_is_refused_and_overwrite_keeps_its_files(w, inputs, tmp_path):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine\n")
    (out / "sub" / "data.csv").write_text("a,b\n")
    if w.kind is None:  # a folder of plain files: only a file of the same name stands in the way
        ok(cli(*w.argv(inputs, out)))
    else:
        refused(cli(*w.argv(inputs, out)), "did not write", "--overwrite")
        ok(cli(*w.argv(inputs, out), "--overwrite"))
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "sub" / "data.csv").read_text() == "a,b\n"
    if w.kind is not None:
        assert folder_kind(out) == w.kind


@pytest.mark.parametrize("w", WRITERS, ids=lambda w: w.name)
def test_overwrite_replaces_the_output_whole_and_keeps_the_users_files(w, inputs, tmp_path):
    out = _existing(w, inputs, tmp_path)
    if w.folder:
        written = sorted(n for n in os.listdir(out) if n not in ("notes.txt", "sub", MARKER))
        stale = out / (written[0] if written else "x")
        os.utime(stale, (1, 1))  # the old output's file: the new one must be a new file
    else:
        out.write_bytes(b"the user's old file\n")
    ok(cli(*w.argv(inputs, out), "--overwrite"))
    if w.folder:
        assert (out / "notes.txt").read_text() == "mine\n" and (out / "sub" / "data.csv").read_text() == "a,b\n"
        assert sorted(n for n in os.listdir(out) if n not in ("notes.txt", "sub", MARKER)) == written
        assert stale.stat().st_mtime > 1
        assert not [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.")]  # no staging left
        if w.kind is not None:
            assert folder_kind(out) == w.kind
    else:
        assert out.read_bytes() != b"the user's old file\n" and out.stat().st_size > 0


@pytest.mark.parametrize("w", WRITERS, ids=lambda w: w.name)
def test_a_write_that_fails_halfway_leaves_the_old_output(w, inputs, tmp_path, monkeypatch):
    out = _existing(w, inputs, tmp_path)
    before = _state(out)
    real_replace, real_rename = os.replace, os.rename

    def full_disk(real):
        def call(src, dst, *a, **k):
            if str(tmp_path) in os.fspath(dst):  # every write under tmp_path ends in a rename: the disk is full
                raise OSError(errno.ENOSPC, "No space left on device", os.fspath(dst))
            return real(src, dst, *a, **k)
        return call

    monkeypatch.setattr(os, "replace", full_disk(real_replace))
    monkeypatch.setattr(os, "rename", full_disk(real_rename))
    refused(cli(*w.argv(inputs, out), "--overwrite"), "no space left")
    monkeypatch.undo()
    assert _state(out) == before
    assert not [n for n in os.listdir(out.parent) if n.startswith(f".{out.name}.old-")]


def test_an_output_that_is_an_input_is_refused_even_with_overwrite(inputs, tmp_path):
    data = tmp_path / "data.jsonl"
    shutil.copy(inputs["data"], data)
    before = data.read_bytes()
    refused(cli("predict", inputs["run"], "--file", data, "--out", data, "--overwrite"), "reads")
    assert data.read_bytes() == before


def test_a_file_the_user_made_in_an_old_run_folder_survives_its_replacement(inputs, tmp_path):
    w = WRITERS[0]
    out = _existing(w, inputs, tmp_path)
    (out / "my_labels.json").write_text("{}\n")  # a name a run folder never holds
    ok(cli(*w.argv(inputs, out), "--overwrite"))
    assert (out / "my_labels.json").read_text() == "{}\n"


def test_a_user_file_under_a_name_the_new_folder_writes_is_refused_before_any_work(inputs, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.json").write_text('{"mine": 1}\n')
    refused(cli(*WRITERS[0].argv(inputs, out), "--overwrite"), "metrics.json", "move or rename")
    assert (out / "metrics.json").read_text() == '{"mine": 1}\n'


# -- a run that diverges is never saved ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["finetune", "frozen"])
def test_a_diverging_finetune_saves_nothing_and_keeps_the_old_run(mode, inputs, tmp_path):
    out = tmp_path / "run"
    argv = ["finetune", inputs["gpt"], "--task", "classify", "--train", inputs["data"], "--test", inputs["data"],
            "--mode", mode, "--out", out, "--epochs", "2", "--batch-size", "8", "--max-len", "16", "--seed", "0",
            "--device", "cpu", "--precision", "fp32"]
    refused(cli(*argv, "--lr", "1e30"), "diverged", "NaN", "lower learning rate")
    assert not out.exists() and not list(tmp_path.glob(".run.*"))
    ok(cli(*argv))
    before = _state(out)
    refused(cli(*argv, "--lr", "1e30", "--overwrite"), "diverged")
    assert _state(out) == before
    metrics = json.loads((out / "metrics.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert metrics["train_loss"] == metrics["train_loss"]


def test_a_run_saved_with_nan_weights_is_refused_when_read(inputs, tmp_path):
    from safetensors.torch import load_file, save_file

    from lmforge.errors import LmforgeError
    from lmforge.serve import create_app

    run = tmp_path / "run"
    shutil.copytree(inputs["run"], run)  # a run an older lmforge saved after it diverged
    marker = json.loads((run / MARKER).read_text())
    del marker["sha256"]  # which recorded no hashes of its weights files
    (run / MARKER).write_text(json.dumps(marker))
    head = load_file(run / "head.safetensors")
    name = sorted(head)[0]
    head[name] = head[name] * float("nan")
    save_file(head, run / "head.safetensors")
    refused(cli("predict", run, "--text", "a fine day"), "NaN", "lower learning rate")
    with pytest.raises(LmforgeError, match="NaN"):  # nor served (it answered null probabilities)
        create_app([run])


@pytest.mark.parametrize("exchange", [True, False], ids=["swap", "two-renames"])
def test_a_kill_at_any_instant_of_an_overwrite_keeps_the_users_files(exchange, inputs, tmp_path):
    from test_reliability_cli import killed

    out = tmp_path / "export"
    ok(cli("export-hf", inputs["gpt"], "--out", out))
    (out / "notes.txt").write_text("mine\n")
    (out / "sub").mkdir()
    (out / "sub" / "data.csv").write_text("a,b\n")
    kills = 0
    for n in range(1, 10):
        if not killed(["export-hf", inputs["gpt"], "--out", out, "--overwrite"], out, n, exchange=exchange):
            break
        kills += 1
        ok(cli("import-hf", out, "--out", tmp_path / f"read{n}"))  # a reader puts back an old copy moved aside
        assert (out / "notes.txt").read_text() == "mine\n" and (out / "sub" / "data.csv").read_text() == "a,b\n", n
    assert kills >= 2
    ok(cli("export-hf", inputs["gpt"], "--out", out, "--overwrite"))
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "sub" / "data.csv").read_text() == "a,b\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".export.")]


def test_a_diverging_pretrain_overwrite_keeps_the_old_model(inputs, tmp_path):
    w = WRITERS[1]
    out = _existing(w, inputs, tmp_path)
    before = _state(out)
    line = refused(cli(*w.argv(inputs, out), "lr=1e30", "--overwrite"), "non-finite", "lower learning rate")
    assert ".tmp-" not in line and _state(out) == before
    assert not [n for n in os.listdir(tmp_path) if n.startswith(f".{out.name}.")]


def test_a_divergence_after_a_checkpoint_of_a_replacement_names_the_kept_folder(tmp_path):
    from lmforge.commands.pretrain import _replacement
    from lmforge.errors import LmforgeError

    out = tmp_path / "m"
    out.mkdir()
    with pytest.raises(LmforgeError) as e, _replacement(out, True) as tmp:
        raise LmforgeError(f"the weights became non-finite at step 9; nothing non-finite was saved; the last finite "
                           f"checkpoint (step 8) in {tmp} is kept: continue from it with --resume")
    assert str(tmp) not in str(e.value) and f"{out} is as it was" in str(e.value) and "--resume" not in str(e.value)
    assert not tmp.exists() and out.is_dir()
