"""Write docs/cli.md, the command-line reference, from the argparse definitions of ``lmforge``.

    python scripts/gen_cli_reference.py            # rewrite docs/cli.md
    python scripts/gen_cli_reference.py --check    # exit 1 if docs/cli.md is stale

The page is rendered from the parser's actions (not from ``format_help``), so it does not depend on
the terminal width or on the Python version's help layout. tests/test_docs.py fails when the page
is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"

HEADER = """\
# Command-line reference

Generated from the argparse definitions by `python scripts/gen_cli_reference.py`; do not edit by
hand. `lmforge COMMAND --help` prints the same. Start with the [tutorial](tutorial.md) for how
the commands fit together.

## One grammar

Every command is read the same way:

```text
lmforge [-q] COMMAND [VERB] INPUT ... [--out OUTPUT] [OPTIONS]
```

- **Inputs are positional, the output is `--out`.** What a command reads (a model folder, a run folder, a
  corpus) comes after the command; what it writes is named with `--out` (a folder, or a file whose suffix
  says its format), on every command that writes: `lmforge export-hf runs/ft --out hf-ft`,
  `lmforge benchmark text en-tweets --out tweets.txt`. No command takes its output as a positional word.
- **Global options go before or after the command**: `lmforge -q prepare ...` and `lmforge prepare -q ...`
  are the same.
- **Options are spelled in full.** `--epoch` is not taken for `--epochs`: an option a command does not
  know is answered in one line with that command's closest option (`unknown option --epoch; did you mean
  --epochs?`), and a flag that was renamed says how it is written now.
- **One spelling per setting.** A setting is a flag, or a key of a run file (`--config FILE`, `--set
  KEY=VALUE`), not both.
- **Errors in what you typed** print one line on stderr, saying what is wrong and what to write instead, and
  exit with status 2.
"""

# the output policy every writing command shares (lmforge/folders.py owns it); its own section, kept apart
# from the header
OUTPUTS = """\
## Existing outputs

Every command that writes (`tokenizer train`, `prepare`, `pretrain`, `finetune`, `export-hf`, `import-hf`,
`encode`, `predict --out`, `evaluate run --out`, `benchmark text`, `benchmark data`, `benchmark curve`)
treats an output that already exists the same way:

- Without `--overwrite`, an existing output is refused in one line (exit status 2) and left as it was: a
  file of that name, a folder lmforge wrote, or a folder holding files lmforge did not write.
  `pretrain --resume` continues the model folder instead; `demo` reuses its own folder (`--force`
  rebuilds its steps).
- With `--overwrite`, the new output is written beside the old one and takes its place only when it is
  complete: a command that fails or is killed leaves the old output whole. A file is replaced in one
  rename.
- `--overwrite` never deletes what lmforge did not write. Each kind of folder (model, run, shards,
  tokenizer, export) holds its own file names; anything else you put there (notes, your data, your own
  subfolders) is moved into the new folder. When one of your files has a name the new folder writes
  (your own `metrics.json` in a run folder), the command refuses before any work and names it: move or
  rename it first.
- An output is never one of the command's inputs, nor inside or around one, even with `--overwrite`
  (`finetune M --out M`, `predict RUN --file a.csv --out a.csv`).
- `benchmark data` and `benchmark curve` write plain files into a folder: only a file of the same name
  stands in the way.
"""


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of each subcommand, in the order `--help` lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a parser already listed
                    continue
                seen.add(id(sub))
                out.append((name, sub, helps.get(name, "")))
    return out


def _expand(text: str, action: argparse.Action) -> str:
    """argparse's ``%(default)s`` style substitutions, as ``--help`` makes them."""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def _signature(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if action.choices is not None and action.metavar is None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    suffix = f" {metavar} ..." if action.nargs in ("+", "*") else f" {metavar}"
    return ", ".join(s + suffix for s in action.option_strings)


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        shown = getattr(action, "full_help", action.help)  # full_help: an option --help leaves to --help-all
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or shown == argparse.SUPPRESS:
            continue
        text = _expand(shown or "", action).replace("\n", " ").replace("|", "\\|")
        if action.required and action.option_strings:
            text = f"(required) {text}"
        rows.append(f"| `{_signature(action)}` | {text} |")
    if not rows:
        return []
    return ["| argument | meaning |", "|---|---|", *rows, ""]


def _section(path: str, parser: argparse.ArgumentParser, summary: str, level: int) -> list[str]:
    lines = [f"{'#' * level} `{path}`", ""]
    description = parser.description or summary
    if description:
        lines += [description.strip(), ""]
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines += ["```text", usage, "```", ""]
    lines += _arguments(parser)
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    for name, sub, help_ in _subparsers(parser):
        lines += _section(f"{path} {name}", sub, help_, min(level + 1, 4))
    return lines


def render() -> str:
    import os

    os.environ["COLUMNS"] = "100"  # usage lines wrap at a fixed width whatever the terminal
    from lmforge.cli import build_parser

    parser = build_parser()
    lines = [HEADER]
    commands = _subparsers(parser)
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`lmforge {name}`](#lmforge-{name.replace('_', '')}) | {help_} |" for name, _, help_ in commands]
    lines += ["", OUTPUTS]
    for name, sub, help_ in commands:
        lines += _section(f"lmforge {name}", sub, help_, 2)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/cli.md differs from the parser")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print("docs/cli.md is stale: run python scripts/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
