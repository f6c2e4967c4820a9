"""Output a person reads, and one way to say each thing: every command (serve aside) ends with a short human
summary and prints its full record as one JSON document with ``--json``, with nothing else on stdout; a flag that
a command no longer takes is answered in one line that says what to write instead."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_transfer_families import rows

from lmforge.cli import build_parser, main

# serve answers over HTTP; benchmark text and data are in benchmark.py, whose refactoring gives them --json
WITHOUT_JSON = {"lmforge serve"}


def _leaves(parser: argparse.ArgumentParser, name: str = "lmforge"):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield name, parser
    for action in subs:
        for sub_name, sub in action.choices.items():
            yield from _leaves(sub, f"{name} {sub_name}")


def test_every_command_takes_json():
    leaves = dict(_leaves(build_parser()))
    assert len(leaves) > 15 and WITHOUT_JSON <= set(leaves)
    lacking = {name for name, p in leaves.items() if "--json" not in {s for a in p._actions for s in a.option_strings}}
    assert lacking <= WITHOUT_JSON, lacking - WITHOUT_JSON


# -- fixtures: tiny models and files ----------------------------------------------------------------------------

SENTENCES = ["the python is a large snake .", "python is a programming language .", "a python in the garden ."]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, bert_dir):
    out = tmp_path_factory.mktemp("hf") / "bert-hf"
    assert main(["-q", "export-hf", str(bert_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(24, 1)), encoding="utf-8")
    return path


def _run(capsys, argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _human_then_json(capsys, make_argv) -> tuple[str, dict]:
    """Run a command twice (outputs named 0 and 1): the summary is text, ``--json`` gives one JSON document."""
    rc, human, err = _run(capsys, make_argv(0))
    assert rc == 0, err
    assert human.strip()
    with pytest.raises(json.JSONDecodeError):
        json.loads(human)
    rc, out, err = _run(capsys, [*make_argv(1), "--json"])
    assert rc == 0, err
    record = json.loads(out)  # the whole of stdout: progress and notes went to stderr
    assert isinstance(record, dict)
    return human, record


# -- each command: a summary, or the record as JSON ---------------------------------------------------------------


def test_tokenizer_train_and_encode(capsys, tmp_path, tiny_corpus, bpe_tokenizer_dir):
    human, record = _human_then_json(capsys, lambda n: ["tokenizer", "train", "--kind", "bpe", "--vocab-size", 300,
                                                       "--out", tmp_path / f"tok{n}", tiny_corpus])
    assert "final vocabulary size" in human
    assert record["kind"] == "bpe" and record["asked_vocab_size"] == 300 and 0 < record["vocab_size"] <= 300
    assert record["out"] == str(tmp_path / "tok1")
    human, record = _human_then_json(capsys, lambda n: ["tokenizer", "encode", "--tokenizer", bpe_tokenizer_dir,
                                                       "the snake"])
    assert human.strip().endswith(f"{len(record['ids'])} tokens")
    assert len(record["ids"]) == len(record["tokens"]) == len(record["offsets"]) > 0
    assert record["text"] == "the snake" and record["offsets"][-1][1] == len("the snake")


def test_prepare(capsys, tmp_path, tiny_corpus, bpe_tokenizer_dir):
    human, record = _human_then_json(capsys, lambda n: ["prepare", "--tokenizer", bpe_tokenizer_dir, "--out",
                                                       tmp_path / f"shards{n}", "--workers", 1, tiny_corpus])
    assert human.startswith(f"wrote {tmp_path / 'shards0'}")
    assert record["out"] == str(tmp_path / "shards1")
    assert record["splits"]["train"]["tokens"] > 0 and record["tokenizer_kind"] == "bpe"


def test_generate(capsys, gpt_dir):
    argv = ["generate", gpt_dir, "--prompt", "the snake", "--max-new-tokens", 3, "--device", "cpu"]
    human, record = _human_then_json(capsys, lambda n: argv)
    assert human.startswith("the snake")  # the text itself is the human output
    assert record["prompt"] == "the snake" and 0 < record["new_tokens"] <= 3
    assert human.rstrip("\n") == "the snake" + record["text"]  # greedy: the same text both times


def test_fill_mask(capsys, bert_dir):
    human, record = _human_then_json(capsys, lambda n: ["fill-mask", bert_dir, "the [MASK] is a snake .",
                                                       "--top-k", 3])
    (candidates,) = record["masks"]
    assert len(candidates) == 3 and all(0 <= c["prob"] <= 1 for c in candidates)
    assert candidates[0]["token"] in human


def test_embed(capsys, bert_dir):
    human, record = _human_then_json(capsys, lambda n: ["embed", bert_dir, *SENTENCES, "--word", "python"])
    assert "similarity of 'python'" in human
    assert record["word"] == "python" and record["sentences"] == SENTENCES
    assert len(record["rows"]) == 3  # embeddings and two layers of the tiny BERT
    row = record["rows"][0]
    assert [(c["a"], c["b"]) for c in row["cosines"]] == [(1, 2), (1, 3), (2, 3)]
    assert row["mean"] == pytest.approx(sum(c["cosine"] for c in row["cosines"]) / 3, abs=1e-9)


def test_encode(capsys, tmp_path, bert_dir, texts):
    human, record = _human_then_json(capsys, lambda n: ["encode", bert_dir, "--file", texts, "--out",
                                                       tmp_path / f"v{n}.npy"])
    assert human.startswith("wrote 3 vectors of 32 floats")
    assert record["texts"] == 3 and record["dim"] == 32 and record["out"] == str(tmp_path / "v1.npy")
    assert (tmp_path / "v1.npy").is_file()


def test_neighbors(capsys, bert_dir, texts):
    human, record = _human_then_json(capsys, lambda n: ["neighbors", bert_dir, "snake", "--corpus", texts,
                                                       "--top-k", 3])
    words = [n["word"] for n in record["neighbors"]]
    assert len(words) == 3 and all(-1 <= n["cosine"] <= 1 for n in record["neighbors"])
    assert [line.split()[0] for line in human.splitlines()] == words


def test_export_and_import_hf(capsys, tmp_path, bert_dir, hf_dir):
    human, record = _human_then_json(capsys, lambda n: ["export-hf", bert_dir, "--out", tmp_path / f"hf{n}"])
    assert record["architectures"] == ["BertForPreTraining"] and "BertForPreTraining" in human
    human, record = _human_then_json(capsys, lambda n: ["import-hf", hf_dir, "--out", tmp_path / f"m{n}"])
    assert record["model_type"] == "bert" and record["parameters"] > 0 and human.startswith("imported bert")


def test_finetune_logs_to_tensorboard_with_set_and_predict_out_says_json(capsys, tmp_path, bert_dir, labelled):
    run = tmp_path / "run"
    rc, out, err = _run(capsys, ["-q", "finetune", bert_dir, "--task", "classify", "--train", labelled, "--mode",
                                 "frozen", "--epochs", 1, "--max-len", 16, "--out", run, "--set", "log=tensorboard",
                                 "--json"])
    assert rc == 0, err
    assert json.loads(out)["out"] == str(run)
    assert list(run.glob("events.out.tfevents.*"))
    rc, out, err = _run(capsys, ["predict", run, "--file", labelled, "--out", tmp_path / "p.jsonl", "--json"])
    assert rc == 0, err
    assert json.loads(out) == {"out": str(tmp_path / "p.jsonl"), "predictions": 24, "task": "classify"}


# -- one way to say each thing --------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["finetune", "M", "--train", "t.jsonl", "--out", "r", "--log", "tensorboard"],
     "lmforge finetune: error: unknown option --log; `lmforge finetune --help` lists the options"),
    (["finetune", "M", "--train", "t.jsonl", "--out", "r", "--bf16"],
     "lmforge finetune: error: unknown option --bf16; `lmforge finetune --help` lists the options"),
    (["pretrain", "gpt", "--data", "s", "--out", "m", "--max-steps", "3"],
     "lmforge pretrain: error: unknown option --max-steps; did you mean --max-time? "
     "`lmforge pretrain --help` lists the options"),
])
def test_a_pre_release_flag_gets_the_ordinary_unknown_option_error(capsys, argv, says):
    """Flags of lmforge before its first release (--log, --bf16, --max-steps) have no shim of their own: the
    ordinary unknown-option line, with the closest real option where one is close."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err == says + "\n"


