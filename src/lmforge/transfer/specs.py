"""One :class:`TaskSpec` per task kind: how its examples become inputs, targets, a loss, predictions and scores.

Everything that differs between ``classify``, ``pair``, ``tokens``, ``qa`` and ``choice`` lives here;
the run, the fit loop and the features cache are the same for all of them.  Adding a task kind means
adding one spec to :data:`SPECS` (and its data side, a :class:`~lmforge.data.tasks.TaskKind`, to
:data:`lmforge.data.tasks.KINDS`).

A spec works on *encodings* (:class:`~lmforge.transfer.encoding.Encoding`): one per example, except
that a QA context too long for one input is read as several windows and a multiple-choice question
as one input per choice.  Each encoding's ``example`` says which example it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..data.task_data import ChoiceExample, QAExample, TaskData, TextExample, TokensExample, is_bio
from ..errors import DataError
from . import metrics as M
from .encoding import Encoding

logger = logging.getLogger(__name__)


class TaskSpec:
    """The task-specific part of a transfer run.

    Attributes:
        name: the task kind.
        sentence: each input is read as one vector (a sentence, a pair, a context with one choice).
        sklearn: in features mode the default head can be fitted by scikit-learn (each row an
            independent example with one class).
        num_outputs_fixed: outputs per row when they do not depend on the labels (qa: 2, choice: 1).
        answer_key: the key of a prediction record that holds the prediction itself (a class, the tags,
            the answer text, the chosen index).
        shown_as: how ``lmforge predict`` prints a prediction (``class``, ``tags``, ``answer``, ``choice``).
        classes: every example has one of a set of classes, which a sample should keep in proportion.
        stratify: a held-out split keeps the answers in proportion (classes, or the index of the right choice).
        pair_rows: an input is two texts read as two rows (pair, choice) when the head reads mean vectors.
        file_suffix: the suffix of the file format the task's data is written in.
        single_text: an example is one text (a sentence read-out of frozen features defaults to the mean).
        text_pair: an example is two texts (they can be read in both orders).
        bilstm_head: a BiLSTM over the token vectors can be its head.
        label_outputs: each output names one of the run's labels (a class or a tag), which an HF export writes as
            ``id2label``.
        hf_head: the kind of HF task class a run exports to (``lmforge export-hf``: ``BertFor`` + ``hf_head``...);
            None = no HF class takes the run.  The pipeline that reads it is the task's
            :attr:`lmforge.data.tasks.TaskKind.pipeline_tag`.
    """

    name = ""
    sentence = True
    sklearn = False
    num_outputs_fixed: int | None = None
    answer_key = "label"
    shown_as = "class"
    classes = False
    stratify = False
    pair_rows = False
    file_suffix = "jsonl"
    single_text = False
    text_pair = False
    bilstm_head = True
    label_outputs = False
    hf_head: str | None = None

    def num_outputs(self, labels: Sequence[str]) -> int:
        return self.num_outputs_fixed or len(labels)

    def main_metric(self, labels: Sequence[str]) -> str:
        raise NotImplementedError

    def encode(self, fmt, example) -> list[Encoding]:
        raise NotImplementedError

    def units(self, encs: Sequence[Encoding]) -> list[list[int]]:
        """The encodings that train together as one example (default: each alone)."""
        return [[i] for i in range(len(encs))]

    def prepare(self, data: TaskData, encs: Sequence[Encoding], fmt, label_index: dict[str, int]) -> list:
        """Every encoding's training target (checked once, before training)."""
        raise NotImplementedError

    def batch(self, targets: list, units: Sequence[Sequence[int]]) -> torch.Tensor:
        """The target tensor of a batch of units (their encodings in order)."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, y: torch.Tensor, encs: Sequence[Encoding], units) -> torch.Tensor:
        raise NotImplementedError

    def predict(self, data: TaskData, encs: list[Encoding], logits: list[torch.Tensor], labels, cfg) -> list[dict]:
        raise NotImplementedError

    def evaluate(self, data: TaskData, preds: list[dict], labels) -> tuple[dict[str, float], list[dict]]:
        raise NotImplementedError


class ClassifySpec(TaskSpec):
    """``classify`` (one text) and ``pair`` (two texts): one class per example."""

    sklearn = True
    classes = True
    stratify = True
    label_outputs = True
    hf_head = "SequenceClassification"

    def __init__(self, name: str, pair_rows: bool = False):
        self.name = name
        self.pair_rows = self.text_pair = pair_rows
        self.single_text = not pair_rows

    def main_metric(self, labels) -> str:
        return "accuracy"

    def encode(self, fmt, ex: TextExample) -> list[Encoding]:
        return [fmt.encode_text(ex.text, ex.text_pair)]

    def prepare(self, data, encs, fmt, label_index) -> list:
        return [label_index[data.examples[e.example].label] for e in encs]

    def batch(self, targets, units) -> torch.Tensor:
        return torch.tensor([targets[u[0]] for u in units], dtype=torch.long)

    def loss(self, logits, y, encs, units) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def predict(self, data, encs, logits, labels, cfg) -> list[dict]:
        preds = []
        for lg in logits:
            probs = torch.softmax(lg.double(), -1)
            preds.append(
                {
                    "label": labels[int(probs.argmax())],
                    "probs": {lab: round(float(p), 5) for lab, p in zip(labels, probs)},
                }
            )
        return preds

    def evaluate(self, data, preds, labels):
        gold = [ex.label for ex in data.examples]
        metrics = M.classification_metrics(gold, [p["label"] for p in preds])
        records = []
        for ex, p in zip(data.examples, preds):
            rec = {"text": ex.text}
            if ex.text_pair is not None:
                rec["text_pair"] = ex.text_pair
            records.append({**rec, "label": ex.label, "pred": p["label"], "probs": p["probs"]})
        return metrics, records


class TokensSpec(TaskSpec):
    """``tokens``: one tag per word (read at the word's first sub-token)."""

    name = "tokens"
    sentence = False
    sklearn = True
    answer_key = "tags"
    shown_as = "tags"
    file_suffix = "conll"
    label_outputs = True
    hf_head = "TokenClassification"

    def main_metric(self, labels) -> str:
        return "entity_f1" if is_bio(labels) else "token_accuracy"

    def encode(self, fmt, ex: TokensExample) -> list[Encoding]:
        return [fmt.encode_words(ex.words)]

    def prepare(self, data, encs, fmt, label_index) -> list:
        out = []
        for e in encs:
            tags = data.examples[e.example].tags
            y = [-100] * len(e.rows)
            for w, r in enumerate(e.word_rows):
                if r >= 0 and y[r] == -100:  # a token shared by two words is labelled by the first
                    y[r] = label_index[tags[w]]
            out.append(y)
        return out

    def batch(self, targets, units) -> torch.Tensor:
        rows = [targets[u[0]] for u in units]
        n = max(1, max(len(r) for r in rows))
        y = torch.full((len(rows), n), -100, dtype=torch.long)
        for b, r in enumerate(rows):
            y[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        return y

    def loss(self, logits, y, encs, units) -> torch.Tensor:
        if bool((y == -100).all()):
            return logits.sum() * 0.0
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)

    def predict(self, data, encs, logits, labels, cfg) -> list[dict]:
        preds = []
        for ex, e, lg in zip(data.examples, encs, logits):
            row_tags = [labels[int(i)] for i in lg.argmax(-1)] if lg.numel() else []
            tags = [row_tags[r] if 0 <= r < len(row_tags) else "O" for r in e.word_rows]
            preds.append({"words": ex.words, "tags": tags})
        return preds

    def evaluate(self, data, preds, labels):
        gold_tags, pred_tags = [ex.tags for ex in data.examples], [p["tags"] for p in preds]
        if is_bio(labels):
            metrics = M.entity_metrics(gold_tags, pred_tags)
        else:  # plain tagging (POS): no entities to match
            flat_g = [t for ts in gold_tags for t in ts]
            flat_p = [t for ts in pred_tags for t in ts]
            metrics = {"token_accuracy": M.accuracy(flat_g, flat_p), "macro_f1": M.macro_f1(flat_g, flat_p)}
        records = [{"words": ex.words, "tags": ex.tags, "pred": p["tags"]} for ex, p in zip(data.examples, preds)]
        return metrics, records


def context_mask(encs: Sequence[Encoding], n: int) -> torch.Tensor:
    """(B, n) True at the positions that hold context tokens (where an answer may start or end)."""
    m = torch.zeros(len(encs), n, dtype=torch.bool)
    for b, e in enumerate(encs):
        for p, off in enumerate(e.offsets):
            if off is not None and p < n:
                m[b, p] = True
    return m


def best_span(start: torch.Tensor, end: torch.Tensor, ctx: torch.Tensor, max_len: int) -> tuple[int, int, float] | None:
    """(start, end, score) of the highest start+end score over context spans of at most ``max_len`` tokens."""
    if not bool(ctx.any()):
        return None
    s = start.masked_fill(~ctx, -1e9)
    e = end.masked_fill(~ctx, -1e9)
    scores = s[:, None] + e[None, :]  # (n, n)
    n = scores.shape[0]
    i = torch.arange(n)
    ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_len)
    scores = scores.masked_fill(~ok, -1e18)
    flat = int(scores.argmax())
    return flat // n, flat % n, float(scores.flatten()[flat])


