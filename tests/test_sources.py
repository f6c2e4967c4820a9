"""Corpora in every format (lmforge.data.sources): the same documents from text, compressed text, JSON Lines,
JSON, CSV, TSV, Parquet and datasets folders; detection from the content; folders with --glob; several inputs at
once; one-line errors naming the flag to give, driven through the CLI."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pytest

from lmforge.cli import main
from lmforge.data.formats import detect
from lmforge.data.shards import Shards
from lmforge.data.sources import Corpus, CorpusOptions, iter_corpus
from lmforge.errors import DataError

DOCS = [
    "The snake lay in the sun. It did not move for an hour!",
    "Python is a programming language. Its name comes from a comedy group.",
    "Rain fell on the town. The river rose. Nobody left their house.",
]
SENTENCES = [["The snake lay in the sun.", "It did not move for an hour!"],
             ["Python is a programming language.", "Its name comes from a comedy group."],
             ["Rain fell on the town.", "The river rose.", "Nobody left their house."]]


def _csv_quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def write_all_formats(d: Path) -> dict[str, Path]:
    """The three documents in every format lmforge reads, each file named by what it holds."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    text = "\n\n".join(DOCS).encode() + b"\n"
    files = {"txt": d / "docs.txt", "gz": d / "docs.txt.gz", "bz2": d / "docs.txt.bz2", "xz": d / "docs.txt.xz",
             "zst": d / "docs.txt.zst", "jsonl": d / "docs.jsonl", "json": d / "docs.json", "csv": d / "docs.csv",
             "tsv": d / "docs.tsv", "parquet": d / "docs.parquet"}
    files["txt"].write_bytes(text)
    files["gz"].write_bytes(gzip.compress(text))
    files["bz2"].write_bytes(bz2.compress(text))
    files["xz"].write_bytes(lzma.compress(text))
    files["zst"].write_bytes(zstandard.ZstdCompressor().compress(text))
    files["jsonl"].write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(DOCS)))
    files["json"].write_text(json.dumps([{"text": t} for t in DOCS], indent=2))
    files["csv"].write_text("id,text\n" + "".join(f"{i},{_csv_quote(t)}\n" for i, t in enumerate(DOCS)))
    files["tsv"].write_text("text\tid\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(DOCS)))
    pq.write_table(pa.table({"text": DOCS, "id": [0, 1, 2]}), files["parquet"])
    return files


def save_dataset(path: Path, column: str = "text", splits: bool = False) -> Path:
    import datasets

    ds = datasets.Dataset.from_dict({column: DOCS})
    (datasets.DatasetDict({"train": ds, "test": ds.select([0])}) if splits else ds).save_to_disk(str(path))
    return path


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("formats")
    files = write_all_formats(d)
    files["dataset"] = save_dataset(d / "saved")
    return files


@pytest.mark.parametrize("kind", ["txt", "gz", "bz2", "xz", "zst", "jsonl", "json", "csv", "tsv", "parquet",
                                  "dataset"])
def test_every_format_gives_the_same_documents(formats, kind):
    docs = [sentences for _, sentences in iter_corpus([formats[kind]])]
    assert docs == SENTENCES


def test_detected_from_the_content_not_the_suffix(tmp_path, formats):
    assert [detect(formats[k]) for k in ("txt", "gz", "jsonl", "json", "csv", "tsv", "parquet", "dataset")] == [
        "text", "text", "jsonl", "json", "csv", "tsv", "parquet", "dataset"]
    disguised = tmp_path / "corpus.txt"  # JSON Lines whatever the suffix says
    disguised.write_bytes(formats["jsonl"].read_bytes())
    bare = tmp_path / "table"  # no suffix: a header row of names over rows of one width is CSV
    bare.write_bytes(formats["csv"].read_bytes())
    prose = tmp_path / "notes"  # no suffix, prose with commas: text
    prose.write_text("Well, it rained.\nThen, at last, the sun came out.\nWe went out, happy.\n")
    gz_json = tmp_path / "blob.gz"
    gz_json.write_bytes(gzip.compress(formats["jsonl"].read_bytes()))
    assert [detect(p) for p in (disguised, bare, prose, gz_json)] == ["jsonl", "csv", "text", "jsonl"]
    assert [d for _, d in iter_corpus([disguised])] == SENTENCES
    # --format overrides: the JSON syntax is then the text, as asked
    raw = list(iter_corpus([disguised], format="text", layout="lines"))
    assert raw[0][1][0].startswith('{"id": 0, "text"')


def test_jsonl_is_never_trained_as_text(tmp_path, wordpiece_tokenizer, wordpiece_tokenizer_dir, capsys):
    corpus = tmp_path / "web.txt"
    corpus.write_text("".join(json.dumps({"text": t, "url": "http://x"}) + "\n" for t in DOCS * 4))
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(tmp_path / "s"), str(corpus)])
    assert rc == 0, capsys.readouterr().err
    sh = Shards.open(tmp_path / "s")
    text = wordpiece_tokenizer.decode(list(sh.tokens("train")) + list(sh.tokens("val")))
    assert "{" not in text and "url" not in text and "snake" in text
    assert sum(sh.counts(s)["documents"] for s in ("train", "val")) == 12  # a record is a document
    assert sh.meta["sources"][0]["format"] == "jsonl"


