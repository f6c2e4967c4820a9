"""Vectors out of any model: one vector per text (:func:`encode`), read from and written to files.

:func:`encode` is built on the body interface's ``embed(texts)`` (:class:`lmforge.models.base.TokenLayers`: the
tokens of each text, their character offsets and every layer's vector of every token), so it works for
every family and for any stand-in body that offers ``embed``.  A word's nearest words are
:func:`lmforge.models.neighbors.neighbors`.

Pooling (``pool``) turns a text's token vectors at one layer into one vector:

- ``mean``: the mean over the text's tokens (what sentence-transformers calls mean pooling);
- ``max``: the largest value of each dimension over the tokens;
- ``cls``: the vector of the model's ``[CLS]`` token (BERT: the first position of the text's first
  window). GPT, ELMo and word2vec have no such token, and ``cls`` is refused for them: their first
  position is simply the first word's vector (GPT's first position sees nothing but itself);
- ``mean+specials`` (BERT, ELECTRA): sentence-transformers' mean, over every position the model reads,
  ``[CLS]`` and ``[SEP]`` included, of the text's first ``max_position_embeddings`` tokens
  (:mod:`lmforge.models.sentence`): what a model exported by ``export-hf`` gives in ``SentenceTransformer``.

With no ``pool`` and no ``layer``, a model folder that records a sentence pipeline (imported from a
sentence-transformers folder) is read through it, so its vectors are sentence-transformers' own; any other
model is read with ``mean``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..data.formats import RECORD_FORMATS, detect, iter_records, record_fields
from ..data.textfiles import read_lines
from ..errors import DataError, LmforgeError
from . import onnx_backend, sentence
from .family_hook import family_of

POOLS = ("mean", "cls", "max", "mean+specials")

Progress = bool | Callable[[int], None]


def encode(
    body,
    texts: Sequence[str],
    *,
    layer: int | None = None,
    pool: str | None = None,
    normalize: bool | None = None,
    batch_size: int = 32,
    progress: Progress = False,
    prompt_name: str | None = None,
    forward: sentence.Forward | None = None,
    backend: str = "torch",
    quantize: str = "none",
) -> np.ndarray:
    """One vector per text, from one layer of the model, pooled over the text's tokens.

    Args:
        body: any model with ``embed(texts) -> list[TokenLayers]`` (every lmforge family); ``hidden_size`` is
            read only for an empty list of texts.
        texts: the texts; each needs at least one token (an empty or blank text is an error naming it).
        layer: which layer of ``embed``'s ``(L, n, C)``: 0 is the token embedding, ``L - 1`` the top; negative
            counts from the top (-1 = the top); None = the top layer.
        pool: ``mean``, ``max``, ``cls`` or ``mean+specials`` (see the module docstring); None = the model's
            sentence pipeline when it records one (and ``layer`` is None), else ``mean``.
        normalize: scale each vector to unit L2 norm (an all-zero vector stays zero); None = as the sentence
            pipeline says (no pipeline: False).
        batch_size: texts per ``embed`` call; texts are batched shortest first, so a batch holds texts of
            similar length (the rows of the result keep the order of ``texts``).
        progress: True shows a tqdm bar on stderr; a callable is called with the number of texts done after
            each batch (the CLI's plain progress lines).
        prompt_name: a sentence pipeline's prompt to put before each text (None: its default prompt, if any).
        forward: a sentence pipeline's forward pass (:data:`lmforge.models.sentence.Forward`, e.g. an ONNX
            Runtime session); None = the one ``backend`` and ``quantize`` name.
        backend: ``torch``, ``onnx`` or ``auto`` (the faster, measured once per model and machine), for a
            sentence pipeline (:func:`choose_forward`).
        quantize: ``none`` or ``int8`` (ONNX Runtime's dynamic int8; approximate: see docs/vectors.md).
    Returns:
        float32 array of shape (len(texts), C); row i is text i's vector.
    """
    texts = _check_texts(texts)
    if batch_size < 1:
        raise LmforgeError(f"batch size must be >= 1, got {batch_size}")
    pipeline = sentence_pipeline(body, layer, pool)
    if pipeline is None and (prompt_name is not None or forward is not None):
        raise LmforgeError("prompts and other backends apply to a sentence pipeline: a model imported from "
                           "sentence-transformers, or pool 'mean+specials', with no layer given")
    if forward is None and texts:
        forward, _ = choose_forward(body, texts, layer=layer, pool=pool, backend=backend, quantize=quantize,
                                    batch_size=batch_size)
    if pipeline is not None:
        with progress_updates(progress, len(texts)) as update:
            return sentence.encode(body, texts, pipeline, normalize=normalize, batch_size=batch_size,
                                   prompt_name=prompt_name, forward=forward, update=update)
    pool = pool or "mean"
    if pool not in POOLS:
        raise LmforgeError(f"unknown pool '{pool}'; choose one of {', '.join(POOLS)}")
    if not texts:
        return np.zeros((0, body.hidden_size), dtype=np.float32)
    out = _pooled_tokens(body, texts, layer, pool, batch_size, progress)
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.where(norms > 0, norms, 1).astype(np.float32)
    return out


def _pooled_tokens(body, texts: list[str], layer: int | None, pool: str, batch_size: int,
                   progress: Progress) -> np.ndarray:
    """lmforge's per-token pooling of every text (``embed``'s windows for long texts), (n, C) float32."""
    out = None
    # Texts of similar length share a batch, so little of each forward pass is padding; row i stays text i.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with progress_updates(progress, len(texts)) as update:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for i, token_layers in zip(chunk, body.embed([texts[i] for i in chunk])):
                vector = _pool_one(token_layers, layer, pool, i, body)
                if out is None:  # the width from the vectors themselves: a stand-in body needs only embed
                    out = np.zeros((len(texts), vector.shape[0]), dtype=np.float32)
                out[i] = vector
            update(len(chunk))
    return out


def sentence_pipeline(body, layer: int | None, pool: str | None) -> sentence.SentencePipeline | None:
    """The sentence pipeline ``encode`` reads ``body`` with for these arguments, or None (per-token pooling)."""
    if pool == "mean+specials":
        family = family_of(getattr(body, "model_type", None))
        if layer is not None or family is None or not family.sentence_transformers:
            raise LmforgeError("pool 'mean+specials' reads the top layer of a BERT or ELECTRA model (no layer)")
        return sentence.lmforge_pipeline(body)
    recorded = getattr(body, "sentence_pipeline", None)
    return recorded if pool is None and layer is None else None


def choose_forward(body, texts: Sequence[str], *, layer: int | None = None, pool: str | None = None,
                   backend: str = "torch", quantize: str = "none",
                   batch_size: int = 32) -> tuple[sentence.Forward | None, str]:
    """The forward pass :func:`encode` runs for these arguments and the backend's name (``torch``: None, the
    body itself).  ONNX Runtime and int8 apply to a sentence pipeline only; ``auto`` times both backends on a
    batch of ``texts`` once per model and machine (:func:`lmforge.models.onnx_backend.select`)."""
    if backend == "torch" and quantize == "none":
        return None, "torch"
    pipeline = sentence_pipeline(body, layer, pool)
    if pipeline is None:
        raise LmforgeError("--backend onnx/auto and --quantize int8 read a sentence pipeline: a model imported "
                           "from sentence-transformers, or --pool mean+specials (BERT, ELECTRA), with no --layer")
    probe = sentence.probe_batch(body, pipeline, list(texts)[:batch_size]) if backend == "auto" else None
    return onnx_backend.select(body, backend, quantize, probe)


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise LmforgeError("texts must be a list of strings, not one string; wrap it: [text]")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise LmforgeError(f"text {i} is a {type(t).__name__}, not a string")
        if not t.strip():
            raise LmforgeError(f"text {i} is empty; every text needs at least one word (drop blank texts first)")
    return texts


def resolve_layer(layer: int | None, n_layers: int) -> int:
    """The index in ``0..n_layers-1`` that ``layer`` names (None = the top; negative counts from the top)."""
    if layer is None:
        return n_layers - 1
    index = layer + n_layers if layer < 0 else layer
    if not 0 <= index < n_layers:
        raise LmforgeError(
            f"layer {layer} does not exist: this model has layers 0..{n_layers - 1} (0 = the token embedding, "
            f"{n_layers - 1} = the top; -1 also means the top)"
        )
    return index


def _pool_one(token_layers, layer: int | None, pool: str, index: int, body) -> np.ndarray:
    """Pool one text's :class:`TokenLayers` at ``layer`` into a (C,) vector."""
    layers = token_layers.layers  # (L, n, C)
    at = resolve_layer(layer, layers.shape[0])
    if pool == "cls":
        cls = getattr(token_layers, "cls", None)
        if cls is None:
            family = getattr(body, "model_type", "this")
            raise LmforgeError(
                f"pool 'cls' needs a [CLS] token, which {family} models do not have; use pool 'mean' or 'max'"
            )
        return cls[at].float().numpy()
    vecs = layers[at]  # (n, C)
    if vecs.shape[0] == 0:
        raise LmforgeError(f"text {index} has no tokens the model knows; every text needs at least one token")
    pooled = vecs.mean(dim=0) if pool == "mean" else vecs.max(dim=0).values
    return pooled.float().numpy()