class QASpec(TaskSpec):
    """``qa``: the answer span of a question in its context (SQuAD), over a long context's windows."""

    name = "qa"
    sentence = False
    answer_key = "answer"
    shown_as = "answer"
    bilstm_head = False
    num_outputs_fixed = 2
    hf_head = "QuestionAnswering"

    def main_metric(self, labels) -> str:
        return "f1"

    def encode(self, fmt, ex: QAExample) -> list[Encoding]:
        return fmt.encode_qa(ex.question, ex.context)

    def prepare(self, data, encs, fmt, label_index) -> list:
        """Per window ``(start, end)``: a window holding the (first) answer points at it; the other
        windows of that question point at position 0 ("not in this window"), so scores compare across
        windows; a question whose answer no window holds wholly is skipped (-100) in all its windows."""
        y = [(-100, -100)] * len(encs)
        found: set[int] = set()
        for w, e in enumerate(encs):
            for text, start in data.examples[e.example].answers[:1]:
                span = fmt.qa_target(e, start, text)
                if span is not None:
                    y[w] = tuple(span)
                    found.add(e.example)
        for w, e in enumerate(encs):
            if e.example in found and y[w][0] < 0:
                y[w] = (0, 0)
        n_lost = len({e.example for e in encs} - found)
        if len(encs) > len(data):
            logger.info("qa: %d questions read as %d context windows", len(data), len(encs))
        if n_lost and n_lost == len(data):
            raise DataError(
                f"qa: none of the {len(data)} training answers lies inside an input of --max-len "
                f"{fmt.max_len}; raise --max-len or leave --doc-stride unset (a sliding window)"
            )
        if n_lost:
            logger.warning(
                "qa: %d of %d training answers lie in no window (cut at --max-len %d, or wider than a window) "
                "and are skipped",
                n_lost,
                len(data),
                fmt.max_len,
            )
        return y

    def batch(self, targets, units) -> torch.Tensor:
        return torch.tensor([targets[u[0]] for u in units], dtype=torch.long).reshape(-1, 2)

    def loss(self, logits, y, encs, units) -> torch.Tensor:
        allowed = context_mask(encs, logits.shape[1])
        allowed[:, 0] = True  # position 0: "the answer is not in this window"
        scores = logits.masked_fill(~allowed[..., None], -1e4)  # (B, n, 2)
        keep = y[:, 0] >= 0
        if not bool(keep.any()):
            return logits.sum() * 0.0
        return 0.5 * (F.cross_entropy(scores[keep, :, 0], y[keep, 0]) + F.cross_entropy(scores[keep, :, 1], y[keep, 1]))

    def predict(self, data, encs, logits, labels, cfg) -> list[dict]:
        """Each question's answer: the best-scoring span over all of its windows."""
        best: list[tuple[float, str] | None] = [None] * len(data)
        for e, lg in zip(encs, logits):
            span = best_span(lg[:, 0], lg[:, 1], context_mask([e], lg.shape[0])[0], cfg.max_answer_tokens)
            if span is None:
                continue
            s, t, score = span
            if best[e.example] is None or score > best[e.example][0]:
                best[e.example] = (score, data.examples[e.example].context[e.offsets[s][0] : e.offsets[t][1]])
        return [{"id": ex.id, "answer": b[1] if b else ""} for ex, b in zip(data.examples, best)]

    def evaluate(self, data, preds, labels):
        metrics = M.qa_metrics([p["answer"] for p in preds], [[t for t, _ in ex.answers] for ex in data.examples])
        records = [
            {"id": ex.id, "question": ex.question, "answers": [t for t, _ in ex.answers], "pred": p["answer"]}
            for ex, p in zip(data.examples, preds)
        ]
        return metrics, records


