"""Turning task examples into a body's input ids, and knowing where to read the answer back.

Each family reads its input in its own way:

- **BERT**: ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with segment ids 0/1; a sentence (pair)
  is read at ``[CLS]``; QA is ``[CLS] question [SEP] context [SEP]``.
- **GPT**: the GPT-1 input transformations of ``lmforge/families/gpt/inputs.py`` (start, delimiter
  and extract tokens); a sentence (pair) is read at the extract token, the last one.
- **ELMo / word2vec** ("plain"): the tokens of ``A`` then ``B`` with no special tokens; a sentence is
  the mean of its token vectors, a pair is read as ``[a, b, |a - b|, a * b]`` of the two means.

An :class:`Encoding` records, besides the ids, what the task head reads: ``rows`` are the token
positions whose vectors form the head's input (one per word for tagging, every position for QA
and for a BiLSTM head), or ``mean_segments`` the segments that are mean-pooled.  Token tagging
labels the first sub-token of each word (other sub-tokens get no label, -100); QA keeps the char
offsets of the context tokens so a predicted span maps back to context text.

A QA context longer than the room left after the question is read in overlapping windows (the
sliding window of the original BERT SQuAD recipe): each window is its own :class:`Encoding` with the
whole question and a slice of the context, consecutive slices starting ``doc_stride`` tokens apart.
"""

from __future__ import annotations

import dataclasses
import logging

from ..errors import LmforgeError
from ..families import FAMILIES, PLAIN, InputRules
from ..text import written_without_spaces

logger = logging.getLogger(__name__)

# pooler: read at [CLS], through BERT's tanh pooler
POOLS = ("cls", "pooler", "last", "mean", "tokens")
# how a text longer than the room is cut: keep its start, or its first quarter and as much of its end as fits
# (head+tail: for long documents whose end carries the label, such as reviews that give their verdict last)
TRUNCATIONS = ("head", "head+tail")
HEAD_SHARE = 0.25  # head+tail: the share of the room kept from the start (Sun et al. 2019: 128 of 510)


def input_format(family: str | None) -> str | None:
    """The family whose input format a ``family`` body reads (the family's ``input_format``): ELECTRA
    reads BERT's; an unknown name (a stand-in body) is its own."""
    return FAMILIES[family].input_format if family in FAMILIES else family


def input_rules(family: str | None) -> InputRules:
    """How transfer builds the input of a ``family`` body (the family's ``input_rules``); a stand-in body that no
    family registers reads plain pieces."""
    return FAMILIES[family].input_rules if family in FAMILIES else PLAIN


def summary_trained(body) -> bool:
    """Whether the position a family reads a sentence at by default was trained to summarise the input.

    BERT's top ``[CLS]`` learns that only from next-sentence prediction: a BERT pretrained on MLM alone
    (``next_sentence=False``) has a ``[CLS]`` that no loss ever asked to describe the text, and fine-tuned
    on single texts it reads the mean of its token vectors instead (docs/transfer.md, ``--pool``).
    GPT's extract position sees the whole input under the LM objective; ELMo and word2vec read the mean.
    """
    family = getattr(body, "model_type", None)
    if input_rules(family).summary_needs_nsp:  # ELECTRA's discriminator has no NSP either
        return bool(getattr(getattr(body, "config", None), "next_sentence", input_format(family) == family))
    return True


@dataclasses.dataclass
class Encoding:
    """One example as body input plus what the head reads.

    Attributes:
        input_ids: token ids, specials included.
        token_type_ids: segment ids (BERT), zeros elsewhere.
        segment: per position 0 (text / question), 1 (text_pair / context) or -1 (special token).
        rows: positions whose vectors the head reads, in order (tagging: one per word; QA/BiLSTM:
            the positions); empty when the example is mean-pooled.
        mean_segments: segments to mean-pool into one vector each (``[0]`` or ``[0, 1]``); empty
            when ``rows`` are used.
        word_rows: tagging only: for each word, its index into ``rows`` or -1 when truncated away.
            Two words may share a row when one token spans both (e.g. BPE merging across CJK words);
            the row is then labelled by the first of them and predicts both.
        offsets: QA only: per position the (start, end) char span in the context, or None.
        example: index of the example this encoding belongs to (QA: several windows share one);
            set by the caller, -1 until then.
        twin: a pair read in both orders: the encoding of the swapped pair, whose read-out is added
            to this one's (GPT-1's similarity); None otherwise.
    """

    input_ids: list[int]
    token_type_ids: list[int]
    segment: list[int]
    rows: list[int] = dataclasses.field(default_factory=list)
    mean_segments: list[int] = dataclasses.field(default_factory=list)
    word_rows: list[int] = dataclasses.field(default_factory=list)
    offsets: list[tuple[int, int] | None] = dataclasses.field(default_factory=list)
    example: int = -1
    twin: Encoding | None = None