@contextlib.contextmanager
def progress_updates(progress: Progress, total: int) -> Iterator[Callable[[int], None]]:
    """Yield ``update(n_done_now)``: a tqdm bar on stderr (``progress=True``), the caller's callable, or nothing."""
    if callable(progress):
        yield progress
    elif progress:
        with tqdm(total=total, unit="text", desc="encode", file=sys.stderr, dynamic_ncols=True, leave=False) as bar:
            yield bar.update
    else:
        yield lambda n: None


# -- files in and out (lmforge encode) ------------------------------------------------------------


#: the record formats read through :func:`lmforge.data.formats.iter_records` (JSON Lines is read here, line by line)
_TABLE_FORMATS = tuple(f for f in RECORD_FORMATS if f != "jsonl")


def read_texts(path: str | Path, text_field: str | None = None, fmt: str = "auto",
               split: str | None = None, skip_blank: bool = False) -> list[str]:
    """The texts of a file, in file order: plain UTF-8 lines (.txt, compressed too), JSON Lines, or the records
    of a JSON array, a CSV/TSV file, a Parquet file or a ``datasets`` folder.

    Args:
        path: the file (or ``datasets`` folder).
        text_field: the field or column holding the text (``text`` when None); a 0-based number reads a CSV/TSV
            file without a header row. Giving it to a plain-text file means JSON lines.
        fmt: ``auto``, ``lines`` (plain text) or a record format (:data:`lmforge.data.formats.RECORD_FORMATS`);
            ``auto`` tells a record format from the content (JSON Lines also from
            a .jsonl suffix or a given ``text_field``), else lines.
        split: a ``datasets`` folder holding several splits: the one to read (default ``train``).
        skip_blank: leave blank lines and records out (a corpus) instead of refusing them (one text per row).
    Returns:
        The texts.  A blank text, a record without the field and a field that is not a string are DataErrors
        naming the line or record.  ``auto`` reads a file that starts with a JSON object as JSON Lines whatever
        its suffix; ``lines`` reads its lines as they are.
    """
    p = Path(path)
    if fmt == "auto" and p.exists():
        found = detect(p)
        if found in RECORD_FORMATS:  # JSON syntax is never taken for text, as the corpus readers decide
            fmt = found
    if fmt in _TABLE_FORMATS:
        return _record_texts(p, fmt, text_field or "text", split, skip_blank)
    jsonl = fmt == "jsonl" or (fmt == "auto" and (text_field is not None or p.suffix == ".jsonl"))
    field = text_field or "text"
    texts = []
    for lineno, line in enumerate(read_lines(p), 1):
        if jsonl and line.strip():
            line = _json_text(line, field, p, lineno)
        if not line.strip():
            if skip_blank:
                continue
            raise DataError(f"{p} line {lineno} is blank; give one text per line (remove blank lines)")
        texts.append(line)
    if not texts:
        raise DataError(f"{p} holds no texts; give one text per line")
    return texts


