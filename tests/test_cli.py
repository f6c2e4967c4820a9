import subprocess
import sys

import pytest

from lmforge.cli import build_parser, main
from lmforge.commands import COMMANDS

SUBCOMMANDS = ["demo", "tokenizer", "prepare", "pretrain", "generate", "fill-mask", "embed", "encode", "neighbors",
               "evaluate",
               "finetune", "predict", "benchmark", "export-hf", "import-hf", "export-onnx", "serve"]


def test_every_command_module_is_present():
    # A missing module would silently drop its subcommand from `lmforge --help`.
    choices = set(build_parser()._subparsers._group_actions[0].choices)
    assert choices == set(SUBCOMMANDS) == set(COMMANDS)


def _choices_help(parser):
    sub = parser._subparsers._group_actions[0]
    return [(a.dest, a.help) for a in sub._choices_actions]


def test_a_command_is_built_alone_and_the_rest_are_listed_as_in_the_full_parser():
    full = _choices_help(build_parser())
    for command in ("generate", "import-hf", "", "no-such-command"):
        assert _choices_help(build_parser(command)) == full  # same names, order and help lines
    lone = build_parser("generate")._subparsers._group_actions[0].choices
    assert lone["generate"]._actions[1:] and not lone["predict"]._actions[1:]  # predict: name and help only
    both = build_parser("export-hf")._subparsers._group_actions[0].choices  # one module registers both
    assert both["import-hf"]._actions[1:]


def test_top_level_help_and_version_import_no_command_module_and_no_torch():
    code = ("import sys; from lmforge.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('lmforge.commands.')]\n"
            "print(sorted(loaded), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "[]", r.stderr
    assert "serve" in r.stdout and "\nlmforge 0.1.0" in r.stdout


@pytest.mark.parametrize("command", ["tokenizer", "prepare", "neighbors", "serve"])
def test_help_of_commands_without_a_model_imports_no_torch(command):
    """The commands that neither train nor load a model at parse time answer --help without torch
    (their --device/--precision names come from lmforge.devices, not from lmforge.train)."""
    code = ("import sys; from lmforge.cli import main\n"
            f"try: main([{command!r}, '--help'])\n"
            "except SystemExit: pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip().splitlines()[-1] == "False", r.stderr
    assert "usage: lmforge" in r.stdout


def test_an_unknown_command_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["pretrian"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'pretrian'" in err and all(f"'{c}'" in err for c in SUBCOMMANDS)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_of_every_subcommand(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lmforge " + command)


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 1
    assert "COMMAND" in capsys.readouterr().out


def test_console_script_reports_a_missing_model_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lmforge.cli", "fill-mask", str(tmp_path / "nope"), "a [MASK] b"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "not found" in r.stderr


def test_corrupt_weights_are_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "gpt"}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 40)
    assert main(["generate", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a readable safetensors file" in err
