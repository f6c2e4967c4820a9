"""A hand-edited shards meta.json (issue 35, item 5): every field is checked on read, and a bad one is one line
naming the field and saying to run prepare again, from the library and from the CLI."""

from __future__ import annotations

import json
import shutil

import pytest

from lmforge.cli import main
from lmforge.data.shards import Shards
from lmforge.errors import DataError


@pytest.fixture
def shards(tmp_path, wordpiece_shards):
    d = tmp_path / "shards"
    shutil.copytree(wordpiece_shards, d)
    return d


def _edit(folder, **changes):
    meta = json.loads((folder / "meta.json").read_text())
    for key, value in changes.items():
        if value is KeyError:
            del meta[key]
        else:
            meta[key] = value
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


@pytest.mark.parametrize(
    "field,value",
    [
        ("splits", "x"),
        ("splits", {"train": {"documents": 1, "sentences": 2, "tokens": 3}}),
        ("splits", {"train": {"documents": -1, "sentences": 2, "tokens": 3},
                    "val": {"documents": 1, "sentences": 1, "tokens": 1}}),
        ("splits", {"train": {"documents": 5, "sentences": 2, "tokens": 3},
                    "val": {"documents": 1, "sentences": 1, "tokens": 1}}),
        ("vocab_size", "500"),
        ("vocab_size", KeyError),
        ("dtype", "uint8"),
        ("tokenizer_kind", "sentencepiece"),
        ("tokenizer_hash", 7),
        ("eot_id", 3),
        ("val_fraction", 2),
        ("encoding_errors", "ignore"),
        ("sources", "x"),
        ("sources", [{"path": 1, "bytes": 5, "layout": "lines"}]),
        ("version", "1"),
    ],
)
def test_every_field_is_checked(shards, field, value):
    _edit(shards, **{field: value})
    with pytest.raises(DataError) as e:
        Shards.open(shards)
    msg = str(e.value)
    assert f"field {field!r} is " in msg and msg.endswith("run lmforge prepare again") and "\n" not in msg


def test_newer_format_and_wrong_dtype_for_the_vocabulary(shards):
    _edit(shards, version=99)
    with pytest.raises(DataError, match="written by a newer lmforge"):
        Shards.open(shards)
    _edit(shards, version=1, vocab_size=70000)
    with pytest.raises(DataError, match="field 'dtype' is 'uint16', expected uint32 for a vocabulary of 70000"):
        Shards.open(shards)


def test_cli_one_line_for_an_edited_meta(shards, tmp_path, capsys):
    _edit(shards, splits="x")
    rc = main(["pretrain", "gpt", "--data", str(shards), "--out", str(tmp_path / "m"), "--config", "tiny"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "meta.json: field 'splits' is 'x', expected" in lines[0] and "run lmforge prepare again" in lines[0]