def test_folder_recursive_with_glob(tmp_path, formats):
    import shutil

    d = tmp_path / "corpus"
    (d / "sub" / "deeper").mkdir(parents=True)
    (d / "a").write_bytes(formats["txt"].read_bytes())  # no extension: told from the content
    shutil.copy(formats["jsonl"], d / "sub" / "b.jsonl")
    shutil.copy(formats["parquet"], d / "sub" / "deeper" / "c.parquet")
    shutil.copytree(formats["dataset"], d / "sub" / "saved")  # a datasets folder is one source
    (d / ".hidden.txt").write_text("Never read.\n")
    (d / "weights.bin").write_bytes(bytes(range(256)) * 4)  # binary: skipped
    corpus = Corpus.open([d])
    assert [s.name for s in corpus.sources] == [str(d / "a"), str(d / "sub" / "saved"), str(d / "sub" / "b.jsonl"),
                                               str(d / "sub" / "deeper" / "c.parquet")]
    assert [doc for _, doc in corpus.documents()] == SENTENCES * 4
    only = Corpus.open([d], options=CorpusOptions(glob="*.jsonl"))
    assert [s.format for s in only.sources] == ["jsonl"]
    assert [s.format for s in Corpus.open([d], options=CorpusOptions(glob="sub/deeper/*")).sources] == ["parquet"]
    with pytest.raises(DataError, match=r"no file under .* matches --glob '\*\.md' \(4 files there\)"):
        Corpus.open([d], options=CorpusOptions(glob="*.md"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="is a directory holding no text, JSON Lines"):
        Corpus.open([empty])


def test_several_inputs_and_datasets_at_once(tmp_path, formats, wordpiece_tokenizer_dir, capsys):
    import datasets

    data_files = tmp_path / "hub_like"  # a folder of data files, loaded by datasets.load_dataset offline
    data_files.mkdir()
    (data_files / "train.jsonl").write_text(formats["jsonl"].read_text())
    cache = tmp_path / "hf_cache"
    old = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = cache  # the Arrow cache it builds goes to the test's folder
    try:
        out = tmp_path / "s"
        rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(out), str(formats["txt"]),
                   str(formats["csv"]), str(formats["parquet"]), "--dataset", str(formats["dataset"]),
                   "--dataset", str(data_files), "--workers", "1"])
    finally:
        datasets.config.HF_DATASETS_CACHE = old
    printed = capsys.readouterr().out
    assert rc == 0
    meta = Shards.open(out).meta
    assert [s["format"] for s in meta["sources"]] == ["text", "csv", "parquet", "dataset", "dataset"]
    assert sum(c["documents"] for c in meta["splits"].values()) == 15
    assert "from 5 source(s): csv, dataset, parquet, text (layout paragraphs)" in printed


def test_dataset_dict_needs_a_split(tmp_path):
    saved = save_dataset(tmp_path / "dd", splits=True)
    with pytest.raises(DataError, match=r"holds several splits \(splits: train, test\); give --split NAME"):
        Corpus.open(datasets=[str(saved)], options=CorpusOptions(split=None))
    docs = [d for _, d in Corpus.open(datasets=[str(saved)], options=CorpusOptions(split="test")).documents()]
    assert docs == SENTENCES[:1]


