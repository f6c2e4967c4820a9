"""What a data file holds, told from its content, and the records of the tabular formats.

Formats (:data:`FORMATS`): ``text``, ``jsonl`` (JSON Lines), ``json`` (an array of records, or an
object holding one), ``csv`` and ``tsv`` (delimiter sniffed with :class:`csv.Sniffer`), ``parquet``
(read with pyarrow, a batch at a time) and ``dataset`` (a folder written by HF ``datasets``'
``save_to_disk``, or a dataset that the installed ``datasets`` loads offline). Every file may be
gzip, bzip2, xz or zstandard compressed (:mod:`lmforge.data.compression`).

:func:`detect` reads the first bytes: a file that starts with a JSON object is JSON Lines whatever
its suffix (so JSON syntax is never taken for text), ``PAR1`` is Parquet, and a ``.csv``/``.tsv``
suffix or a header row over rows of equal width is CSV/TSV. :func:`iter_records` streams the
records of the tabular formats as dicts, each with where it came from (``file:line`` or
``file: record N``) for messages.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import DataError, require
from .compression import open_binary, stripped_suffix
from .textfiles import check_file, read_head, utf16_name

FORMATS = ("text", "jsonl", "json", "csv", "tsv", "parquet", "dataset")
RECORD_FORMATS = FORMATS[1:]
_TEXT_SUFFIXES = {".txt", ".text", ".md", ".rst", ".raw", ".tokens"}
_HEADER_NAME = re.compile(r"[A-Za-z_][\w .\-]{0,63}")
_SNIFF_BYTES = 1 << 16
CSV_DELIMITERS = ",\t;|"

Record = dict
Where = str


def is_dataset_folder(p: Path) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return p.is_dir() and ((p / "state.json").is_file() and (p / "dataset_info.json").is_file()
                           or (p / "dataset_dict.json").is_file())


def detect(path: Path) -> str | None:
    """The format of ``path``'s content (see the module docstring); None for binary data of no known format.

    UTF-16 text is reported as ``text`` so that reading it gives the error saying how to convert it.
    """
    if path.is_dir():
        return "dataset" if is_dataset_folder(path) else None
    with open(path, "rb") as f:
        if f.read(4) == b"PAR1":
            return "parquet"
    head = read_head(path, _SNIFF_BYTES)
    suffix = stripped_suffix(path)
    if utf16_name(head):
        return "text"
    if b"\x00" in head[:8192]:  # as check_file looks: a NUL further on is reported with its line
        return "parquet" if suffix == ".parquet" else None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if len(head) == _SNIFF_BYTES:  # the last line may be cut
        text = text[: text.rfind("\n") + 1] or text
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if text.startswith("{") or re.match(r"\[\s*([{\"\[\]]|-?\d)", text):
        # one JSON value a line is JSON Lines; a value over several lines (or the only line) is JSON
        return "jsonl" if _first_value_is_line(text) and _second_line_is_json(text) else "json"
    if suffix == ".json":
        return "json"
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".tsv", ".tab"):
        return "tsv"
    if suffix == ".csv":
        return "csv"
    if suffix in _TEXT_SUFFIXES:
        return "text"
    return _sniff_table(text) or "text"


def _first_value_is_line(text: str) -> bool:
    """True when the first line alone is a complete JSON value (JSON Lines), not the start of a longer one."""
    try:
        json.loads(text.split("\n", 1)[0])
    except ValueError:
        return False
    return True


def _second_line_is_json(text: str) -> bool:
    rest = [line for line in text.split("\n")[1:] if line.strip()]
    return bool(rest) and rest[0].lstrip()[:1] in "[{"


def _sniff_table(text: str) -> str | None:
    """``csv``/``tsv`` when the head is a header row of names over at least two rows of the same width."""
    lines = [line for line in text.splitlines() if line.strip()][:50]
    if len(lines) < 3:
        return None
    delimiter = _delimiter(lines)
    if delimiter is None:
        return None
    header = next(csv.reader(lines[:1], delimiter=delimiter))
    if not all(_HEADER_NAME.fullmatch(name.strip()) and name.strip()[-1] not in ".!?" for name in header):
        return None
    return "tsv" if delimiter == "\t" else "csv"


def _delimiter(lines: list[str]) -> str | None:
    """The delimiter that cuts every line into the same number (two or more) of fields: csv.Sniffer's
    guess when it does, else the first of :data:`CSV_DELIMITERS` that does (the sniffer gives up on
    some quoted files); None when none does."""
    def even(d: str) -> bool:
        widths = {len(row) for row in csv.reader(lines, delimiter=d)}
        return len(widths) == 1 and widths.pop() >= 2

    try:
        sniffed = csv.Sniffer().sniff("\n".join(lines), delimiters=CSV_DELIMITERS).delimiter
    except csv.Error:
        sniffed = None
    if sniffed is not None and even(sniffed):
        return sniffed
    return next((d for d in CSV_DELIMITERS if even(d)), None)


def sniff_delimiter(path: Path, fmt: str) -> str:
    """The delimiter of a ``csv`` file (see :func:`_delimiter`; ``,`` when no delimiter fits every line)."""
    if fmt == "tsv":
        return "\t"
    sample = read_head(path, _SNIFF_BYTES).decode("utf-8", errors="replace")
    lines = [line for line in sample.splitlines() if line.strip()]
    if len(sample) >= _SNIFF_BYTES // 2 and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut off
    return _delimiter(lines[:50]) or ","


# --- records ------------------------------------------------------------------------------------


def iter_records(path: Path, fmt: str, fields: Sequence[str] | None = None, by_position: bool = False,
                 encoding_errors: str = "strict", on_bytes: Callable[[int], None] | None = None,
                 split: str | None = None) -> Iterator[tuple[Where, Record]]:
    """Stream the records of a file in a record format (see :data:`RECORD_FORMATS`).

    Args:
        path: the file (or a ``datasets`` folder).
        fmt: its format, from :func:`detect`.
        fields: the fields needed (Parquet and datasets read only these; None: all).
        by_position: CSV/TSV without a header row: a record's keys are ``"0"``, ``"1"``, ...
        encoding_errors: ``"strict"`` or ``"replace"`` for bytes that are not UTF-8.
        on_bytes: called with bytes of the stored file read since the last call (for progress).
        split: a ``datasets`` folder holding several splits (a DatasetDict): the one to read.
    Yields:
        ``(where, record)``: ``"file:line"`` or ``"file: record N"``, and the record's fields.
    Raises:
        DataError: a record that does not parse, with where it is and what to do.
    """
    if fmt == "jsonl":
        yield from _jsonl_records(path, encoding_errors, on_bytes)
    elif fmt == "json":
        yield from _json_records(path, encoding_errors, on_bytes)
    elif fmt in ("csv", "tsv"):
        yield from _csv_records(path, sniff_delimiter(path, fmt), by_position, encoding_errors, on_bytes)
    elif fmt == "parquet":
        yield from _parquet_records(path, fields, on_bytes)
    elif fmt == "dataset":
        ds = open_dataset(str(path), split)
        yield from dataset_records(ds, str(path), fields, on_bytes, _folder_size(path))
    else:
        raise ValueError(f"not a record format: {fmt}")


def _progress(on_bytes: Callable[[int], None] | None, stored: Callable[[], int]) -> Callable[[], None]:
    state = [0]

    def report() -> None:
        if on_bytes is not None:
            now = stored()
            if now > state[0]:
                on_bytes(now - state[0])
                state[0] = now

    return report


def _decode(raw: bytes, where: str, encoding_errors: str) -> str:
    try:
        return raw.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: bytes that are not UTF-8 ({raw[e.start:e.start + 4]!r}); convert the file to "
                        "UTF-8 or pass --encoding-errors replace") from None


def _jsonl_records(path: Path, encoding_errors: str, on_bytes) -> Iterator[tuple[Where, Record]]:
    check_file(path)
    with open_binary(path) as (f, stored):
        report = _progress(on_bytes, stored)
        for n, raw in enumerate(f, 1):
            if n % 4096 == 0:
                report()
            line = _decode(raw, f"{path}:{n}", encoding_errors).lstrip("\ufeff")
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not JSON ({e.msg}); a JSON Lines file holds one JSON object a line"
                                + ("; give --format text to read it as plain text" if n == 1 else "")) from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{n}: a JSON {type(rec).__name__}, not an object; a JSON Lines file holds "
                                "one object a line, e.g. {\"text\": \"...\"}")
            yield f"{path}:{n}", rec
        report()


def _json_records(path: Path, encoding_errors: str, on_bytes) -> Iterator[tuple[Where, Record]]:
    """An array of objects, an object with one array of objects in it (``{"data": [...]}``), or one object."""
    check_file(path)
    with open_binary(path) as (f, stored):
        text = _decode(f.read(), str(path), encoding_errors).lstrip("\ufeff")
        if on_bytes is not None:
            on_bytes(stored())
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); give JSON (an array of objects) "
                        "or JSON Lines (one object a line)") from None
    if isinstance(data, dict):
        lists = [k for k, v in data.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        data = data[lists[0]] if len(lists) == 1 else [data]
    if not isinstance(data, list):
        raise DataError(f"{path} holds a JSON {type(data).__name__}; give an array of objects or JSON Lines")
    for i, rec in enumerate(data, 1):
        if not isinstance(rec, dict):
            raise DataError(f"{path}: record {i} is a JSON {type(rec).__name__}, not an object")
        yield f"{path}: record {i}", rec


#: the longest CSV field read (the csv module's own limit is 131,072 characters)
CSV_FIELD_CHARS = 1 << 26


def _csv_records(path: Path, delimiter: str, by_position: bool, encoding_errors: str,
                 on_bytes) -> Iterator[tuple[Where, Record]]:
    check_file(path)
    with open_binary(path) as (f, stored):
        report = _progress(on_bytes, stored)
        text = io.TextIOWrapper(f, encoding="utf-8-sig", errors=encoding_errors, newline="")
        # the csv module stops at 131,072 characters a field; a document-long text is a fair field
        csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_CHARS))
        reader = csv.reader(text, delimiter=delimiter, strict=True)
        header: list[str] | None = None
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise _csv_error(path, start, reader.line_num, str(e)) from None
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{start}: bytes that are not UTF-8 ({e.object[e.start:e.start + 4]!r}); "
                                "convert the file to UTF-8 or pass --encoding-errors replace") from None
            if reader.line_num % 4096 == 0:
                report()
            if not row or not any(c.strip() for c in row):
                continue
            if by_position:
                yield f"{path}:{start}", {str(i): v for i, v in enumerate(row)}
                continue
            if header is None:
                header = [h.strip() for h in row]
                continue
            if len(row) > len(header):
                raise DataError(f"{path}:{start}: {len(row)} fields but the header names {len(header)} "
                                f"({', '.join(header)}); quote texts holding the delimiter {delimiter!r}")
            yield f"{path}:{start}", dict(zip(header, row + [None] * (len(header) - len(row))))
        report()
        if header is None and not by_position:
            raise DataError(f"{path} is empty; it needs a header row naming the columns and one row per example")


def _csv_error(path: Path, start: int, line: int, message: str) -> DataError:
    """A CSV record that does not parse: a quote left open is named with the line it opened on."""
    if "field larger than field limit" in message:
        return DataError(f"{path}:{start}: a field is longer than {csv.field_size_limit():,} characters, the most "
                         "lmforge reads in one field; split the text into several records")
    if "unexpected end of data" in message:
        return DataError(f"{path}:{start}: the quote (\") opened on line {start} is never closed; close it, or write "
                         "a quote inside a quoted field as two (\"\")")
    if line > start:  # the record ran on over lines: a quoted field opened on its first line did not close there
        return DataError(f"{path}:{start}: the quote (\") opened on line {start} is not closed on that line; the "
                         f"field runs on to line {line} ({message}); close it, or write a quote inside a quoted field "
                         "as two (\"\")")
    return DataError(f"{path}:{line}: not valid CSV ({message}); a quote inside a quoted field is written as two "
                     "(\"\")")


def _parquet_records(path: Path, fields: Sequence[str] | None, on_bytes) -> Iterator[tuple[Where, Record]]:
    pq = require("pyarrow.parquet", "data")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses of its own
        raise DataError(f"{path} is not a readable Parquet file ({e})") from None
    names = pf.schema_arrow.names
    columns = [c for c in fields if c in names] if fields is not None else None
    total_rows = max(1, pf.metadata.num_rows)
    size = path.stat().st_size
    i = 0
    for batch in pf.iter_batches(batch_size=1024, columns=columns):
        for rec in batch.to_pylist():
            i += 1
            yield f"{path}: record {i}", rec
        if on_bytes is not None:
            on_bytes(size * batch.num_rows // total_rows)


def record_fields(path: Path, fmt: str, by_position: bool = False, split: str | None = None) -> list[str]:
    """The field names of a record file: the CSV header, the Parquet schema, the dataset's features, or
    the first JSON record's keys (for messages naming what a file holds)."""
    if fmt == "parquet":
        pq = require("pyarrow.parquet", "data")
        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except Exception as e:  # as in _parquet_records
            raise DataError(f"{path} is not a readable Parquet file ({e})") from None
    if fmt == "dataset":
        return list(open_dataset(str(path), split).column_names)
    for _, rec in iter_records(path, fmt, by_position=by_position):
        return list(rec)
    return []


