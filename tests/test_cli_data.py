"""Data-related CLI behaviour: tokenizer train, prepare, demo; every bad input gives one line and exit 2."""

import json
import subprocess
import sys

import pytest

from lmforge.cli import main
from lmforge.data.shards import Shards
from lmforge.tokenization import Tokenizer


def _one_line_error(capsys, rc, *needles):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def bad_files(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"A fine first line.\nSecond line.\n\nna\xefve caf\xe9.\n")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01\x02PK\x03\x04" * 100)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n\n")
    return {"latin1": latin1, "binary": binary, "empty": empty, "dir": tmp_path, "missing": tmp_path / "nope.txt"}


def test_tokenizer_train_prints_final_vocab_size(tmp_path, capsys, tiny_corpus):
    out = tmp_path / "tok"
    rc = main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "300", "--out", str(out), str(tiny_corpus)])
    assert rc == 0
    printed = capsys.readouterr().out
    tok = Tokenizer.load(out)
    assert f"final vocabulary size {tok.vocab_size}" in printed and tok.vocab_size == 300
    rc = main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "400", "--no-lowercase", "--out",
               str(tmp_path / "bpe"), str(tiny_corpus)])
    assert rc == 0 and Tokenizer.load(tmp_path / "bpe").kind == "bpe"
    capsys.readouterr()
    rc = main(["tokenizer", "encode", "--tokenizer", str(out), "The", "snake"])
    shown = capsys.readouterr().out
    n = len(tok.encode("The snake"))
    assert rc == 0 and "'the'" in shown and f"{n} tokens" in shown and len(shown.splitlines()) == n + 1


@pytest.mark.parametrize(
    "case,needles",
    [
        ("missing", ["file not found", "nope.txt"]),
        ("dir", ["lies inside", "the folder this command reads"]),  # --out is inside the folder read
        ("latin1", ["latin1.txt line 4", "--encoding-errors replace"]),
        ("binary", ["binary", "weights.bin"]),
        ("empty", ["empty"]),
    ],
)
def test_tokenizer_train_bad_input(tmp_path, capsys, bad_files, case, needles):
    rc = main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "300", "--out", str(tmp_path / "t"),
               str(bad_files[case])])
    _one_line_error(capsys, rc, "lmforge tokenizer: error:", *needles)


@pytest.mark.parametrize(
    "case,needles",
    [
        ("missing", ["file not found", "nope.txt"]),
        ("dir", ["lies inside", "the folder this command reads"]),  # --out is inside the folder read
        ("latin1", ["latin1.txt line 4", "--encoding-errors replace"]),
        ("binary", ["binary", "weights.bin"]),
        ("empty", ["corpus is empty"]),
    ],
)
def test_prepare_bad_input(tmp_path, capsys, bad_files, wordpiece_tokenizer_dir, case, needles):
    out = tmp_path / "shards"
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(out), str(bad_files[case])])
    _one_line_error(capsys, rc, "lmforge prepare: error:", *needles)
    assert not out.exists()


@pytest.mark.parametrize("kind,size", [("wordpiece", 4), ("wordpiece", 30), ("bpe", 100)])
def test_vocab_size_too_small(tmp_path, capsys, tiny_corpus, kind, size):
    rc = main(["tokenizer", "train", "--kind", kind, "--vocab-size", str(size), "--out", str(tmp_path / "t"),
               str(tiny_corpus)])
    _one_line_error(capsys, rc, "too small")
    assert not (tmp_path / "t").exists()


def test_prepare_replace_and_summary(tmp_path, capsys, bad_files, tiny_corpus, wordpiece_tokenizer_dir):
    out = tmp_path / "shards"
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(out), "--encoding-errors",
               "replace", "--val-fraction", "0.2", str(tiny_corpus), str(bad_files["latin1"])])
    assert rc == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert f"{meta['splits']['train']['tokens']:,} tokens" in printed and "val" in printed
    assert Shards.open(out).meta["encoding_errors"] == "replace"


def test_prepare_wrong_tokenizer_folder(tmp_path, capsys, tiny_corpus):
    rc = main(["prepare", "--tokenizer", str(tmp_path / "none"), "--out", str(tmp_path / "s"), str(tiny_corpus)])
    _one_line_error(capsys, rc, "tokenizer folder not found")


@pytest.mark.parametrize("argv", [["tokenizer", "train", "--help"], ["prepare", "--help"], ["demo", "--help"]])
def test_help(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert "usage: lmforge" in capsys.readouterr().out


def test_real_subprocess_error_has_no_traceback(tmp_path, wordpiece_tokenizer_dir):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok line.\n\xff\xfe broken\n")
    r = subprocess.run([sys.executable, "-m", "lmforge.cli", "prepare", "--tokenizer", str(wordpiece_tokenizer_dir),
                        "--out", str(tmp_path / "s"), str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.strip() and "prepare:" in ln] == [
        f"lmforge prepare: error: {bad} line 2: bytes that are not UTF-8 (b'\\xff\\xfe b'); "
        "convert the file to UTF-8 or pass --encoding-errors replace"]
