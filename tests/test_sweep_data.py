"""Damaged data a run reads (issue 50, item 11): shard files are checked in full (ids against the vocabulary,
offsets that run forward) before training or evaluation, and a damaged features cache is computed again.

Every refusal is one line on stderr, exit status 2, no traceback, nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reliability_cli import cli, ok, refused

from lmforge.data import shard_check
from lmforge.data.shards import Shards
from lmforge.errors import DataError, LmforgeError
from lmforge.storage.files import load_safetensors, save_safetensors


def damaged(shards: Path, tmp_path: Path, name: str, change) -> Path:
    """A copy of ``shards`` whose file ``name`` is changed in place by ``change(memmap)`` (same size)."""
    out = tmp_path / f"shards-{name}"
    shutil.copytree(shards, out)
    meta = json.loads((out / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"]) if name.endswith("tokens.bin") else np.dtype(np.int64)
    arr = np.memmap(out / name, dtype=dtype, mode="r+")
    change(arr, meta)
    arr.flush()
    del arr
    return out


def test_an_id_beyond_the_vocabulary_in_val_is_refused_before_evaluation(bpe_shards, gpt_dir, tmp_path):
    """Before: an IndexError traceback in ``evaluate lm`` (only the first million train tokens were checked)."""
    def last_id_too_big(arr, meta):
        arr[-1] = meta["vocab_size"]

    bad = damaged(bpe_shards, tmp_path, "val.tokens.bin", last_id_too_big)
    line = refused(cli("evaluate", "lm", gpt_dir, "--data", bad, "--batches", "1", "--batch-size", "2"),
                   "val.tokens.bin", "token id", "prepare again")
    assert str(json.loads((bad / "meta.json").read_text())["vocab_size"]) in line
    ok(cli("evaluate", "lm", gpt_dir, "--data", bpe_shards, "--batches", "1", "--batch-size", "2"))


@pytest.mark.parametrize("name", ["train.documents.bin", "train.sentences.bin", "val.sentences.bin"])
def test_random_bytes_in_an_offsets_file_are_refused_before_training(wordpiece_shards, tmp_path, name):
    """Before: a ValueError traceback from the BERT sampler in ``pretrain``."""
    rng = np.random.default_rng(0)

    def random_bytes(arr, meta):
        arr[:] = rng.integers(-(2**62), 2**62, size=len(arr))

    bad = damaged(wordpiece_shards, tmp_path, name, random_bytes)
    refused(cli("pretrain", "bert", "--data", bad, "--out", tmp_path / "m", "--device", "cpu"), name,
            "prepare again")
    assert not (tmp_path / "m").exists()


def test_offsets_that_go_back_are_refused(wordpiece_shards, tmp_path):
    def swap_two(arr, meta):
        arr[1], arr[2] = int(arr[2]), int(arr[1])

    bad = damaged(wordpiece_shards, tmp_path, "train.sentences.bin", swap_two)
    with pytest.raises(DataError, match="goes back at entry 2"):
        Shards.open(bad)


def test_every_chunk_of_a_large_file_is_read(wordpiece_shards, tmp_path, monkeypatch):
    """The check reads in chunks; an id in the last chunk, and a step back across a chunk's end, are found."""
    monkeypatch.setattr(shard_check, "CHUNK", 7)
    Shards.open(wordpiece_shards)  # whole shards pass in chunks of 7

    def late_id(arr, meta):
        arr[len(arr) - 3] = 65535

    with pytest.raises(DataError, match="token id 65535"):
        Shards.open(damaged(wordpiece_shards, tmp_path, "train.tokens.bin", late_id))

    def back_at_a_chunk_end(arr, meta):
        arr[7] = int(arr[6]) - 1  # the step from entry 6 to 7 crosses the first chunk's end

    with pytest.raises(DataError, match="goes back at entry 7"):
        Shards.open(damaged(wordpiece_shards, tmp_path, "train.sentences.bin", back_at_a_chunk_end))


