import subprocess
import sys

import pytest

from lmforge.cli import COMMAND_MODULES, build_parser, main

SUBCOMMANDS = ["demo", "tokenizer", "prepare", "pretrain", "generate", "fill-mask", "embed", "encode", "neighbors",
               "evaluate",
               "finetune", "predict", "benchmark", "export-hf", "import-hf", "serve"]


def test_every_command_module_is_present():
    # A missing module would silently drop its subcommand from `lmforge --help`.
    choices = set(build_parser()._subparsers._group_actions[0].choices)
    assert choices == set(SUBCOMMANDS)
    assert len(COMMAND_MODULES) == 15


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
