"""``lmforge predict``: what comes in goes out unchanged, the prediction beside it under ``pred``; texts from
repeated ``--text``, a plain text file, JSON Lines / CSV through the column flags, and standard input."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from lmforge.cli import main
from lmforge.transfer import load_run


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _predicted(run, texts: list[str]) -> list[str]:
    """The run's own labels for ``texts`` (the Python API), to check the command against."""
    from lmforge.data.tasks import TaskData, TextExample

    r = load_run(run)
    return [p["label"] for p in r.predict(TaskData("classify", [TextExample(t) for t in texts], r.labels))]


def test_a_gold_file_goes_through_predict_and_back_unchanged(model_folders, tmp_path, capsys):
    gold = tmp_path / "gold.jsonl"
    rows = [{**r, "id": i, "source": "test"} for i, r in enumerate(_records(model_folders["data"]))]
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    before = gold.read_bytes()
    out = tmp_path / "p.jsonl"
    rc, _, err = _run(capsys, "predict", model_folders["run"], "--file", gold, "--out", out)
    assert rc == 0, err
    written = _records(out)
    assert gold.read_bytes() == before
    # every input record whole (the gold label too), plus pred and probs: nothing else added, nothing changed
    assert [{k: v for k, v in w.items() if k not in ("pred", "probs")} for w in written] == rows
    assert [w["pred"] for w in written] == _predicted(model_folders["run"], [r["text"] for r in rows])
    assert all(set(w["probs"]) == {"neg", "pos"} for w in written)
    # a scorer reading label and pred scores the model against the gold labels, not against itself
    differ = [w for w in written if w["label"] != w["pred"]]
    agree = [w for w in written if w["label"] == w["pred"]]
    assert differ and agree, "a one-epoch frozen run on random bodies gets some wrong and some right"


def test_a_csv_file_keeps_its_columns_and_the_column_flags_map_the_text(model_folders, tmp_path, capsys):
    rows = _records(model_folders["data"])[:6]
    table = tmp_path / "reviews.csv"
    with open(table, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["review", "stars"])
        w.writeheader()
        w.writerows({"review": r["text"], "stars": str(i)} for i, r in enumerate(rows))
    rc, out, err = _run(capsys, "predict", model_folders["run"], "--file", table, "--text-column", "review", "--json")
    assert rc == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [{"review": g["review"], "stars": g["stars"]} for g in got] == [
        {"review": r["text"], "stars": str(i)} for i, r in enumerate(rows)]
    assert [g["pred"] for g in got] == _predicted(model_folders["run"], [r["text"] for r in rows])
    rc, _, err = _run(capsys, "predict", model_folders["run"], "--file", table)  # no mapping: it says which flag
    assert rc == 2 and "--text-column" in err and len(err.strip().splitlines()) == 1


def test_repeated_text_a_plain_text_file_and_stdin_give_the_same_predictions(model_folders, capsys, monkeypatch):
    texts = model_folders["texts"].read_text(encoding="utf-8").splitlines()
    want = _predicted(model_folders["run"], texts)
    rc, out, err = _run(capsys, "predict", model_folders["run"], *[a for t in texts for a in ("--text", t)], "--json")
    assert rc == 0, err
    by_text = [json.loads(line) for line in out.splitlines()]
    assert [r["text"] for r in by_text] == texts and [r["pred"] for r in by_text] == want  # every --text, in order
    rc, out, err = _run(capsys, "predict", model_folders["run"], "--file", model_folders["texts"], "--json")
    assert rc == 0, err
    assert [json.loads(line) for line in out.splitlines()] == by_text
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(texts).encode() + b"\n")))
    rc, out, err = _run(capsys, "predict", model_folders["run"], "--file", "-", "--json")
    assert rc == 0, err
    assert [json.loads(line) for line in out.splitlines()] == by_text
    rc, out, _ = _run(capsys, "predict", model_folders["run"], "--file", model_folders["texts"])  # lines a person reads
    assert [line.split()[0] for line in out.splitlines()] == want and out.splitlines()[0].endswith(texts[0])


def test_stdin_takes_records_too_and_refuses_nothing(model_folders, capsys, monkeypatch):
    data = model_folders["data"].read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    rc, out, err = _run(capsys, "predict", model_folders["run"], "--file", "-", "--json")
    assert rc == 0, err
    assert [{k: v for k, v in json.loads(x).items() if k not in ("pred", "probs")} for x in out.splitlines()] == [
        json.loads(x) for x in data.decode().splitlines()]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    rc, _, err = _run(capsys, "predict", model_folders["run"], "--file", "-")
    assert rc == 2 and "read nothing from standard input" in err


@pytest.mark.parametrize("argv, says", [
    (["--text", "a", "--text", "b", "--text-pair", "c"], "one --text-pair per --text"),
])
def test_mismatched_texts_are_refused_in_one_line(model_folders, capsys, argv, says):
    rc, _, err = _run(capsys, "predict", model_folders["run"], *argv)
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_an_input_field_named_pred_is_never_overwritten(model_folders, tmp_path, capsys):
    f = tmp_path / "has_pred.jsonl"
    f.write_text(json.dumps({"text": "a b c", "pred": "mine"}) + "\n", encoding="utf-8")
    rc, _, err = _run(capsys, "predict", model_folders["run"], "--file", f, "--out", tmp_path / "p.jsonl")
    assert rc == 2 and "already have a field 'pred'" in err
    assert not (tmp_path / "p.jsonl").exists()
