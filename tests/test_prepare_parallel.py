"""prepare --workers N: the shards are byte-identical whatever N (every file compared), and the records of a
JSON Lines corpus become the shards' documents."""

from __future__ import annotations

import filecmp
import json

import numpy as np
import pytest

import lmforge.data.shards as shards_mod
from lmforge.cli import main
from lmforge.data.shards import Shards
from lmforge.data.sources import Corpus

SHARD_FILES = [f"{s}.{k}.bin" for s in ("train", "val") for k in ("tokens", "sentences", "documents")]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_shards_identical_whatever_the_workers(tmp_path, monkeypatch, capsys, tiny_corpus, kind,
                                               wordpiece_tokenizer_dir, bpe_tokenizer_dir):
    tok_dir = wordpiece_tokenizer_dir if kind == "wordpiece" else bpe_tokenizer_dir
    para = tmp_path / "para.txt"  # free paragraphs too, split into sentences in the worker processes
    para.write_text("One sentence here. Another one follows! And a third?\n\nSecond document. It ends.\n")
    argv = ["prepare", "--tokenizer", str(tok_dir), "--val-fraction", "0.2", str(tiny_corpus), str(para)]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0  # one chunk: encoded without a pool
    monkeypatch.setattr(shards_mod, "CHUNK_CHARS", 2000)  # many chunks: the pool runs
    assert len(tiny_corpus.read_text()) > 10 * 2000
    for n in (1, 2):
        assert main([*argv, "--out", str(tmp_path / f"w{n}"), "--workers", str(n)]) == 0
    capsys.readouterr()
    for other in ("w2", "whole"):
        match, mismatch, errors = filecmp.cmpfiles(tmp_path / "w1", tmp_path / other, SHARD_FILES, shallow=False)
        assert match == SHARD_FILES and not mismatch and not errors, (other, mismatch, errors)
    meta = [json.loads((tmp_path / d / "meta.json").read_text()) for d in ("w1", "w2", "whole")]
    assert meta[0] == meta[1] == meta[2]


def test_workers_flag_is_checked(tmp_path, capsys, tiny_corpus, wordpiece_tokenizer_dir):
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(tmp_path / "s"), "--workers", "0",
               str(tiny_corpus)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("lmforge prepare: error: --workers ") and "0" in lines[0]
    assert not (tmp_path / "s").exists()


def test_jsonl_records_become_documents(tmp_path, monkeypatch, capsys, wordpiece_tokenizer, wordpiece_tokenizer_dir):
    records = [
        {"text": "The first record has one sentence."},
        {"text": "The second one has two. Here is the other!", "meta": {"source": "web"}},
        {"text": "A wrapped paragraph that goes\non over a line break.\n\nThen a new paragraph."},
        {"text": ""},  # no text: no document
        {"text": ["A list of lines.", "Each one a sentence."]},
    ]
    f = tmp_path / "docs.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records * 10))
    monkeypatch.setattr(shards_mod, "CHUNK_CHARS", 300)  # records spread over many chunks and both workers
    out = tmp_path / "s"
    assert main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(out), "--workers", "2",
                 "--val-fraction", "0.2", str(f)]) == 0
    capsys.readouterr()
    want = [doc for _, doc in Corpus.open([f]).documents()]
    assert want[:4] == [
        ["The first record has one sentence."],
        ["The second one has two.", "Here is the other!"],
        ["A wrapped paragraph that goes on over a line break.", "Then a new paragraph."],
        ["A list of lines.", "Each one a sentence."],
    ]
    sh = Shards.open(out)
    got = []
    for split in ("train", "val"):
        tokens, sents, docs = sh.tokens(split), sh.sentences(split), sh.documents(split)
        for d in range(len(docs) - 1):
            got.append([tokens[sents[i]:sents[i + 1]].tolist() for i in range(docs[d], docs[d + 1])])
    assert len(got) == 40 == sum(sh.counts(s)["documents"] for s in ("train", "val"))
    encoded = [[wordpiece_tokenizer.encode(s) for s in doc] for doc in want]
    assert sorted(map(str, got)) == sorted(map(str, encoded))  # each record is a document, sentence by sentence
    assert np.all(sh.tokens("val") >= 0) and sh.counts("val")["documents"] >= 1
