"""Model cards: a ``README.md`` in the HF format for every model folder, transfer run and HF export.

The card is written from what the folder and its inputs record, never by hand: ``config.json``,
the tokenizer, ``train_config.json`` / ``training_summary.json``, ``metrics.jsonl`` (the training
curves), a run's ``metrics.json``, and the token shards the model was pretrained on (their sources
and a SHA-256 of the token arrays).  The YAML front matter (``library_name``, ``language``, ``tags``,
``license``, ``pipeline_tag``) is written one ``key: value`` a line with JSON values, which YAML reads
as they are; the ``lmforge`` key keeps the corpus facts so that cards of later folders (a run on
this model, its HF export) can repeat them.

Hooks: the end of ``lmforge pretrain`` (:func:`write_model_card` with the shards), the save of a
transfer run and ``lmforge export-hf`` call :func:`update_card`, which never lets a card cost the
work it describes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import safe_open

from ..config import load_json
from ..data.tasks import KINDS
from ..text import is_cjk
from ..tokenization import Tokenizer
from .card_diagnostics import diagnostics_section
from .files import atomic_write_text

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"


@dataclasses.dataclass(frozen=True)
class FamilyCard:
    """What a model card says of one family (each family's ``card``, :class:`lmforge.families.Family`).

    Attributes:
        label: how the card names the family (the family's ``label``).
        pipeline: what the family is for, as HF's pipeline tags name it.
        uses: the intended use, completing "Research and teaching: ...".
        limitation: a sentence the Limitations section adds for this family (empty: none).
        hf_architecture: the ``transformers`` class its HF export loads with (None: ``AutoModel``).
    """

    label: str
    pipeline: str
    uses: str
    limitation: str = ""
    hf_architecture: str | None = None


def _no_cards(family: str) -> FamilyCard | None:
    return None


# family name -> its card facts; cards sit below the family registry, which hands its lookup in when it loads
# (use_family_cards); until then a card names the model_type alone
_family_card: Callable[[str], FamilyCard | None] = _no_cards


def use_family_cards(lookup: Callable[[str], FamilyCard | None]) -> None:
    """Read each family's card facts from ``lookup`` (called once by :mod:`lmforge.families`)."""
    global _family_card
    _family_card = lookup


SHARD_ARRAYS = ("tokens", "sentences", "documents")


# -- facts ------------------------------------------------------------------------------------------------
def _json_or_none(path: Path) -> Any:
    try:
        return load_json(path) if path.is_file() else None
    except Exception:  # a card describes what it can read
        return None


def read_card_meta(folder: str | Path) -> dict[str, Any]:
    """The front matter of ``folder/README.md`` as a dict (empty when there is no lmforge card)."""
    p = Path(folder) / CARD_FILE
    if not p.is_file():
        return {}
    lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    meta: dict[str, Any] = {}
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, sep, value = line.partition(": ")
        if not sep:
            continue
        try:
            meta[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            meta[key.strip()] = value.strip()
    return meta


def shard_facts(shards_dir: str | Path) -> dict[str, Any]:
    """What a model card says about its corpus: sources, counts, tokenizer hash and a hash of the token arrays.

    The hash is the SHA-256 of the shards' token, sentence and document arrays of both splits, in a
    fixed order: the same corpus prepared with the same tokenizer and split gives the same hash on
    every machine (the paths of the sources do not enter it).
    """
    p = Path(shards_dir)
    meta = load_json(p / "meta.json")
    h = hashlib.sha256()
    for split in ("train", "val"):
        for name in SHARD_ARRAYS:
            f = p / f"{split}.{name}.bin"
            h.update(f"{split}.{name}:".encode())
            if f.is_file():
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
    return {
        "sha256": h.hexdigest(),
        "sources": [{"name": Path(s["path"]).name, "bytes": s.get("bytes")} for s in meta.get("sources", [])],
        "splits": meta.get("splits", {}),
        "tokenizer_hash": meta.get("tokenizer_hash"),
        "val_fraction": meta.get("val_fraction"),
    }


def _parameters(folder: Path) -> int | None:
    f = folder / "model.safetensors"
    if not f.is_file():
        return None
    n = 0
    with safe_open(str(f), framework="np") as st:
        for k in st.keys():
            n += math.prod(st.get_slice(k).get_shape())
    return n


def _tokenizer_facts(folder: Path) -> dict[str, Any] | None:
    if not (folder / "tokenizer.json").is_file():
        return None
    tok = Tokenizer.load(folder)
    return {"kind": tok.kind, "vocab_size": tok.vocab_size, "hash": tok.hash, "language": _language(tok)}


def _language(tok) -> str:
    """``zh`` when a fifth of the vocabulary is CJK, else ``en`` (lmforge's two corpus languages)."""
    vocab = list(tok.get_vocab())
    cjk = sum(1 for t in vocab if any(is_cjk(ch) for ch in t))
    return "zh" if vocab and cjk / len(vocab) > 0.2 else "en"


def _events(folder: Path) -> list[dict]:
    f = folder / "metrics.jsonl"
    if not f.is_file():
        return []
    out = []
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(ev, dict) and "step" in ev:
            out.append(ev)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "-"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.4e}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, dict)):
        return f"`{json.dumps(v, ensure_ascii=False)}`"
    return str(v).replace("|", "\\|")