def test_other_unknown_flags_are_named_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["finetune", "M", "--train", "t.jsonl", "--out", "r", "--no-such-flag"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "unknown option --no-such-flag; `lmforge finetune --help` lists the options" in err


def test_finetune_set_log_refuses_another_value_in_one_line(capsys, tmp_path, bert_dir, labelled):
    rc, out, err = _run(capsys, ["finetune", bert_dir, "--task", "classify", "--train", labelled, "--out",
                                 tmp_path / "run", "--set", "log=wandb"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "log must be jsonl or tensorboard" in err, err
    assert not (tmp_path / "run").exists()


def test_demo_json_keeps_the_step_lines_off_stdout(capsys, tmp_path, monkeypatch):
    """The demo's line per finished step is progress: on stdout beside the summary, on stderr with --json."""
    from lmforge.commands import demo as demo_command
    from lmforge.demo.run import DemoResult, StepReport

    def fake_run_demo(out, on_done, **_):
        step = StepReport("tokenizer", "tokenizer: 300 pieces", reused=False, seconds=0.5)
        on_done(step)
        return DemoResult(out=tmp_path, report=tmp_path / "report.md", steps=[step], results={}, elapsed=0.5,
                          highlights=["headline"])

    monkeypatch.setattr(demo_command, "run_demo", fake_run_demo)
    human, record = _human_then_json(capsys, lambda n: ["demo", "--quick", "--out", tmp_path / f"demo{n}"])
    assert "tokenizer: 300 pieces" in human and "headline" in human and "demo done in" in human
    assert record["steps"] == [{"name": "tokenizer", "summary": "tokenizer: 300 pieces", "reused": False,
                                "seconds": 0.5}]


def test_benchmark_data_and_text_print_a_summary_or_their_record(tmp_path, capsys):
    rc, out, _ = _run(capsys, ["benchmark", "data", "en-tweets", "--out", tmp_path / "d", "--n-train", 9, "--n-test", 6,
                               "--seed", 3, "--json"])
    rec = json.loads(out)
    assert rc == 0 and (rec["n_train"], rec["n_test"], rec["seed"], rec["task"]) == (9, 6, 3, "classify")
    assert Path(rec["train"]).is_file() and Path(rec["test"]).is_file()
    rc, out, _ = _run(capsys, ["benchmark", "text", "en-tweets", "--out", tmp_path / "t.txt"])
    assert rc == 0 and out.startswith("wrote ") and "en-tweets documents" in out
    rc, out, _ = _run(capsys, ["benchmark", "text", "en-tweets", "--out", tmp_path / "t2.txt", "--json"])
    rec = json.loads(out)
    assert rc == 0 and rec["documents"] > 100 and rec["characters"] > 1000
    assert (tmp_path / "t2.txt").stat().st_size >= rec["characters"]
