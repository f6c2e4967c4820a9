"""One grammar for every command (docs/cli.md, first section), checked over every parser of ``lmforge``:
outputs are ``--out``, global options go after the command too, no prefix abbreviations, an unknown option is
answered with the command's closest real one, and ``finetune --help`` fits a screen."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from lmforge.cli import build_parser, main, unknown_line, walk_parsers


def _commands():
    """(command words, parser) of every command that runs (it has a ``func``)."""
    return [(words, p) for words, p in walk_parsers(build_parser()) if p.get_default("func") is not None]


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # what the command line itself gets wrong ends in argparse's way
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_every_output_is_named_with_out_and_none_is_positional():
    commands = _commands()
    assert len(commands) >= 18  # every command and verb
    for words, p in commands:
        writes = p.get_default("writes") or ()
        assert set(writes) <= {"--out"}, (words, writes)
        positionals = [a.dest for a in p._actions if not a.option_strings]
        assert not [d for d in positionals if "out" in d], (words, positionals)
        if writes:
            assert "--out" in p._option_string_actions, words


def test_no_parser_takes_an_abbreviation():
    for words, p in walk_parsers(build_parser()):
        assert p.allow_abbrev is False, words
    p = dict(_commands())[("finetune",)]
    argv = ["m", "--task", "classify", "--train", "t.csv", "--out", "o"]
    assert p.parse_known_args([*argv, "--epochs", "3"])[0].epochs == 3
    _, unknown = p.parse_known_args([*argv, "--epoch", "3"])  # once taken silently for --epochs
    assert unknown[0] == "--epoch"


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_global_options_go_before_or_after_the_command(after):
    parser = build_parser()
    for words, p in _commands():
        assert "-q" in p._option_string_actions and "--quiet" in p._option_string_actions, words
    argv = ["prepare", "--tokenizer", "tok", "--out", "shards", "corpus.txt"]
    assert parser.parse_args(argv).quiet is False
    quiet = [*argv, "-q"] if after else ["-q", *argv]
    assert parser.parse_args(quiet).quiet is True


def test_an_unknown_option_is_answered_with_the_closest_option_of_its_command():
    for words, p in _commands():
        options = [s for s in p._option_string_actions if s.startswith("--") and s not in ("--help", "--quiet")]
        for option in options:
            line = unknown_line(p, " ".join(words), [option + "x"])
            assert f"did you mean {option}?" in line and f"lmforge {' '.join(words)} --help" in line, line
    line = unknown_line(dict(_commands())[("generate",)], "generate", ["--zzzzzz"])
    assert "did you mean" not in line and "unknown option --zzzzzz" in line


def test_the_messages_reach_the_user_in_one_line(capsys, tmp_path):
    rc, _, err = _run(capsys, "finetune", tmp_path, "--task", "classify", "--train", tmp_path / "t.csv", "--out",
                      tmp_path / "o", "--epoch", "3")
    assert rc == 2 and err.strip() == ("lmforge finetune: error: unknown option --epoch; did you mean --epochs? "
                                       "`lmforge finetune --help` lists the options")
    rc, _, err = _run(capsys, "benchmark", "curve", "zh-ner", tmp_path, "--out", tmp_path / "c", "--sizez", "3")
    assert rc == 2 and "lmforge benchmark curve: error: unknown option --sizez; did you mean --sizes?" in err
    # the positional output of old: one line saying where it goes
    for argv in (["export-hf", tmp_path / "run", tmp_path / "hf"], ["import-hf", tmp_path / "hf", tmp_path / "m"],
                 ["benchmark", "text", "en-tweets", tmp_path / "t.txt"],
                 ["benchmark", "data", "en-tweets", tmp_path / "d"]):
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert f"unexpected argument '{argv[-1]}'; every output is named with --out: --out {argv[-1]}" in err, err
    assert not list(tmp_path.iterdir())  # nothing written


def _help(*argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv])
    return out.getvalue()


def test_finetune_help_fits_a_screen_and_help_all_lists_every_option(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    brief, full = _help("finetune", "--help"), _help("finetune", "--help-all")
    assert len(brief.splitlines()) <= 56, len(brief.splitlines())
    p = dict(_commands())[("finetune",)]
    every = {a.option_strings[-1] for a in p._actions
             if a.option_strings and getattr(a, "full_help", a.help) != argparse.SUPPRESS}
    listed = {o for o in every if f"  {o}" in brief or f", {o}" in brief}
    assert {"--task", "--train", "--test", "--mode", "--out", "--epochs", "--lr", "--config", "--set"} <= listed
    assert len(listed) < len(every) / 2  # the rest are in --help-all, not gone
    assert all(f"  {o}" in full or f", {o}" in full for o in every), sorted(o for o in every if o not in full)
    # a left-out option still works, spelled as before
    argv = ["m", "--task", "qa", "--train", "t.json", "--out", "o", "--doc-stride", "64"]
    assert p.parse_args(argv).doc_stride == 64
