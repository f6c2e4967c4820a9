"""The ``meta.json`` of a shard folder: every field checked on read.

A hand-edited or damaged ``meta.json`` (``"splits": "x"``, a negative count, a dtype too narrow for
the vocabulary) is refused with one line naming the field and saying to run ``lmforge prepare``
again, before any number from it reaches numpy.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import DataError
from .formats import FORMATS
from .textfiles import ENCODING_ERRORS

FORMAT = "lmforge-shards"
VERSION = 1
SPLITS = ("train", "val")
KINDS = ("wordpiece", "bpe")
COUNTS = ("documents", "sentences", "tokens")
#: the fields every shard folder's meta.json has; the others are checked when present
REQUIRED = ("format", "tokenizer_hash", "tokenizer_kind", "vocab_size", "dtype", "splits")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_meta(meta, path: Path) -> None:
    """Raise DataError naming the first field of ``meta`` (read from ``path``) that is missing or wrong."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{path} is not an lmforge shard meta.json; run lmforge prepare again")

    def bad(field: str, want: str) -> DataError:
        shown = "missing" if field not in meta else f"{_show(meta[field])}"
        return DataError(f"{path}: field {field!r} is {shown}, expected {want}; run lmforge prepare again")

    for field in REQUIRED:
        if field not in meta:
            raise bad(field, "to be there")
    version = meta.get("version", VERSION)
    if not _is_int(version) or version < 1:
        raise bad("version", f"a shard format number (1 to {VERSION})")
    if version > VERSION:
        raise DataError(f"{path.parent} was written by a newer lmforge (shard format {version}); upgrade lmforge")
    if not isinstance(meta["tokenizer_hash"], str) or not meta["tokenizer_hash"]:
        raise bad("tokenizer_hash", "the tokenizer's hash (a string)")
    if meta["tokenizer_kind"] not in KINDS:
        raise bad("tokenizer_kind", " or ".join(KINDS))
    vocab = meta["vocab_size"]
    if not _is_int(vocab) or not 0 < vocab <= 2**32:
        raise bad("vocab_size", "a positive whole number")
    want_dtype = "uint16" if vocab <= 1 << 16 else "uint32"
    if meta["dtype"] not in ("uint16", "uint32") or (meta["dtype"] == "uint16" and want_dtype == "uint32"):
        raise bad("dtype", f"{want_dtype} for a vocabulary of {vocab}")
    _check_eot(meta, bad)
    val_fraction = meta.get("val_fraction", 0.0)
    if (not isinstance(val_fraction, (int, float)) or isinstance(val_fraction, bool) or not math.isfinite(val_fraction)
            or not 0 <= val_fraction < 1):
        raise bad("val_fraction", "a number in [0, 1)")
    if meta.get("encoding_errors", "strict") not in ENCODING_ERRORS:
        raise bad("encoding_errors", " or ".join(ENCODING_ERRORS))
    _check_splits(meta, bad)
    _check_sources(meta, bad)


def _check_eot(meta: dict, bad) -> None:
    eot = meta.get("eot_id")
    if meta["tokenizer_kind"] == "wordpiece":
        if eot is not None:
            raise bad("eot_id", "null for WordPiece shards")
    elif not _is_int(eot) or not 0 <= eot < meta["vocab_size"]:
        raise bad("eot_id", f"the id of <|endoftext|> (0 to {meta['vocab_size'] - 1})")


def _check_splits(meta: dict, bad) -> None:
    splits = meta["splits"]
    want = "{'train': {...}, 'val': {...}} with documents, sentences and tokens counts"
    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise bad("splits", want)
    for split in SPLITS:
        c = splits[split]
        if not isinstance(c, dict) or any(not _is_int(c.get(k)) or c[k] < 0 for k in COUNTS):
            raise bad("splits", f"{split!r} to hold whole-number counts >= 0 of {', '.join(COUNTS)}")
        if not c["documents"] <= c["sentences"] <= c["tokens"]:
            raise bad("splits", f"{split!r} counts with documents <= sentences <= tokens")


def _check_sources(meta: dict, bad) -> None:
    if "sources" not in meta:
        return
    sources = meta["sources"]
    want = "a list of {path, bytes, layout[, format, field]}"
    if not isinstance(sources, list):
        raise bad("sources", want)
    for s in sources:
        if (not isinstance(s, dict) or not isinstance(s.get("path"), str) or not _is_int(s.get("bytes"))
                or s["bytes"] < 0 or not isinstance(s.get("layout"), str) or s.get("format", "text") not in FORMATS
                or not isinstance(s.get("field", ""), str)):
            raise bad("sources", want)