def test_a_nan_features_cache_is_computed_again(bert_dir, tmp_path):
    """Before: a features cache filled with NaN was a traceback (scikit-learn refused the vectors)."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"text {i} " + ("good fun" if i % 2 else "bad day"),
                                        "label": "pos" if i % 2 else "neg"}) + "\n" for i in range(24)))
    cache = tmp_path / "cache"
    args = ["finetune", bert_dir, "--task", "classify", "--mode", "features", "--train", data, "--test", data,
            "--cache-dir", cache, "--seed", "0"]
    ok(cli(*args, "--out", tmp_path / "clean"))
    (f,) = cache.glob("*.safetensors")
    t = load_safetensors(f)
    save_safetensors({**t, "vectors": torch.full_like(t["vectors"], float("nan"))}, f)
    ok(cli(*args, "--out", tmp_path / "again"))
    assert torch.isfinite(load_safetensors(f)["vectors"]).all()  # recomputed and saved whole
    clean, again = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("clean", "again"))
    assert clean["accuracy"] == again["accuracy"]


# -- 10: sizes bounded by what the machine can hold, said before allocation ----------------------------------------
@pytest.fixture
def eight_gib_free(monkeypatch):
    """A machine with 8 GiB free (the check reads the real figure; a fixed one keeps the test the same anywhere)."""
    import lmforge.utils

    monkeypatch.setattr(lmforge.utils, "available_memory", lambda: 8 * 2**30)


def test_a_vocabulary_too_large_for_memory_is_refused_before_training(tiny_corpus, tmp_path, eight_gib_free):
    """Before: ``tokenizer train --vocab-size 1000000000`` aborted (exit 134, a 70 GB allocation) and left its lock."""
    out = tmp_path / "tok"
    refused(cli("tokenizer", "train", tiny_corpus, "--kind", "bpe", "--vocab-size", "1000000000", "--out", out),
            "--vocab-size 1,000,000,000", "GiB", "8.0 GiB is free")
    assert not out.exists() and not list(tmp_path.glob(".*lock*"))
    ok(cli("tokenizer", "train", tiny_corpus, "--kind", "bpe", "--vocab-size", "300", "--out", out))


def test_a_batch_too_large_for_memory_is_refused_before_sampling(bpe_shards, gpt_dir, eight_gib_free):
    """Before: ``evaluate lm --batch-size 100000000`` grew without bound (9.4 GB after ten minutes)."""
    refused(cli("evaluate", "lm", gpt_dir, "--data", bpe_shards, "--batches", "1", "--batch-size", "100000000"),
            "100,000,000 rows", "GiB", "smaller batch size")
    ok(cli("evaluate", "lm", gpt_dir, "--data", bpe_shards, "--batches", "1", "--batch-size", "4"))


def test_check_memory_names_the_size_and_the_fix():
    from lmforge.utils import check_memory

    check_memory(2**30, "x", "y", available=2**31)  # fits
    with pytest.raises(LmforgeError, match=r"x needs at least 4.0 GiB of memory, but 2.0 GiB is free; y"):
        check_memory(4 * 2**30, "x", "y", available=2 * 2**30)


# -- 12: a full disk names what it could not write ---------------------------------------------------------------
@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB tmpfs already full (root only: skipped with the reason elsewhere), unmounted afterwards."""
    import subprocess

    from test_reliability import _try_mount

    full = tmp_path / "full"
    if not _try_mount(full, "size=16k"):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with open(full / "filler", "wb") as f:
            with pytest.raises(OSError):
                f.write(b"x" * 1_000_000)
                f.flush()
        yield full
    finally:
        subprocess.run(["umount", "-l", str(full)], capture_output=True)


def test_a_full_disk_under_stdout_names_the_standard_output(full_disk, wordpiece_tokenizer_dir):
    """Before: "no space left on the device holding ?" (the failed write named no file and the command no --out)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with open(full_disk / "out.txt", "w") as out:
        proc = subprocess.run([sys.executable, "-m", "lmforge.cli", "tokenizer", "encode", "--tokenizer",
                               str(wordpiece_tokenizer_dir), "hello world"], stdout=out, stderr=subprocess.PIPE,
                              text=True, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("lmforge tokenizer: error: no space left on the device holding the standard "
                                   "output; free some space or choose another folder")


def test_a_full_disk_names_the_output_folder_and_leaves_nothing(full_disk, tiny_corpus):
    """Before: "no space left on the device holding ?", and the lock's temporary file and an empty folder stayed."""
    out = full_disk / "tok"
    refused(cli("tokenizer", "train", tiny_corpus, "--kind", "bpe", "--vocab-size", "300", "--out", out),
            f"no space left on the device holding {full_disk};")  # the output is built beside it, in full_disk
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]