class ChoiceSpec(TaskSpec):
    """``choice``: one score per (context, choice) input, a softmax over a question's choices."""

    name = "choice"
    num_outputs_fixed = 1
    shown_as = "choice"
    stratify = True
    pair_rows = True

    def main_metric(self, labels) -> str:
        return "accuracy"

    def encode(self, fmt, ex: ChoiceExample) -> list[Encoding]:
        return [fmt.encode_text(ex.context, choice) for choice in ex.choices]

    def units(self, encs) -> list[list[int]]:
        groups: dict[int, list[int]] = {}
        for i, e in enumerate(encs):
            groups.setdefault(e.example, []).append(i)
        return list(groups.values())

    def prepare(self, data, encs, fmt, label_index) -> list:
        return [data.examples[e.example].label for e in encs]

    def batch(self, targets, units) -> torch.Tensor:
        return torch.tensor([targets[u[0]] for u in units], dtype=torch.long)

    def loss(self, logits, y, encs, units) -> torch.Tensor:
        return F.cross_entropy(choice_scores(logits[:, 0], [len(u) for u in units]), y)

    def predict(self, data, encs, logits, labels, cfg) -> list[dict]:
        scores: list[list[float]] = [[] for _ in data.examples]
        for e, lg in zip(encs, logits):
            scores[e.example].append(float(lg[0]))
        preds = []
        for sc in scores:
            probs = torch.softmax(torch.tensor(sc, dtype=torch.float64), -1)
            preds.append({"label": int(probs.argmax()), "probs": [round(float(q), 5) for q in probs]})
        return preds

    def evaluate(self, data, preds, labels):
        metrics = {"accuracy": M.accuracy([ex.label for ex in data.examples], [p["label"] for p in preds])}
        records = [
            {"context": ex.context, "choices": ex.choices, "label": ex.label, "pred": p["label"], "probs": p["probs"]}
            for ex, p in zip(data.examples, preds)
        ]
        return metrics, records


def choice_scores(scores: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """(E,) scores of consecutive choices -> (B, max choices), padded with -1e9, one row per question."""
    out = scores.new_full((len(sizes), max(sizes)), -1e9)
    at = 0
    for b, n in enumerate(sizes):
        out[b, :n] = scores[at : at + n]
        at += n
    return out


SPECS: dict[str, TaskSpec] = {
    "classify": ClassifySpec("classify"),
    "pair": ClassifySpec("pair", pair_rows=True),
    "tokens": TokensSpec(),
    "qa": QASpec(),
    "choice": ChoiceSpec(),
}