def _table(rows: list[tuple[str, Any]], head: tuple[str, str] = ("field", "value")) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    return "\n".join(lines)


def _front_matter(meta: dict[str, Any]) -> str:
    return "---\n" + "".join(f"{k}: {json.dumps(v, ensure_ascii=False)}\n" for k, v in meta.items()) + "---\n"


def _corpus_section(corpus: dict[str, Any] | None) -> str:
    if not corpus:
        return (
            "## Corpus\n\nlmforge did not see the shards this model was trained on when it wrote this card "
            "(the card was written from the folder alone).\n"
        )
    rows: list[tuple[str, Any]] = [("token shards SHA-256", f"`{corpus['sha256']}`")]
    for s in corpus.get("sources", []):
        rows.append((f"source `{s['name']}`", f"{_fmt(s.get('bytes'))} bytes"))
    for split, c in (corpus.get("splits") or {}).items():
        rows.append(
            (
                f"{split} split",
                f"{_fmt(c.get('tokens'))} tokens, {_fmt(c.get('sentences'))} sentences, "
                f"{_fmt(c.get('documents'))} documents",
            )
        )
    rows.append(("made by tokenizer", f"`{corpus.get('tokenizer_hash')}`"))
    return "## Corpus\n\n" + _table(rows) + "\n"


