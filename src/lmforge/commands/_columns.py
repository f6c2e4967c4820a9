"""The flags that say which column of a labelled data file holds what (finetune, evaluate run).

:func:`add_column_args` adds them as one argument group and hands the command's data files to its
``run`` as :class:`~lmforge.data.columns.DataFile` values, paths that carry the mapping, so every
loader the command reaches (``load_task``, ``run_transfer``, the held-out split) reads them as the
user said, and a command's own code does not change.
"""

from __future__ import annotations

import functools

from ..data.columns import Columns, DataFile

GROUP_HELP = (
    "Labelled files may be CSV (delimiter sniffed), TSV, JSON Lines, JSON, Parquet or a folder written by datasets' "
    "save_to_disk, compressed or not. By default the columns are named after the fields (text, text_pair, label; "
    "words, tags; question, context, answers, id; context, choices, label). Give a column by name, or give every one "
    "as a 0-based position to read a CSV/TSV file without a header row (e.g. --text-column 0 --label-column 1)."
)
# field -> (flag, help)
_FIELDS = {
    "text": ("--text-column", "classify/pair: the text (default text)"),
    "text_pair": ("--text-pair-column", "pair: the second text (default text_pair)"),
    "label": ("--label-column", "classify/pair: the label; choice: the right choice's 0-based index (default label)"),
    "words": ("--words-column", "tokens: the list of words, or CoNLL's word column as a position (default words)"),
    "tags": ("--tags-column", "tokens: the list of tags, or CoNLL's tag column as a position (default tags)"),
    "question": ("--question-column", "qa: the question (default question)"),
    "context": ("--context-column", "qa: the passage; choice: the context (default context)"),
    "answers": ("--answers-column", "qa: the answers, {text: [...], answer_start: [...]} as in HF squad "
                "(default answers)"),
    "id": ("--id-column", "qa: the question id (default id; the record's place when absent)"),
}


def add_column_args(p, files: tuple[str, ...] = ("train", "test")) -> None:
    """Add the column flags to parser ``p`` and read its ``files`` arguments through them.

    Call it after ``p.set_defaults(func=run)``: ``run`` then receives ``args.<file>`` as DataFiles.
    """
    run = p.get_default("func")
    if run is None:
        raise RuntimeError("add_column_args needs the command's func: call it after set_defaults(func=...)")
    g = p.add_argument_group("columns of the data files", GROUP_HELP)
    for field, (flag, text) in _FIELDS.items():
        g.add_argument(flag, dest=f"{field}_column", default=None, metavar="NAME|N", help=text)
    g.add_argument("--choices-column", dest="choices_column", nargs="+", default=None, metavar="NAME|N",
                   help="choice: one column holding the list of choices, or several columns holding one choice each "
                   "(default choices, else choice0, choice1, ...)")
    p.set_defaults(func=functools.partial(_with_columns, run, files))


def columns_from_args(args):
    """The :class:`~lmforge.data.columns.Columns` the flags give."""

    fields = [*_FIELDS, "choices"]
    return Columns.of(**{f: getattr(args, f"{f}_column", None) for f in fields})


def _with_columns(run, files: tuple[str, ...], args) -> int:

    columns = columns_from_args(args)
    for name in files:
        path = getattr(args, name, None)
        if path is not None:
            setattr(args, name, DataFile(path, columns))
    return run(args)