@pytest.mark.parametrize(
    "setup,args,needles",
    [
        ("jsonl_body", [], ["without a 'text' field", "fields: id, body", "--text-field NAME"]),
        ("csv_review", [], ["without a 'text' column", "columns: review, stars", "--text-column NAME"]),
        ("csv_review", ["--text-column", "5"], ["no column 5", "0-based"]),
        ("dd", [], ["holds several splits", "--split NAME"]),
        ("bad_zst", [], ["docs.zst is not a valid zstd file"]),
        ("not_gz", [], ["is not a valid gzip file", "drop the .gz suffix"]),
        ("empty_dir", [], ["is a directory holding no text"]),
        ("no_input", [], ["no input given", "--dataset"]),
        ("broken_jsonl", [], ["broken.jsonl:2: not JSON"]),
    ],
)
def test_one_line_errors_name_the_flag(tmp_path, capsys, wordpiece_tokenizer_dir, setup, args, needles):
    inputs: list[str] = []
    if setup == "jsonl_body":
        (tmp_path / "c.jsonl").write_text('{"id": 1, "body": "Some text."}\n')
        inputs = [str(tmp_path / "c.jsonl")]
    elif setup == "csv_review":
        (tmp_path / "c.csv").write_text("review,stars\nGood film.,5\n")
        inputs = [str(tmp_path / "c.csv")]
    elif setup == "dd":
        inputs = ["--dataset", str(save_dataset(tmp_path / "dd", splits=True)), "--split", "validation"]
    elif setup == "bad_zst":
        (tmp_path / "docs.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"garbage" * 20)
        inputs = [str(tmp_path / "docs.zst")]
    elif setup == "not_gz":
        (tmp_path / "docs.txt.gz").write_text("plain text.\n")
        inputs = [str(tmp_path / "docs.txt.gz")]
    elif setup == "empty_dir":
        (tmp_path / "e").mkdir()
        inputs = [str(tmp_path / "e")]
    elif setup == "broken_jsonl":
        (tmp_path / "broken.jsonl").write_text('{"text": "Fine."}\n{"text": "cut off\n')
        inputs = [str(tmp_path / "broken.jsonl")]
    if setup == "dd":
        needles = ["has no split 'validation'", "--split NAME"]
    capsys.readouterr()  # what setting up printed (datasets' progress bars)
    for command in (["prepare", "--tokenizer", str(wordpiece_tokenizer_dir)], ["tokenizer", "train", "--kind",
                                                                              "wordpiece", "--vocab-size", "300"]):
        rc = main([*command, "--out", str(tmp_path / "out"), *inputs, *args])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
        assert lines[0].startswith(f"lmforge {command[0]}: error: ")
        for n in needles:
            assert n in lines[0], lines[0]
        assert not (tmp_path / "out").exists()


def test_tokenizer_train_on_records(tmp_path, formats, capsys):
    rc = main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "1000", "--out", str(tmp_path / "t"),
               "--text-column", "text", str(formats["csv"]), str(formats["jsonl"])])
    assert rc == 0
    from lmforge.tokenization import Tokenizer

    vocab = Tokenizer.load(tmp_path / "t").get_vocab()
    assert "snake" in vocab and not {'"', "{", ":", "0", "1"} & set(vocab)  # only the text column was read


def test_each_input_reads_the_first_text_field_it_has(tmp_path, capsys, wordpiece_tokenizer_dir):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in DOCS))
    (tmp_path / "b.csv").write_text("text\n" + "".join(f"{_csv_quote(t)}\n" for t in DOCS))
    corpus = Corpus.open([tmp_path / "a.jsonl", tmp_path / "b.csv"], text_field=("body", "text"))
    assert [s.field for s in corpus.sources] == ["body", "text"]
    assert [d for _, d in corpus.documents()] == SENTENCES * 2
    out = tmp_path / "s"
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(out), "--text-field", "body",
               "--text-field", "text", str(tmp_path / "a.jsonl"), str(tmp_path / "b.csv")])
    assert rc == 0, capsys.readouterr().err
    assert [s["field"] for s in Shards.open(out).meta["sources"]] == ["body", "text"]