def _curve_section(folder: Path, events: list[dict]) -> tuple[str, dict[str, Any]]:
    """Training budget and curves from metrics.jsonl; also returns the final validation metrics."""
    train = [e for e in events if e.get("split") == "train"]
    val = [e for e in events if e.get("split") == "val"]
    final: dict[str, Any] = {}
    if val:
        final = {"loss": val[-1].get("loss"), **(val[-1].get("metrics") or {})}
    text = ""
    if train or val:
        last = (train or val)[-1]
        rows = [
            ("optimizer steps", max(e["step"] for e in events)),
            ("tokens seen", last.get("tokens")),
            ("training seconds", round(float(last["elapsed"]), 1) if "elapsed" in last else None),
        ]
        if train:
            rows.append(("last training loss", train[-1].get("loss")))
        text += "### Curves\n\n" + _table(rows) + "\n\n"
        if val:
            pick = val if len(val) <= 10 else [val[round(i * (len(val) - 1) / 9)] for i in range(10)]
            keys = sorted({k for e in pick for k in (e.get("metrics") or {})})
            lines = ["| step | val loss | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
            for e in pick:
                m = e.get("metrics") or {}
                lines.append(
                    f"| {e['step']} | {_fmt(e.get('loss'))} | " + " | ".join(_fmt(m.get(k)) for k in keys) + " |"
                )
            text += "\n".join(lines) + "\n\n"
    if (folder / "training_curves.png").is_file():
        text += "![training curves](training_curves.png)\n\n"
    return text, final


# -- the three kinds of card --------------------------------------------------------------------------------
def display_name(folder: Path) -> str:
    """The folder's name as the user gave it: a card written in a staging folder (``.NAME.tmp-XXXX``,
    renamed to NAME when complete) is titled NAME."""
    m = re.fullmatch(r"\.(.+)\.tmp-[^.]+", folder.name)
    return m.group(1) if m else folder.name


_BUDGET_KEYS = ("max_steps", "max_time", "batch_size", "grad_accum", "lr", "schedule", "warmup_steps", "weight_decay",
                "precision", "seed")


def _model_meta(family: str, tok: dict | None, params: int | None, corpus: dict | None, hf: dict | None) -> dict:
    """The front matter of a model card (of an HF export when ``hf`` is given)."""
    card = _family_card(family)
    meta: dict[str, Any] = {
        "library_name": "lmforge",
        "language": [tok["language"]] if tok else ["en"],
        "license": "other",
        "tags": ["lmforge", family, "pretrained-from-scratch"],
        "pipeline_tag": card.pipeline if card else "feature-extraction",
        "lmforge": {"kind": "model", "family": family, "parameters": params, "corpus": corpus},
    }
    if hf is not None:  # an HF export of this model
        meta["library_name"] = "transformers"
        meta["tags"] = ["lmforge", family, hf["model_type"]]
        meta["lmforge"]["kind"] = "export"
    return meta


def _model_intro(folder: Path, family: str, params: int | None, hf: dict | None) -> list[str]:
    """The title and the opening paragraphs of a model card."""
    card = _family_card(family)
    name = card.label if card else family
    title = f"# {display_name(folder)}: a {name} model pretrained with lmforge"
    if hf is not None:
        title = f"# {display_name(folder)}: an lmforge {name} model in HF transformers format"
    intro = f"{name} with {_fmt(params)} parameters" if params else name
    intro += f", pretrained from scratch by `lmforge pretrain {family}`." if card else "."
    parts = [title + "\n", intro + " This card was written by lmforge from the folder's files.\n"]
    if hf is not None:
        parts.append(
            f"Written by `lmforge export-hf` from `{hf['source']}`: load it with "
            f"`transformers.{(card and card.hf_architecture) or 'AutoModel'}.from_pretrained(...)`; "
            "`lmforge import-hf` reads it back.\n"
        )
    return parts


def _training_sections(folder: Path) -> list[str]:
    """The Training section (the budget, the run's summary, the curves) and the Evaluation section, when known."""
    budget = _json_or_none(folder / "train_config.json")
    summary = _json_or_none(folder / "training_summary.json")
    curves, final = _curve_section(folder, _events(folder))
    parts = []
    budget_rows = [(k, budget.get(k)) for k in _BUDGET_KEYS if k in budget] if budget else []
    if summary:
        budget_rows += [(k, v) for k, v in summary.items() if not isinstance(v, (dict, list))]
    if budget_rows or curves:
        parts.append("## Training\n\n" + (_table(budget_rows) + "\n\n" if budget_rows else "") + curves)
    if final:
        parts.append(
            "## Evaluation\n\nValidation split of the corpus at the end of pretraining:\n\n"
            + _table(list(final.items()), ("metric", "value"))
            + "\n"
        )
        if diagnostics := diagnostics_section(final):
            parts.append(diagnostics)
    return parts


def _use_and_limits(family: str, params: int | None, corpus: dict | None) -> list[str]:
    """The Intended use and Limitations sections of a model card."""
    card = _family_card(family)
    uses = (
        "## Intended use\n\n" + f"Research and teaching: {card.uses if card else 'feature extraction'}; "
        "comparing the model generations on equal terms.\n"
    )
    tokens = (corpus or {}).get("splits", {}).get("train", {}).get("tokens")
    lim = [
        f"A small model ({_fmt(params)} parameters)" if params else "A small model",
        f" trained on {_fmt(tokens)} tokens" if tokens else "",
        " of one corpus: it knows only that text, its topics, style and biases, and makes many mistakes. "
        "It is not for decisions about people or for any use where a wrong answer does harm.",
        card.limitation if card else "",
        " The weights carry the terms of the corpus they were trained on, which lmforge does not know: "
        "hence `license: other`.",
    ]
    return [uses, "## Limitations\n\n" + "".join(lim) + "\n"]


def _model_card(folder: Path, corpus: dict[str, Any] | None, hf: dict[str, Any] | None = None) -> str:
    config = _json_or_none(folder / "config.json") or {}
    family = config.get("model_type", "?")
    params = _parameters(folder)
    tok = _tokenizer_facts(folder)
    parts = [_front_matter(_model_meta(family, tok, params, corpus, hf)), *_model_intro(folder, family, params, hf)]
    parts.append(_corpus_section(corpus))
    if tok:
        parts.append(
            "## Tokenizer\n\n"
            + _table([("kind", tok["kind"]), ("vocabulary", tok["vocab_size"]), ("hash", f"`{tok['hash']}`")])
            + "\n"
        )
    parts.append("## Config\n\n" + _table([(k, v) for k, v in config.items() if k != "model_type"]) + "\n")
    parts += _training_sections(folder)
    parts += _use_and_limits(family, params, corpus)
    return "\n".join(parts)


def _run_sections(cfg: dict, metrics: dict, task: str) -> list[str]:
    """The Config, Training, Evaluation, Intended use and Limitations sections of a run's card."""
    parts = []
    parts.append("## Config\n\n" + _table([(k, v) for k, v in cfg.items() if v is not None]) + "\n")
    train_keys = ("n_train", "epochs", "lr", "train_loss", "train_seconds", "from_scratch", "freeze_layers")
    parts.append("## Training\n\n" + _table([(k, metrics[k]) for k in train_keys if k in metrics]) + "\n")
    skip = set(train_keys) | {"task", "mode", "family"}
    results = [(k, v) for k, v in metrics.items() if k not in skip]
    parts.append(
        "## Evaluation\n\nOn the test file given to `lmforge finetune`:\n\n"
        + _table(results, ("metric", "value"))
        + "\n"
    )
    parts.append(
        "## Intended use\n\n" + f"Predicting the {task} task it was trained on (`lmforge predict`, "
        "`lmforge serve`), and measuring how well the pretrained body transfers.\n"
    )
    parts.append(
        "## Limitations\n\n" + f"Trained on {_fmt(metrics.get('n_train'))} labelled examples: it knows "
        "only their labels, domain and biases, and inherits those of the base model's corpus. It needs "
        "the base model folder to predict, and is not for decisions about people.\n"
    )
    return parts


def _run_card(folder: Path) -> str:
    data = _json_or_none(folder / "config.json") or {}
    cfg = data.get("transfer", {})
    metrics = _json_or_none(folder / "metrics.json") or {}
    family = data.get("family", "?")
    task, mode = cfg.get("task", "?"), cfg.get("mode", "?")
    base = Path(data["model_dir"]) if data.get("model_dir") else None
    base_meta = read_card_meta(base) if base is not None else {}
    corpus = (base_meta.get("lmforge") or {}).get("corpus")
    meta = {
        "library_name": "lmforge",
        "language": base_meta.get("language", ["en"]),
        "license": "other",
        "tags": ["lmforge", family, task, mode],
        "pipeline_tag": KINDS[task].pipeline_tag if task in KINDS else "text-classification",
        "lmforge": {"kind": "run", "family": family, "task": task, "mode": mode, "base_model": str(base),
                    "corpus": corpus},
    }
    body_card = _family_card(family)
    body_name = body_card.label if body_card else family
    parts = [_front_matter(meta), f"# {display_name(folder)}: {task} with a {body_name} body ({mode})\n"]
    parts.append(
        f"A transfer run written by `lmforge finetune --task {task} --mode {mode}`, on the model folder "
        f"`{base}`. This card was written by lmforge from the run's files.\n"
    )
    labels = data.get("labels") or []
    rows: list[tuple[str, Any]] = [
        ("task", task),
        ("mode", mode),
        ("base model", str(base)),
        ("base weights SHA-256", data.get("weights_sha256")),
    ]
    if labels:
        rows.append(("labels", ", ".join(map(str, labels))))
    parts.append("## Base model and corpus\n\n" + _table(rows) + "\n\n" + _corpus_section(corpus).split("\n", 2)[2])
    parts += _run_sections(cfg, metrics, task)
    return "\n".join(parts)


def write_model_card(folder: str | Path, shards: str | Path | None = None) -> Path:
    """Write ``folder/README.md`` for a pretrained model folder.

    Args:
        folder: the model folder (``config.json``, ``model.safetensors``, tokenizer, training files).
        shards: the token shards it was pretrained on (their facts go into the card); without them the
            corpus facts of an earlier card of the folder are kept.
    """
    p = Path(folder)
    corpus = shard_facts(shards) if shards is not None else (read_card_meta(p).get("lmforge") or {}).get("corpus")
    out = p / CARD_FILE
    atomic_write_text(out, _model_card(p, corpus))
    return out


def write_run_card(folder: str | Path) -> Path:
    """Write ``folder/README.md`` for a transfer run folder (after ``TransferRun.save``)."""
    out = Path(folder) / CARD_FILE
    atomic_write_text(out, _run_card(Path(folder)))
    return out


def write_export_card(folder: str | Path, source: str | Path) -> Path:
    """Write ``folder/README.md`` for an HF export of the lmforge model folder ``source``."""
    p, src = Path(folder), Path(source)
    hf_type = (_json_or_none(p / "config.json") or {}).get("model_type", "?")
    corpus = (read_card_meta(src).get("lmforge") or {}).get("corpus")
    text = _model_card(src, corpus, hf={"model_type": hf_type, "source": str(src)})
    out = p / CARD_FILE
    atomic_write_text(out, text)
    return out


def update_card(folder: str | Path, shards: str | Path | None = None, source: str | Path | None = None) -> None:
    """The hook: write the card a folder of this kind gets, logging (not raising) when that fails.

    A model folder (``shards``: its corpus), a run folder (``config.json`` with ``transfer``), or an HF
    export (``source``: the lmforge model folder it was exported from).
    """
    try:
        p = Path(folder)
        if source is not None:
            out = write_export_card(p, source)
        elif "transfer" in (_json_or_none(p / "config.json") or {}):
            out = write_run_card(p)
        else:
            out = write_model_card(p, shards)
        logger.debug("wrote the model card %s", out)
    except Exception as e:  # a card must never cost the work it describes
        logger.warning("could not write the model card in %s: %s", folder, e)


__all__ = ["FamilyCard", "use_family_cards", "write_model_card", "write_run_card", "write_export_card", "update_card",
           "read_card_meta", "shard_facts", "display_name"]
