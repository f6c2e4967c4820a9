"""Labelled data in every format (lmforge.data.tasks, lmforge.data.columns): CSV with a sniffed delimiter, TSV,
JSON Lines, JSON, Parquet, datasets folders, compressed files; columns mapped by name or by position (a file
without a header row); errors that name the columns found and the flag to give; finetune and evaluate run with the
column flags, driven through the CLI."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.data.columns import Columns, DataFile
from lmforge.data.tasks import load_task
from lmforge.errors import DataError

WORDS = {"pos": ["great", "lovely", "fine"], "neg": ["awful", "dull", "bad"]}


def make_rows(n: int = 24, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = ["pos", "neg"][i % 2]
        rows.append((f'a {rng.choice(WORDS[label])} film, "really"; {rng.choice(["yes", "no"])}', label))
    return rows


ROWS = make_rows()
NAMED = Columns.of(text="sentence", label="sentiment")


def _q(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("labelled")
    f = {k: d / name for k, name in (("csv", "a.csv"), ("tsv", "b.tsv"), ("semicolon", "c.txt"),
                                     ("jsonl", "d.jsonl"), ("json", "e.json"), ("gz", "f.csv.gz"),
                                     ("parquet", "g.parquet"), ("dataset", "h_saved"), ("headerless", "i.csv"))}
    f["csv"].write_text("sentence,sentiment\n" + "".join(f"{_q(t)},{lab}\n" for t, lab in ROWS))
    f["tsv"].write_text("sentence\tsentiment\n" + "".join(f"{t}\t{lab}\n" for t, lab in ROWS))
    f["semicolon"].write_text("sentence;sentiment\n" + "".join(f"{_q(t)};{lab}\n" for t, lab in ROWS))
    f["jsonl"].write_text("".join(json.dumps({"sentence": t, "sentiment": lab}) + "\n" for t, lab in ROWS))
    f["json"].write_text(json.dumps({"version": 2, "rows": [{"sentence": t, "sentiment": lab} for t, lab in ROWS]}))
    f["gz"].write_bytes(gzip.compress(f["csv"].read_bytes()))
    pq.write_table(pa.table({"sentence": [t for t, _ in ROWS], "sentiment": [lab for _, lab in ROWS]}), f["parquet"])
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "sentiment": datasets.ClassLabel(names=["neg", "pos"])})
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"sentence": [t for t, _ in ROWS], "sentiment": [int(lab == "pos") for _, lab in ROWS]},
                               features=features).save_to_disk(str(f["dataset"]))
    f["headerless"].write_text("".join(f"{_q(t)},{lab}\n" for t, lab in ROWS))
    return f


@pytest.mark.parametrize("kind", ["csv", "tsv", "semicolon", "jsonl", "json", "gz", "parquet", "dataset"])
def test_every_format_gives_the_same_examples(files, kind):
    data = load_task(files[kind], "classify", columns=NAMED)
    assert [(ex.text, ex.label) for ex in data.examples] == ROWS and data.labels == ["neg", "pos"]


def test_headerless_by_position_and_a_datafile_carries_its_mapping(files):
    data = load_task(DataFile(files["headerless"], Columns.of(text="0", label="1")), "classify")
    assert [(ex.text, ex.label) for ex in data.examples] == ROWS
    pair = files["csv"].parent / "pair.tsv"
    pair.write_text("premise\thypothesis\tgold\nA man sleeps.\tSomeone rests.\tyes\nA dog runs.\tA cat sits.\tno\n")
    data = load_task(pair, "pair", columns=Columns.of(text="premise", text_pair="hypothesis", label="gold"))
    assert [(ex.text, ex.text_pair, ex.label) for ex in data.examples] == [
        ("A man sleeps.", "Someone rests.", "yes"), ("A dog runs.", "A cat sits.", "no")]


def test_tokens_qa_and_choice_fields(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    tags = datasets.ClassLabel(names=["O", "B-PER", "I-PER"])
    ner = datasets.Dataset.from_dict({"tokens": [["Ada", "Lovelace", "wrote"], ["Hi"]], "ner_tags": [[1, 2, 0], [0]]},
                                     features=datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                                                 "ner_tags": datasets.Sequence(tags)}))
    ner.save_to_disk(str(tmp_path / "ner"))
    data = load_task(tmp_path / "ner", "tokens", columns=Columns.of(words="tokens", tags="ner_tags"))
    assert [(ex.words, ex.tags) for ex in data.examples] == [(["Ada", "Lovelace", "wrote"], ["B-PER", "I-PER", "O"]),
                                                             (["Hi"], ["O"])]
    conll = tmp_path / "x.conll"  # CoNLL with the tag in the middle column: mapped by position
    conll.write_text("Ada NNP B-PER _\nLovelace NNP I-PER _\n\nHi UH O _\n")
    data = load_task(conll, "tokens", columns=Columns.of(words="0", tags="2"))
    assert data.examples[0].tags == ["B-PER", "I-PER"] and data.labels == ["B-PER", "I-PER", "O"]

    ctx = "Paris is the capital of France."
    qa = tmp_path / "qa.jsonl"  # flat records as HF squad has them
    qa.write_text(json.dumps({"id": "q1", "question": "Which city?", "context": ctx,
                              "answers": {"text": ["Paris"], "answer_start": [0]}}) + "\n")
    assert load_task(qa, "qa").examples[0].answers == [("Paris", 0)]
    qcsv = tmp_path / "qa.csv"
    answers = json.dumps([{"text": "France", "answer_start": 24}])  # a list held in a CSV cell as JSON
    qcsv.write_text(f"q,passage,ans\nWhich country?,{_q(ctx)},{_q(answers)}\n")
    ex = load_task(qcsv, "qa", columns=Columns.of(question="q", context="passage", answers="ans")).examples[0]
    assert (ex.question, ex.answers) == ("Which country?", [("France", 24)])

    swag = tmp_path / "swag.csv"  # one column per choice, as SWAG
    swag.write_text("sent1,ending0,ending1,ending2,gold\nHe opened the door,and left.,and flew.,and sang.,0\n")
    ex = load_task(swag, "choice", columns=Columns.of(context="sent1", choices=["ending0", "ending1", "ending2"],
                                                      label="gold")).examples[0]
    assert (ex.context, ex.choices, ex.label) == ("He opened the door", ["and left.", "and flew.", "and sang."], 0)


def test_errors_name_the_columns_found_and_the_flag(files, tmp_path):
    with pytest.raises(DataError, match=r"a\.csv:2: missing column 'text' \(columns: sentence, sentiment\).* "
                                        r"--text-column NAME"):
        load_task(files["csv"], "classify")
    with pytest.raises(DataError, match=r"missing column 'words' \(columns: sentence, sentiment\).*--words-column"):
        load_task(files["jsonl"], "tokens")
    with pytest.raises(DataError, match=r"no column 2 \(the rows have 2 columns, 0-based\).*--label-column N"):
        load_task(files["headerless"], "classify", columns=Columns.of(text="0", label="2"))
    with pytest.raises(DataError, match="by name or every one by 0-based position"):
        Columns.of(text="0", label="sentiment")
    with pytest.raises(DataError, match="JSON Lines, whose fields have names"):
        load_task(files["jsonl"], "classify", columns=Columns.of(text="0", label="1"))
    quote = tmp_path / "quote.csv"
    quote.write_text('text,label\n"fine",pos\n"never closed,neg\nok,pos\n')
    with pytest.raises(DataError, match=r"quote\.csv:3: the quote \(\"\) opened on line 3 is never closed"):
        load_task(quote, "classify")


# --- through the CLI ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_tokenizer) -> Path:
    from lmforge.families.bert.model import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=wordpiece_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    d = tmp_path_factory.mktemp("bert")
    BertForPreTraining(cfg).save_pretrained(d, wordpiece_tokenizer)
    return d


def _error_line(capsys, rc: int, command: str) -> str:
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith(f"lmforge {command}: error: ")]
    assert rc == 2 and "Traceback" not in err and len(errors) == 1, err
    return errors[0]


def test_cli_finetune_and_evaluate_with_mapped_columns(bert_dir, files, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["finetune", str(bert_dir), "--task", "classify", "--train", str(files["csv"]), "--test",
               str(files["dataset"]), "--text-column", "sentence", "--label-column", "sentiment", "--mode", "frozen",
               "--epochs", "1", "--seed", "0", "--out", str(run)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((run / "metrics.json").read_text())["n_test"] == len(ROWS)
    capsys.readouterr()
    rc = main(["evaluate", "run", str(run), "--test", str(files["headerless"]), "--text-column", "0",
               "--label-column", "1", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n_test"] == len(ROWS)
    rc = main(["evaluate", "run", str(run), "--test", str(files["tsv"])])  # no mapping: says how to give one
    line = _error_line(capsys, rc, "evaluate")
    assert "missing column 'text' (columns: sentence, sentiment)" in line and "--text-column NAME" in line


def test_cli_unterminated_quote_names_the_quote_and_its_line(bert_dir, files, tmp_path, capsys):
    bad = tmp_path / "train.csv"
    bad.write_text('text,label\n"a great film",pos\n"an awful, long film,neg\n"fine",pos\n')
    rc = main(["finetune", str(bert_dir), "--task", "classify", "--train", str(bad), "--test", str(bad),
               "--mode", "frozen", "--epochs", "1", "--out", str(tmp_path / "o")])
    line = _error_line(capsys, rc, "finetune")
    assert "train.csv:3: the quote (\") opened on line 3 is not closed on that line" in line
    assert not (tmp_path / "o").exists()


def test_a_mapped_column_missing_from_another_file_does_not_repeat_the_advice(tmp_path):
    from lmforge.data.columns import Columns, DataFile
    from lmforge.data.tasks import load_task
    from lmforge.errors import DataError

    mapped = Columns.of(text="review", label="stars")
    train = tmp_path / "train.csv"
    train.write_text("review,stars\ngood film,pos\nbad film,neg\nfine film,pos\n", encoding="utf-8")
    assert [ex.text for ex in load_task(DataFile(train, mapped), "classify").examples][0] == "good film"
    test = tmp_path / "test.csv"
    test.write_text("text,stars\ngood day,pos\nbad day,neg\nok day,pos\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        load_task(DataFile(test, mapped), "classify")
    assert "which --text-column review names" in str(e.value) and "map yours" not in str(e.value)
    with pytest.raises(DataError, match="map yours with --text-column NAME"):  # not mapped: the flag to map it
        load_task(DataFile(train, Columns.of(label="stars")), "classify")
