import json

import numpy as np
import pytest

from lmforge.data import shards as shards_mod
from lmforge.data.corpus import iter_documents
from lmforge.data.shards import Shards, dtype_for_vocab, is_val_document, prepare
from lmforge.errors import DataError
from lmforge.tokenization import Tokenizer


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _check_structure(sh: Shards, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    toks, sent, docs = sh.tokens(split), sh.sentences(split), sh.documents(split)
    c = sh.meta["splits"][split]
    assert len(toks) == c["tokens"] and len(sent) == c["sentences"] + 1 and len(docs) == c["documents"] + 1
    assert sent[0] == 0 and sent[-1] == len(toks) and docs[0] == 0 and docs[-1] == len(sent) - 1
    assert np.all(np.diff(sent) > 0) and np.all(np.diff(docs) > 0)
    assert toks.dtype == sh.dtype and sent.dtype == np.int64 and docs.dtype == np.int64
    return toks, sent, docs


def test_meta_and_structure(wordpiece_shards, wordpiece_tokenizer, tiny_corpus):
    sh = Shards.open(wordpiece_shards)
    m = sh.meta
    assert m["tokenizer_hash"] == wordpiece_tokenizer.hash == sh.tokenizer_hash
    assert m["tokenizer_kind"] == "wordpiece" and m["vocab_size"] == 500 and m["dtype"] == "uint16"
    assert m["sources"][0]["path"] == str(tiny_corpus.resolve()) and m["sources"][0]["layout"] == "lines"
    n_docs = len(list(iter_documents(tiny_corpus)))
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == n_docs
    assert m["splits"]["val"]["documents"] >= 1
    for split in ("train", "val"):
        _check_structure(sh, split)
    assert sh.tokenizer().hash == sh.tokenizer_hash
    sh.check_tokenizer(wordpiece_tokenizer)


def test_wordpiece_tokens_are_the_sentences(wordpiece_shards, wordpiece_tokenizer, tiny_corpus):
    sh = Shards.open(wordpiece_shards)
    docs = list(iter_documents(tiny_corpus))
    by_split = {"train": [], "val": []}
    for i, d in enumerate(docs):
        by_split["val" if is_val_document(i, 0.1) else "train"].append(d)
    if not by_split["val"]:  # the last train document was moved to val
        by_split["val"].append(by_split["train"].pop())
    for split, split_docs in by_split.items():
        toks, sent, dstarts = _check_structure(sh, split)
        sentences = [s for d in split_docs for s in d]
        assert len(sent) - 1 == len(sentences)
        for k in range(0, len(sentences), 7):
            assert toks[sent[k]:sent[k + 1]].tolist() == wordpiece_tokenizer.encode(sentences[k])
        assert np.diff(dstarts).tolist() == [len(d) for d in split_docs]


def test_bpe_eot_after_every_document(bpe_shards, bpe_tokenizer, tiny_corpus):
    sh = Shards.open(bpe_shards)
    eot = bpe_tokenizer.eot_id
    assert sh.meta["eot_id"] == eot
    docs = list(iter_documents(tiny_corpus))
    train_docs = [d for i, d in enumerate(docs) if not is_val_document(i, 0.1)]
    toks, sent, dstarts = _check_structure(sh, "train")
    ends = sent[dstarts[1:]]
    assert np.all(toks[ends - 1] == eot)
    assert int((toks == eot).sum()) == len(dstarts) - 1
    # the stream decodes back to each document's text, sentences joined by a space
    for j in (0, 1, len(dstarts) - 2):
        a, b = sent[dstarts[j]], sent[dstarts[j + 1]]
        assert bpe_tokenizer.decode(toks[a:b - 1]) == " ".join(train_docs[j])
    sh.check_tokenizer(bpe_tokenizer)
    with pytest.raises(DataError, match="made by tokenizer"):
        sh.check_tokenizer(Tokenizer.train(iter(["completely different text"] * 3), kind="bpe", vocab_size=300))


def test_check_tokenizer_refuses_other(wordpiece_shards, bpe_tokenizer):
    with pytest.raises(DataError, match="made by tokenizer"):
        Shards.open(wordpiece_shards).check_tokenizer(bpe_tokenizer)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_small_chunks_and_empty_sentences_give_the_same_shards(tmp_path, monkeypatch, kind, tiny_corpus,
                                                               wordpiece_tokenizer_dir, bpe_tokenizer_dir):
    tok_dir = wordpiece_tokenizer_dir if kind == "wordpiece" else bpe_tokenizer_dir
    # a corpus with sentences that encode to nothing (control characters only) at document ends
    text = tiny_corpus.read_text(encoding="utf-8").replace("\n\n", "\n\u200b\n\n", 5)
    f = tmp_path / "c.txt"
    f.write_text(text, encoding="utf-8")
    big = prepare([f], tok_dir, tmp_path / "big", val_fraction=0.2)
    monkeypatch.setattr(shards_mod, "CHUNK_CHARS", 97)
    small = prepare([f], tok_dir, tmp_path / "small", val_fraction=0.2)
    assert big["splits"] == small["splits"]
    for name in ("train.tokens.bin", "train.sentences.bin", "train.documents.bin", "val.tokens.bin",
                 "val.sentences.bin", "val.documents.bin"):
        assert (tmp_path / "big" / name).read_bytes() == (tmp_path / "small" / name).read_bytes(), name
    sh = Shards.open(tmp_path / "small")
    for split in ("train", "val"):
        _check_structure(sh, split)


def test_deterministic_and_replaces_old_folder_keeping_the_users_files(tmp_path, tiny_corpus, wordpiece_tokenizer_dir):
    out = tmp_path / "s"
    prepare([tiny_corpus], wordpiece_tokenizer_dir, out, val_fraction=0.1)
    first = _files(out)
    (out / "notes.txt").write_text("the user's own")
    (out / "train.bin").write_bytes(b"stale")  # a file of the shards: the new one replaces it
    prepare([tiny_corpus], wordpiece_tokenizer_dir, out, val_fraction=0.1)
    assert _files(out) == {**first, "notes.txt": b"the user's own"}
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no temporary folders left behind


def test_val_never_empty_with_two_documents(tmp_path, wordpiece_tokenizer_dir):
    f = tmp_path / "two.txt"
    f.write_text("The first document.\nIt has two sentences.\n\nThe second document.\n", encoding="utf-8")
    meta = prepare([f], wordpiece_tokenizer_dir, tmp_path / "s", val_fraction=0.001)
    assert meta["splits"]["train"]["documents"] == 1 and meta["splits"]["val"]["documents"] == 1
    sh = Shards.open(tmp_path / "s")
    tok = sh.tokenizer()
    assert sh.tokens("val").tolist() == tok.encode("The second document.")
    assert sh.tokens("train").tolist() == tok.encode("The first document.") + tok.encode("It has two sentences.")
    _check_structure(sh, "train")
    _check_structure(sh, "val")
    # val_fraction 0: everything trains, val is empty but well formed
    meta = prepare([f], wordpiece_tokenizer_dir, tmp_path / "s0", val_fraction=0.0)
    sh0 = Shards.open(tmp_path / "s0")
    assert meta["splits"]["val"] == {"documents": 0, "sentences": 0, "tokens": 0}
    assert len(sh0.tokens("val")) == 0 and sh0.sentences("val").tolist() == [0] and sh0.documents("val").tolist() == [0]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_one_document_corpus_gets_a_val_tail(tmp_path, kind, wordpiece_tokenizer_dir, bpe_tokenizer_dir, caplog):
    """A 'lines' file without blank lines is one document: its last sentences become val, wherever the hash put it."""
    sentences = [f"Sentence number {i} of the only document." for i in range(40)]
    f = tmp_path / "one.txt"
    f.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    tok_dir = wordpiece_tokenizer_dir if kind == "wordpiece" else bpe_tokenizer_dir
    assert is_val_document(0, 0.05)  # the hash sends document 0 to val at 5 %: the swap path runs
    for frac in (0.05, 0.01):  # val first (swapped to train), then train first
        out = tmp_path / f"s{frac}"
        with caplog.at_level("WARNING", logger="lmforge.data.shards"):
            meta = prepare([f], tok_dir, out, val_fraction=frac)
        assert "the corpus is one document" in caplog.text
        k = max(1, round(40 * frac))
        assert meta["splits"]["train"]["documents"] == 1 and meta["splits"]["train"]["sentences"] == 40 - k
        assert meta["splits"]["val"]["documents"] == 1 and meta["splits"]["val"]["sentences"] == k
        sh = Shards.open(out)
        tok = sh.tokenizer()
        eot = [tok.eot_id] if kind == "bpe" else []
        # the sentences keep the tokens they had in the one document (BPE: a leading space after the first)
        enc = [tok.encode(x if i == 0 or kind == "wordpiece" else " " + x) for i, x in enumerate(sentences)]
        want = {"train": enc[: 40 - k], "val": enc[40 - k :]}
        for split, sents in want.items():
            _check_structure(sh, split)
            assert sh.tokens(split).tolist() == [t for x in sents for t in x] + eot
        assert not list(out.glob("*.swap"))


def test_uint32_for_large_vocabularies(tmp_path):
    assert dtype_for_vocab(65536) == np.uint16 and dtype_for_vocab(65537) == np.uint32
    words = [f"w{i}" for i in range(70000)]
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    f = tmp_path / "c.txt"
    f.write_text("w1 w69999 w65540.\n\nw3 w66000.\n")
    meta = prepare([f], tok_dir, tmp_path / "s", val_fraction=0.5)
    assert meta["dtype"] == "uint32"
    sh = Shards.open(tmp_path / "s")
    all_ids = sh.tokens("train").tolist() + sh.tokens("val").tolist()
    assert sorted(all_ids) == sorted([6, 70004, 65545, 1, 8, 66005, 1])  # "." is unknown here


def test_paragraph_files_and_gz_in_one_prepare(tmp_path, wordpiece_tokenizer_dir):
    import gzip

    a = tmp_path / "para.txt"
    a.write_text("One sentence here. Another one follows! And a third?\n\nSecond document here.\n")
    b = tmp_path / "lines.txt.gz"
    b.write_bytes(gzip.compress(b"Line one.\nLine two.\n\nLine three.\n"))
    meta = prepare([a, b], wordpiece_tokenizer_dir, tmp_path / "s", val_fraction=0.3)
    assert [s["layout"] for s in meta["sources"]] == ["paragraphs", "lines"]
    c = meta["splits"]
    assert c["train"]["documents"] + c["val"]["documents"] == 4
    assert c["train"]["sentences"] + c["val"]["sentences"] == 7


def test_failed_prepare_leaves_nothing(tmp_path, tiny_corpus, wordpiece_tokenizer_dir):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line.\n" * 5000 + b"caf\xe9\n")
    out = tmp_path / "out" / "s"
    with pytest.raises(DataError, match="line 5001"):
        prepare([tiny_corpus, bad], wordpiece_tokenizer_dir, out)
    assert not out.exists() and list((tmp_path / "out").iterdir()) == []
    # an existing shard folder survives a failed re-run untouched
    prepare([tiny_corpus], wordpiece_tokenizer_dir, out)
    before = _files(out)
    with pytest.raises(DataError):
        prepare([tiny_corpus, bad], wordpiece_tokenizer_dir, out)
    assert _files(out) == before and [p.name for p in (tmp_path / "out").iterdir()] == ["s"]
    meta = prepare([tiny_corpus, bad], wordpiece_tokenizer_dir, out, encoding_errors="replace")
    assert meta["encoding_errors"] == "replace"


def test_prepare_errors(tmp_path, tiny_corpus, wordpiece_tokenizer_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="empty"):
        prepare([empty], wordpiece_tokenizer_dir, tmp_path / "s")
    with pytest.raises(DataError, match="not found"):
        prepare([tmp_path / "missing.txt"], wordpiece_tokenizer_dir, tmp_path / "s")
    with pytest.raises(DataError, match="directory"):
        prepare([tmp_path], wordpiece_tokenizer_dir, tmp_path / "s")
    with pytest.raises(DataError, match="no tokenizer"):
        prepare([tiny_corpus], tmp_path, tmp_path / "s")
    other = tmp_path / "notshards"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a shard folder"):
        prepare([tiny_corpus], wordpiece_tokenizer_dir, other)
    with pytest.raises(DataError, match="val_fraction"):
        prepare([tiny_corpus], wordpiece_tokenizer_dir, tmp_path / "s", val_fraction=1.0)
    assert not (tmp_path / "s").exists()


def test_open_errors(tmp_path, wordpiece_shards):
    import shutil

    with pytest.raises(DataError, match="not found"):
        Shards.open(tmp_path / "nope")
    with pytest.raises(DataError, match="no meta.json"):
        Shards.open(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(wordpiece_shards, broken)
    (broken / "meta.json").write_text("{truncated")
    with pytest.raises(DataError, match="corrupt"):
        Shards.open(broken)
    (broken / "meta.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(DataError, match="not an lmforge shard"):
        Shards.open(broken)
    shutil.copy(wordpiece_shards / "meta.json", broken / "meta.json")
    data = (broken / "train.tokens.bin").read_bytes()
    (broken / "train.tokens.bin").write_bytes(data[:-2])
    with pytest.raises(DataError, match="truncated"):
        Shards.open(broken)
    with pytest.raises(DataError, match="split"):
        Shards.open(wordpiece_shards).tokens("test")
