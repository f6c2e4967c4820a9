"""Sentence vectors the way sentence-transformers computes them: a model folder's sentence pipeline.

A sentence-transformers folder is a transformer followed by modules named in ``modules.json``: ``Pooling``
(``1_Pooling/config.json``: mean, [CLS] or max over the token vectors), an optional ``Normalize``, and
``sentence_bert_config.json`` (``max_seq_length``, ``do_lower_case``); ``config_sentence_transformers.json`` may
add prompts.  ``lmforge import-hf`` keeps these as ``sentence_pipeline.json`` in the model folder, and every
way lmforge gives a text's vector (``encode``, ``neighbors``, ``serve``'s ``/v1/embeddings``, ``model.encode``)
then applies it, so the vectors are sentence-transformers' own.

What differs from lmforge's per-token pooling (:mod:`lmforge.models.vectors`): sentence-transformers pools over
every position of the attention mask, ``[CLS]`` and ``[SEP]`` included (its ``Pooling`` knows nothing of special
tokens), reads a text's first ``max_seq_length`` tokens only (the rest is cut, no windows), strips each text and
puts a prompt before it.  The forward pass is a callable ``(ids, mask) -> (B, T, C)`` top-layer states, so the
same pooling runs on torch or on an ONNX Runtime session (:mod:`lmforge.models.onnx_backend`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError, LmforgeError
from ..storage.files import atomic_write_text

PIPELINE_FILE = "sentence_pipeline.json"
ST_POOLS = ("mean", "cls", "max")
# sentence-transformers' Pooling config key -> our pool name (the modes lmforge reproduces)
_ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}
_ST_TYPES = ("sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
             "sentence_transformers.models.Normalize")

#: (B, T) int64 ids and (B, T) int64 mask -> (B, T, C) float32 top-layer states
Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class SentencePipeline:
    """How a model turns a text into one vector, sentence-transformers' way.

    Attributes:
        pool: ``mean`` (over every position of the attention mask, specials included), ``cls`` or ``max``.
        normalize: scale each vector to unit length (the ``Normalize`` module).
        max_seq_length: the most tokens read, specials included (the rest of a text is cut); None = the model's
            positions.
        lowercase: lower-case each text before tokenizing (``do_lower_case``).
        prompts: name -> text put before each text when that prompt is asked for.
        default_prompt_name: the prompt used when none is named (None: no prompt).
        source: where the pipeline came from (the folder it was read from, or ``lmforge``).
    """

    pool: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None
    lowercase: bool = False
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None
    source: str = "lmforge"

    def __post_init__(self) -> None:
        if self.pool not in ST_POOLS:
            raise CheckpointError(f"sentence pipeline pool '{self.pool}' is not one of {', '.join(ST_POOLS)}")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise CheckpointError(f"default prompt '{self.default_prompt_name}' is not among the prompts")


def read_pipeline(folder: str | Path) -> SentencePipeline | None:
    """The pipeline an lmforge model folder records (``sentence_pipeline.json``), or None."""
    p = Path(folder) / PIPELINE_FILE
    if not p.is_file():
        return None
    data = json.loads(p.read_text(encoding="utf-8"))
    try:
        return SentencePipeline(**data)
    except TypeError as e:
        raise CheckpointError(f"{p} cannot be read as a sentence pipeline: {e}") from None


def write_pipeline(pipeline: SentencePipeline, folder: str | Path) -> Path:
    """Write ``sentence_pipeline.json`` into ``folder`` (atomically)."""
    p = Path(folder) / PIPELINE_FILE
    atomic_write_text(p, json.dumps(dataclasses.asdict(pipeline), indent=2) + "\n")
    return p


def _json(p: Path) -> dict:
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def read_sentence_transformers(folder: str | Path) -> SentencePipeline | None:
    """The pipeline of a sentence-transformers folder (``modules.json`` and the files it names), or None when
    ``folder`` is a plain HF folder.  A module lmforge cannot reproduce (``Dense``, weighted mean...) is a
    CheckpointError: importing it without would give other vectors than sentence-transformers gives."""
    root = Path(folder)
    modules = _json(root / "modules.json")
    if not modules:
        return None
    pool, normalize = None, False
    for m in modules:
        kind = m.get("type", "")
        if kind not in _ST_TYPES:
            raise CheckpointError(f"{root}'s modules.json has a {kind} module, which lmforge cannot reproduce "
                                  f"(it reads {', '.join(t.rsplit('.', 1)[1] for t in _ST_TYPES)})")
        if kind.endswith("Pooling"):
            pool = _pooling_mode(_json(root / m.get("path", "") / "config.json"), root)
        normalize = normalize or kind.endswith("Normalize")
    config = _json(root / "sentence_bert_config.json")
    extra = _json(root / "config_sentence_transformers.json")
    return SentencePipeline(
        pool=pool or "cls", normalize=normalize, max_seq_length=config.get("max_seq_length"),
        lowercase=bool(config.get("do_lower_case", False)), prompts=dict(extra.get("prompts") or {}),
        default_prompt_name=extra.get("default_prompt_name") or None, source=str(root))


def _pooling_mode(config: dict, root: Path) -> str:
    modes = [ours for key, ours in _ST_MODES.items() if config.get(key)]
    others = [k for k, v in config.items() if k.startswith("pooling_mode") and v and k not in _ST_MODES]
    if others or len(modes) != 1 or config.get("include_prompt", True) is False:
        raise CheckpointError(f"{root}'s pooling ({', '.join(others + modes) or 'none'}) is not one lmforge "
                              f"reproduces: it reads exactly one of mean, cls or max, prompt included")
    return modes[0]


def write_sentence_transformers(pipeline: SentencePipeline, width: int, folder: str | Path) -> None:
    """The files that make an HF folder a sentence-transformers one (``SentenceTransformer(folder)``)."""
    root = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _ST_TYPES[0]},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST_TYPES[1]}]
    if pipeline.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST_TYPES[2]})
        (root / "2_Normalize").mkdir(exist_ok=True)
    (root / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": width, **{k: pipeline.pool == v for k, v in _ST_MODES.items()},
               "pooling_mode_mean_sqrt_len_tokens": False, "include_prompt": True}
    files = {"modules.json": modules, "1_Pooling/config.json": pooling,
             "sentence_bert_config.json": {"max_seq_length": pipeline.max_seq_length,
                                           "do_lower_case": pipeline.lowercase},
             "config_sentence_transformers.json": {"prompts": pipeline.prompts,
                                                   "default_prompt_name": pipeline.default_prompt_name,
                                                   "similarity_fn_name": "cosine"}}
    for name, data in files.items():
        atomic_write_text(root / name, json.dumps(data, indent=2) + "\n")


def lmforge_pipeline(body) -> SentencePipeline:
    """sentence-transformers' mean over a BERT/ELECTRA body's every position (``pool="mean+specials"``): what an
    lmforge model exported for sentence-transformers is read with."""
    return SentencePipeline(pool="mean", max_seq_length=int(body.config.max_position_embeddings))


# -- encoding ---------------------------------------------------------------------------------------
def torch_forward(body) -> Forward:
    """The body's top layer on torch, for :func:`encode`."""
    device = next(body.parameters()).device

    @torch.no_grad()
    def forward(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with body.evaluating():
            states = body.hidden_states(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
        return states[-1].float().cpu().numpy()

    return forward


def prompt_text(pipeline: SentencePipeline, prompt_name: str | None) -> str:
    """The text put before every text: the named prompt, else the pipeline's default one, else nothing."""
    name = prompt_name or pipeline.default_prompt_name
    if name is None:
        return ""
    if name not in pipeline.prompts:
        known = ", ".join(pipeline.prompts) or "none"
        raise LmforgeError(f"this model has no prompt '{name}' (its prompts: {known})")
    return pipeline.prompts[name]


def tokenize(body, pipeline: SentencePipeline, texts: Sequence[str], prompt: str = "") -> list[list[int]]:
    """Each text's ids as sentence-transformers reads it: stripped, prompted, lower-cased if asked, its first
    ``max_seq_length - 2`` tokens between ``[CLS]`` and ``[SEP]``."""
    tok = body.tokenizer
    if tok is None or tok.cls_id is None or tok.sep_id is None:
        raise LmforgeError(f"the {body.model_type} model has no tokenizer with [CLS] and [SEP] attached")
    limit = int(body.config.max_position_embeddings)
    if pipeline.max_seq_length is not None:
        limit = min(limit, int(pipeline.max_seq_length))
    texts = [prompt + t.strip() for t in texts]
    if pipeline.lowercase:
        texts = [t.lower() for t in texts]
    return [[tok.cls_id, *ids[: limit - 2], tok.sep_id] for ids in tok.encode_batch(texts)]


def padded(rows: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ids -> (B, T) int64 ids padded with ``pad`` and the (B, T) int64 mask (1 = a real token)."""
    T = max(len(r) for r in rows)
    batch = np.full((len(rows), T), pad, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for b, r in enumerate(rows):
        batch[b, : len(r)] = r
        mask[b, : len(r)] = 1
    return batch, mask


def probe_batch(body, pipeline: SentencePipeline, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of ``texts`` as :func:`encode` builds one: what choosing a backend times."""
    pad = body.tokenizer.pad_id if body.tokenizer.pad_id is not None else 0
    return padded(tokenize(body, pipeline, texts), pad)


def pool_states(states: np.ndarray, mask: np.ndarray, pool: str) -> np.ndarray:
    """(B, T, C) states and (B, T) mask -> (B, C), as sentence-transformers' Pooling computes it."""
    if pool == "cls":
        return states[:, 0]
    m = mask[:, :, None].astype(states.dtype)
    if pool == "max":
        return np.where(m > 0, states, np.float32(-1e9)).max(axis=1)
    return (states * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def encode(body, texts: Sequence[str], pipeline: SentencePipeline, *, normalize: bool | None = None,
           batch_size: int = 32, prompt_name: str | None = None, forward: Forward | None = None,
           update: Callable[[int], None] = lambda n: None) -> np.ndarray:
    """One float32 vector per text through ``pipeline`` (see the module docstring).

    Args:
        body: a BERT or ELECTRA model with its tokenizer attached.
        texts: the texts (checked by the caller).
        pipeline: the pooling, normalisation, length and prompts to apply.
        normalize: overrides the pipeline's normalisation when not None.
        batch_size: texts per forward pass (shortest first, so a batch holds texts of similar length).
        prompt_name: the prompt to put before each text (None: the pipeline's default, if any).
        forward: the forward pass (:data:`Forward`); None = the body on torch.
        update: called with the number of texts done after each batch.
    Returns:
        (len(texts), C) float32 array, row i for text i.
    """
    ids = tokenize(body, pipeline, texts, prompt_text(pipeline, prompt_name))
    forward = forward or torch_forward(body)
    pad = body.tokenizer.pad_id if body.tokenizer.pad_id is not None else 0
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = np.zeros((len(ids), body.hidden_size), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch, mask = padded([ids[i] for i in chunk], pad)
        out[chunk] = pool_states(forward(batch, mask), mask, pipeline.pool)
        update(len(chunk))
    if pipeline.normalize if normalize is None else normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.where(norms > 0, norms, 1).astype(np.float32)
    return out