def join_words(words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """Join words into text: a space between words, none between two CJK words (Chinese is written so).

    Returns:
        (text, spans): ``spans[i]`` is the (start, end) char span of ``words[i]`` in ``text``.
    """
    parts, spans, pos = [], [], 0
    for i, w in enumerate(words):
        if i and not (written_without_spaces(words[i - 1][-1]) and written_without_spaces(w[0])):
            parts.append(" ")
            pos += 1
        spans.append((pos, pos + len(w)))
        parts.append(w)
        pos += len(w)
    return "".join(parts), spans


def _overlapping(offsets: list[tuple[int, int]], start: int, end: int) -> int:
    """Index of the first token whose char span overlaps [start, end), or -1."""
    for t, (s, e) in enumerate(offsets):
        if e > start and s < end:
            return t
        if s >= end:
            break
    return -1


class InputFormat:
    """Builds :class:`Encoding` s for one family from its tokenizer.

    Args:
        family: the body's family name (its ``model_type``).
        tokenizer: the body's attached tokenizer (``encode_with_offsets``, special ids).
        max_len: the most positions an encoding may have, specials included.
        pool: ``"cls"``, ``"pooler"``, ``"last"``, ``"mean"`` or ``"tokens"`` (every token, for a BiLSTM head).
        gpt: for GPT, the input transformation object of its family's ``task_format`` (adds start/delim/extract).
        doc_stride: QA: tokens between the starts of consecutive context windows (None: half the
            context room, so windows overlap by half; 0: one window, the rest of the context is cut;
            larger than the room: the room, so no context token is skipped).
        both_orders: pairs: also encode ``(text_pair, text)`` as the ``twin`` of ``(text, text_pair)``;
            needs a one-position read-out (``cls`` or ``last``).
        truncation: how a text longer than its room is cut: ``head`` (keep the start) or ``head+tail``
            (keep the first quarter of the room from the start and the rest from the end: for long documents
            whose end carries the label).
    """

    def __init__(
        self,
        family: str,
        tokenizer,
        max_len: int,
        pool: str | None = None,
        gpt=None,
        doc_stride: int | None = None,
        both_orders: bool = False,
        truncation: str = "head",
    ):
        if tokenizer is None:
            raise LmforgeError(f"the {family} model has no tokenizer attached; load it with lmforge.load(model_dir)")
        rules = input_rules(family)
        family = input_format(family)  # e.g. ELECTRA's discriminator: BERT's [CLS] A [SEP] B [SEP]
        self.family = family
        self.tok = tokenizer
        self.max_len = int(max_len)
        self.pool = pool or rules.default_pool
        if self.pool not in POOLS:
            raise LmforgeError(f"unknown pooling '{self.pool}'; choose one of {', '.join(POOLS)}")
        self.rules = rules
        if self.pool in ("cls", "pooler") and self.pool not in rules.pools:
            raise LmforgeError(f"--pool {self.pool} needs a [CLS] token (BERT); the {family} model has none: use mean")
        if self.pool == "last" and self.pool not in rules.pools:
            raise LmforgeError(f"--pool last reads GPT's extract token; for {family} use mean")
        self.gpt = gpt
        self._assemble_format = {"cls_sep": self._assemble_cls_sep, "task_tokens": self._assemble_gpt}.get(
            rules.layout, self._assemble_plain)
        if self._assemble_format == self._assemble_gpt and gpt is None:
            raise LmforgeError("GPT inputs need lmforge.families.gpt.inputs, which is not available")
        for name in rules.needs_ids:
            if getattr(tokenizer, name, None) is None:
                raise LmforgeError(f"the BERT tokenizer has no {name}; BERT inputs need [CLS] and [SEP]")
        if doc_stride is not None and doc_stride < 0:
            raise LmforgeError(f"--doc-stride must be >= 0 (0 = no sliding window), got {doc_stride}")
        self.doc_stride = doc_stride
        if both_orders and self.pool not in ("cls", "last"):
            raise LmforgeError(
                f"--both-orders adds the read-outs of the two orders of a pair, which needs --pool cls (BERT) "
                f"or last (GPT); this {family} run reads '{self.pool}'"
            )
        self.both_orders = both_orders
        if truncation not in TRUNCATIONS:
            raise LmforgeError(f"unknown truncation '{truncation}'; choose one of {', '.join(TRUNCATIONS)}")
        self.truncation = truncation
        self.n_special = rules.n_special
        if self.max_len < self.n_special + 2:
            raise LmforgeError(f"--max-len {self.max_len} is too short; use at least {self.n_special + 8}")

    @property
    def pad_id(self) -> int:
        for name in ("pad_id", "eot_id"):
            v = getattr(self.tok, name, None)
            if v is not None:
                return int(v)
        return 0

    # -- pieces ------------------------------------------------------------------------------------
    def _pieces(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids, _tokens, offsets = self.tok.encode_with_offsets(text)
        return list(ids), [tuple(o) for o in offsets]

    def _assemble(
        self, a: list[int], b: list[int] | None, pair_mode: str = "pair"
    ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """Specials around ``a`` (and ``b``).

        Returns:
            (ids, token_type_ids, segment, a_positions, b_positions).
        """
        return self._assemble_format(a, b, pair_mode)

    def _assemble_cls_sep(self, a: list[int], b: list[int] | None, pair_mode: str = "pair"):
        """BERT's ``[CLS] A [SEP] (B [SEP])`` with segment ids 0 / 1."""
        ids = [self.tok.cls_id, *a, self.tok.sep_id]
        types = [0] * len(ids)
        seg = [-1] + [0] * len(a) + [-1]
        a_pos = list(range(1, 1 + len(a)))
        b_pos: list[int] = []
        if b is not None:
            b_pos = list(range(len(ids), len(ids) + len(b)))
            ids += [*b, self.tok.sep_id]
            types += [1] * (len(b) + 1)
            seg += [1] * len(b) + [-1]
        return ids, types, seg, a_pos, b_pos

    def _assemble_gpt(self, a: list[int], b: list[int] | None, pair_mode: str = "pair"):
        """GPT's task tokens around the text (lmforge.families.gpt.inputs)."""
        ids, a_pos, b_pos = self.gpt.build(a, b)
        seg = [-1] * len(ids)
        for p in a_pos:
            seg[p] = 0
        for p in b_pos:
            seg[p] = 1
        return ids, [0] * len(ids), seg, a_pos, b_pos

    def _assemble_plain(self, a: list[int], b: list[int] | None, pair_mode: str = "pair"):
        """The pieces as they are (ELMo, word2vec)."""
        ids = list(a) + (list(b) if b is not None else [])
        seg = [0] * len(a) + [1] * (len(b) if b is not None else 0)
        return ids, [0] * len(ids), seg, list(range(len(a))), list(range(len(a), len(ids)))

    def _budget(self, la: int, lb: int | None) -> tuple[int, int]:
        """Truncate the longer of the two sequences first until they fit ``max_len``."""
        room = self.max_len - self.n_special
        if lb is None:
            return min(la, room), 0
        while la + lb > room:
            if la >= lb:
                la -= 1
            else:
                lb -= 1
        return la, lb

    def _cut(self, ids: list[int], keep: int) -> list[int]:
        """``keep`` of ``ids``: the first ones, or with head+tail the first quarter and the last ones."""
        if len(ids) <= keep:
            return ids
        if self.truncation == "head" or keep < 2:
            return ids[:keep]
        head = max(1, int(keep * HEAD_SHARE))
        return ids[:head] + ids[len(ids) - (keep - head):]

    # -- the kinds of examples (choice: one encode_text pair per choice) --------------------------------
    def encode_text(self, text: str, text_pair: str | None = None) -> Encoding:
        """A sentence or a sentence pair, read as one vector (or two means for plain pairs).

        With ``both_orders``, a pair's encoding carries the swapped pair as its ``twin``.
        """
        enc = self._encode_text(text, text_pair)
        if self.both_orders and text_pair is not None:
            enc.twin = self._encode_text(text_pair, text)
        return enc

    def _encode_text(self, text: str, text_pair: str | None) -> Encoding:
        a, _ = self._pieces(text)
        b = self._pieces(text_pair)[0] if text_pair is not None else None
        la, lb = self._budget(len(a), len(b) if b is not None else None)
        a = self._cut(a, la)
        b = self._cut(b, lb) if b is not None else None
        ids, types, seg, a_pos, b_pos = self._assemble(a, b)
        enc = Encoding(ids, types, seg)
        if self.pool in ("cls", "pooler"):
            enc.rows = [0]
        elif self.pool == "last":
            enc.rows = [len(ids) - 1]
        elif self.pool == "tokens":
            enc.rows = a_pos + b_pos
            if not enc.rows:
                enc.rows = [0] if ids else []
        else:
            enc.mean_segments = [0, 1] if b is not None else [0]
        return enc

    def encode_words(self, words: list[str]) -> Encoding:
        """Pre-split words for tagging: rows are each word's first sub-token."""
        text, spans = join_words(words)
        pieces, offsets = self._pieces(text)
        la, _ = self._budget(len(pieces), None)
        ids, types, seg, a_pos, _ = self._assemble(pieces[:la], None)
        offsets = offsets[:la]
        enc = Encoding(ids, types, seg)
        seen: dict[int, int] = {}
        for s, e in spans:
            t = _overlapping(offsets, s, e)
            if t < 0:
                enc.word_rows.append(-1)  # truncated away (or a word the tokenizer dropped)
                continue
            if t in seen:
                enc.word_rows.append(seen[t])
                continue
            seen[t] = len(enc.rows)
            enc.word_rows.append(len(enc.rows))
            enc.rows.append(a_pos[t])
        return enc

    def encode_qa(self, question: str, context: str) -> list[Encoding]:
        """Question then context, as one or more windows over the context.

        Rows are all positions; ``offsets`` maps each window's context positions to context chars.
        The question is kept whole when it can be (up to half the room); the context fills the rest,
        window after window, until a window reaches its end.
        """
        q, _ = self._pieces(question)
        c, c_off = self._pieces(context)
        room = self.max_len - self.n_special
        lq = min(len(q), room // 2)
        width = room - lq  # context tokens per window
        stride = width // 2 if self.doc_stride is None else self.doc_stride
        stride = max(1, min(stride, width))
        windows = []
        start = 0
        while True:
            piece = c[start : start + width]
            ids, types, seg, _q_pos, c_pos = self._assemble(q[:lq], piece)
            enc = Encoding(ids, types, seg, rows=list(range(len(ids))))
            enc.offsets = [None] * len(ids)
            for p, off in zip(c_pos, c_off[start : start + width]):
                enc.offsets[p] = off
            windows.append(enc)
            if self.doc_stride == 0 or start + width >= len(c):
                return windows
            start += stride

    def qa_target(self, enc: Encoding, start_char: int, text: str) -> tuple[int, int] | None:
        """Token positions (start, end) of an answer span in ``enc``, or None when it is not wholly inside.

        White space around the answer text does not count; a span that starts before the window's
        first context token or ends past its last one is not inside.
        """
        start_char += len(text) - len(text.lstrip())
        end_char = start_char + len(text.strip())
        start = end = None
        for p, off in enumerate(enc.offsets):
            if off is None:
                continue
            s, e = off
            if start is None and e > start_char:
                start = p
            if s < end_char:
                end = p
        if start is None or end is None or end < start:
            return None
        if enc.offsets[start][0] > start_char or enc.offsets[end][1] < end_char:
            return None  # the span begins before this window or runs past it
        return start, end