# --- datasets -----------------------------------------------------------------------------------


def _import_datasets():
    """``datasets``, offline: lmforge downloads nothing at run time."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    datasets = require("datasets", "data")
    datasets.config.HF_HUB_OFFLINE = True  # also when datasets was imported before the variables were set
    return datasets


def open_dataset(name: str, split: str | None = None):
    """A ``datasets.Dataset``: a ``save_to_disk`` folder, or ``load_dataset(name, split=split)`` offline.

    Raises:
        DataError: nothing by that name here, or a DatasetDict without ``split`` (the message names its splits).
    """
    datasets = _import_datasets()
    p = Path(name)
    try:
        if is_dataset_folder(p):
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(name, split=split)
    except (FileNotFoundError, ConnectionError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Unknown split" in first:
            raise DataError(f"dataset {name} has no split {split!r} ({first}); give --split NAME") from None
        raise DataError(f"cannot load dataset {name!r} offline ({first}); give a folder written by save_to_disk, a "
                        "folder of data files, or a dataset in the local datasets cache") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None or split not in ds:
            wanted = f"has no split {split!r}" if split is not None else "holds several splits"
            raise DataError(f"dataset {name} {wanted} (splits: {', '.join(ds)}); give --split NAME"
                            + (f" or the folder {p / next(iter(ds))}" if is_dataset_folder(p) else ""))
        ds = ds[split]
    return ds


def _folder_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def dataset_records(ds, name: str, fields: Sequence[str] | None, on_bytes, size: int) -> Iterator[tuple[Where, Record]]:
    """The rows of a ``datasets.Dataset`` as dicts, class-label ids turned into their names."""
    if fields is not None:
        ds = ds.select_columns([c for c in fields if c in ds.column_names])
    names = _class_names(ds.features)
    total = max(1, len(ds))
    i = 0
    for batch in ds.iter(batch_size=1024):
        cols = list(batch)
        n = len(batch[cols[0]]) if cols else 0
        for j in range(n):
            i += 1
            rec = {c: batch[c][j] for c in cols}
            for c, to_name in names.items():
                if c in rec:
                    rec[c] = to_name(rec[c])
            yield f"{name}: record {i}", rec
        if on_bytes is not None:
            on_bytes(size * n // total)


def _class_names(features) -> dict[str, Callable]:
    """Field -> a function mapping its class-label ids (or lists of them: tags) to names."""
    datasets = _import_datasets()
    out: dict[str, Callable] = {}
    for name, feature in features.items():
        if isinstance(feature, datasets.ClassLabel):
            out[name] = lambda v, f=feature: None if v is None or v < 0 else f.int2str(v)
            continue
        inner = getattr(feature, "feature", None)  # List / Sequence / LargeList of class labels
        if isinstance(inner, datasets.ClassLabel):
            out[name] = lambda v, f=inner: None if v is None else [f.int2str(x) for x in v]
    return out
