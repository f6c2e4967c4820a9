"""Metrics of the downstream tasks, written out so that each can be read and checked.

- classification: accuracy and macro-F1 (unweighted mean of per-class F1 over the classes that
  occur in the gold labels or the predictions);
- token classification: token accuracy and entity-level precision / recall / F1 over BIO spans,
  matched exactly (type, start, end) as seqeval's default (conlleval) mode does: an ``I-X`` that
  does not continue an ``X`` entity starts a new one;
- extractive QA: exact match and token F1 after SQuAD normalisation (lower case, drop punctuation,
  the articles a/an/the and extra white space), taking the best score over the gold answers.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence


def accuracy(gold: Sequence, pred: Sequence) -> float:
    """Fraction of positions where ``pred`` equals ``gold`` (0.0 for empty input)."""
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} items but pred has {len(pred)}")
    if not gold:
        return 0.0
    return sum(g == p for g, p in zip(gold, pred)) / len(gold)


def _f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def per_class_f1(gold: Sequence, pred: Sequence) -> dict:
    """F1 of each class that appears in ``gold`` or ``pred``: ``{label: f1}``."""
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} items but pred has {len(pred)}")
    out = {}
    for c in sorted(set(gold) | set(pred), key=str):
        tp = sum(g == c and p == c for g, p in zip(gold, pred))
        fp = sum(g != c and p == c for g, p in zip(gold, pred))
        fn = sum(g == c and p != c for g, p in zip(gold, pred))
        out[c] = _f1(tp, fp, fn)[2]
    return out


def macro_f1(gold: Sequence, pred: Sequence) -> float:
    """Unweighted mean of the per-class F1 scores (classes seen in gold or pred)."""
    scores = per_class_f1(gold, pred)
    return sum(scores.values()) / len(scores) if scores else 0.0


def classification_metrics(gold: Sequence, pred: Sequence) -> dict[str, float]:
    """``{"accuracy", "macro_f1"}`` of label sequences."""
    return {"accuracy": accuracy(gold, pred), "macro_f1": macro_f1(gold, pred)}


# -- token classification --------------------------------------------------------------------------
def _split_tag(tag: str) -> tuple[str, str]:
    """``"B-PER"`` -> ``("B", "PER")``; ``"O"`` -> ``("O", "")``; a bare type ``"PER"`` counts as ``I-PER``."""
    if tag in ("O", "", None):
        return "O", ""
    if len(tag) > 2 and tag[1] in "-_" and tag[0] in "BIOES":
        return tag[0], tag[2:]
    return "I", tag


def bio_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entity spans ``(type, start, end_exclusive)`` of one BIO-tagged sequence.

    An entity starts at ``B-X``, or at ``I-X`` when the previous tag is not ``B-X``/``I-X`` (an
    ill-formed start, counted as an entity as conlleval and seqeval do); it ends before the first
    tag that does not continue it.  ``E-``/``S-`` (BIOES) are read as ``I-`` / ``B-`` closing the span.
    """
    spans = []
    cur_type, cur_start = None, 0
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, typ = _split_tag(tag)
        starts = prefix in ("B", "S") or (prefix in ("I", "E") and typ != cur_type)
        if cur_type is not None and (prefix == "O" or starts):
            spans.append((cur_type, cur_start, i))
            cur_type = None
        if prefix != "O" and (starts or cur_type is None):
            cur_type, cur_start = typ, i
        if prefix in ("E", "S") and cur_type is not None:
            spans.append((cur_type, cur_start, i + 1))
            cur_type = None
    return spans


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level micro precision / recall / F1 and token accuracy over sentences of tags.

    Args:
        gold, pred: one list of tags per sentence, of equal lengths.
    Returns:
        ``{"token_accuracy", "entity_precision", "entity_recall", "entity_f1"}`` plus
        ``"f1_<TYPE>"`` for each entity type in the gold or predicted tags.
    """
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} sentences but pred has {len(pred)}")
    tp = fp = fn = 0
    by_type: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    flat_g, flat_p = [], []
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: gold has {len(g)} tags but pred has {len(p)}")
        flat_g.extend(g)
        flat_p.extend(p)
        gs, ps = set(bio_spans(g)), set(bio_spans(p))
        tp += len(gs & ps)
        fp += len(ps - gs)
        fn += len(gs - ps)
        for s in gs & ps:
            by_type[s[0]][0] += 1
        for s in ps - gs:
            by_type[s[0]][1] += 1
        for s in gs - ps:
            by_type[s[0]][2] += 1
    precision, recall, f1 = _f1(tp, fp, fn)
    out = {
        "token_accuracy": accuracy(flat_g, flat_p),
        "entity_precision": precision,
        "entity_recall": recall,
        "entity_f1": f1,
    }
    for typ in sorted(by_type):
        out[f"f1_{typ}"] = _f1(*by_type[typ])[2]
    return out


# -- extractive QA ---------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, remove punctuation, articles and extra white space."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _answer_tokens(s: str) -> list[str]:
    norm = normalize_answer(s)
    # Text without spaces (Chinese) is compared character by character, as CMRC does.
    if norm and " " not in norm and any(ord(ch) > 0x2E80 for ch in norm):
        return list(norm)
    return norm.split()


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def token_f1(pred: str, gold: str) -> float:
    """Bag-of-tokens F1 of two answers after normalisation (1.0 when both are empty)."""
    p, g = _answer_tokens(pred), _answer_tokens(gold)
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def qa_metrics(preds: Sequence[str], golds: Sequence[Sequence[str]]) -> dict[str, float]:
    """Mean exact match and F1 (best over each question's gold answers), as fractions in [0, 1]."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions for {len(golds)} questions")
    if not preds:
        return {"exact_match": 0.0, "f1": 0.0}
    em = f1 = 0.0
    for p, gs in zip(preds, golds):
        gs = list(gs) or [""]
        em += max(exact_match(p, g) for g in gs)
        f1 += max(token_f1(p, g) for g in gs)
    return {"exact_match": em / len(preds), "f1": f1 / len(preds)}