def _record_texts(p: Path, fmt: str, field: str, split: str | None, skip_blank: bool) -> list[str]:
    """The ``field`` of every record of a JSON, CSV/TSV, Parquet or ``datasets`` input."""
    if not p.exists():
        raise DataError(f"{p} does not exist")
    by_position = fmt in ("csv", "tsv") and field.isdigit()
    split = split or "train"
    fields = record_fields(p, fmt, by_position, split)
    kind, flag = ("column", "--text-column") if fmt in ("csv", "tsv") else ("field", "--text-field")
    if fields and field not in fields:
        if by_position:
            raise DataError(f"{p} has {len(fields)} columns, no column {field} (0-based); give {flag} N, a "
                            f"position below {len(fields)}")
        raise DataError(f"{p} ({fmt}) has no {kind} '{field}' ({kind}s: {', '.join(map(str, fields))}); choose "
                        f"one with {flag} NAME")
    texts = []
    for where, record in iter_records(p, fmt, [field], by_position=by_position, split=split):
        value = record.get(field)
        if skip_blank and (value is None or isinstance(value, str) and not value.strip()):
            continue
        if not isinstance(value, str):
            what = "missing" if value is None else f"a {type(value).__name__}, not a string"
            raise DataError(f"{where}: {kind} '{field}' is {what}; every record needs a text")
        if not value.strip():
            raise DataError(f"{where}: {kind} '{field}' is blank; every record needs a text (drop the blank ones)")
        texts.append(value)
    if not texts:
        raise DataError(f"{p} holds no records; give at least one text")
    return texts


def _json_text(line: str, field: str, p: Path, lineno: int) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        raise DataError(f"{p} line {lineno} is not JSON; give one JSON object per line") from None
    if not isinstance(record, dict) or field not in record:
        found = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{p} line {lineno} has no field '{field}' (found: {found}); choose one with --text-field")
    if not isinstance(record[field], str):
        raise DataError(f"{p} line {lineno}: field '{field}' is a {type(record[field]).__name__}, not a string")
    return record[field]
