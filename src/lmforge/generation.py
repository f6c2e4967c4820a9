"""Text generation for causal language models: a decoding loop with a KV cache, sampling, stop rules.

:func:`generate` works with any model offering ``body(input_ids, attention_mask, cache, position_ids)``
and ``lm_head`` (the GPT); with the cache each new token costs one position.  :class:`TextStream` turns
the token stream into printable text (byte-level BPE tokens can end inside a UTF-8 character, and a
stop string must not be shown).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from .errors import LmforgeError
from .nn.transformer import KVCache
from .utils import check_seed

logger = logging.getLogger(__name__)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set the scores outside the top-k / nucleus (top-p) set to -inf.

    Args:
        logits: (B, V) scores (already divided by the temperature).
        top_k: keep the k best tokens (None or 0 = all).
        top_p: keep the smallest set of best tokens whose probability reaches ``top_p`` (None or 1 = all);
            the best token is always kept.
    Returns:
        (B, V) filtered scores (a new tensor).
    """
    logits = logits.clone()
    V = logits.shape[-1]
    if top_k is not None and 0 < top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits[logits < kth] = float("-inf")
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (so the best one always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop_sorted[:, 0] = False  # a top_p below float32's smallest number would otherwise drop every token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits[drop] = float("-inf")
    return logits


def next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick the next token of each row: argmax when ``temperature == 0``, else sample.

    Args:
        logits: (B, V) scores of the last position.
        temperature: 0 = greedy; otherwise the scores are divided by it before top-k/top-p and sampling.
        top_k, top_p: see :func:`filter_logits`.
        generator: RNG for sampling (for reproducible ``seed``).
    Returns:
        (B,) token ids.
    """
    if temperature <= 0:
        return logits.argmax(-1)
    scaled = logits.float() / temperature
    if not torch.isfinite(scaled).all():
        # a temperature so small that the scores overflow float32: in float64, shifted so that the best is 0, the
        # others fall to -inf (the limit of sampling as the temperature falls: the argmax, ties shared)
        shifted = logits.double() - logits.double().amax(-1, keepdim=True)
        scaled = (shifted / temperature).float()
    probs = filter_logits(scaled, top_k, top_p).softmax(-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class StopStrings:
    """Tells when the generated text of a row contains one of ``stops`` (needs a tokenizer to decode)."""

    def __init__(self, tokenizer, stops: list[str]):
        if tokenizer is None:
            raise LmforgeError("stop strings need the model's tokenizer; load the model with lmforge.load")
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        # a stop string of n characters spans at most 4n byte-level tokens (UTF-8 is <= 4 bytes a char)
        self.window = 4 * max((len(s) for s in self.stops), default=1) + 4

    def hit(self, new_ids: list[int]) -> bool:
        """True when the text of ``new_ids`` (the row's generated tokens) ends a stop string at its last token."""
        if not self.stops:
            return False
        text = self.tokenizer.decode(new_ids[-self.window :])
        return any(s in text for s in self.stops)


class _Context:
    """The growing sequence of a generation, fed to the model over a window of its ``n_positions``.

    With a :class:`KVCache` each call runs only the positions the model has not seen yet; without one the
    whole window is re-run.  When the window is full, its last ``n_positions // 2`` tokens are re-run as a
    new prompt (learned positions cannot be shifted inside a cache).
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, use_cache: bool):
        self.model = model
        self.n_pos = model.config.n_positions
        self.seq = input_ids  # (B, T)
        mask = attention_mask.to(device=input_ids.device, dtype=torch.long) if attention_mask is not None else None
        if mask is not None and bool(mask.all()):
            mask = None  # no padding: positions are plain offsets and SDPA can use its causal kernel
        self.mask = mask
        self.start = 0  # first position of the current window
        self.cache = KVCache(len(model.h)) if use_cache else None

    def next_logits(self) -> torch.Tensor:
        """(B, V) fp32 scores of the token after the sequence."""
        if self.seq.shape[1] - self.start >= self.n_pos:  # window full: re-prefill the last n_pos // 2 tokens
            if self.start == 0:  # said once per call, not at every new window
                logger.info("generate: context reached n_positions=%d; continuing over a sliding window", self.n_pos)
            self.start = self.seq.shape[1] - max(1, self.n_pos // 2)
            if self.cache is not None:
                self.cache = KVCache(len(self.model.h))
        fed = self.cache.length if self.cache is not None else 0
        x = self.seq[:, self.start + fed :]  # the positions the model has not seen yet
        m = self.mask[:, self.start :] if self.mask is not None else None
        if m is None:
            pos = torch.arange(fed, fed + x.shape[1], device=x.device)  # (T,)
        else:
            pos = (m.cumsum(-1) - 1).clamp(min=0)[:, fed:]  # (B, T): left padding shifts the positions
        h, _ = self.model.body(x, m, self.cache, pos)
        return self.model.lm_head(h[:, -1]).float()  # (B, V)

    def append(self, tok: torch.Tensor) -> None:
        """Add the (B,) new tokens to the sequence (and its mask)."""
        self.seq = torch.cat([self.seq, tok[:, None]], dim=1)  # (B, T+1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)


class _StopRules:
    """Which rows have stopped: after ``eos_token_id``, or once their text holds a stop string."""

    def __init__(self, model, input_ids: torch.Tensor, eos_token_id: int | None, stop_strings: list[str] | None):
        self.eos_token_id = eos_token_id
        self.stopper = StopStrings(model.tokenizer, stop_strings) if stop_strings else None
        self.done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # (B,)
        self.new_ids: list[list[int]] = [[] for _ in range(input_ids.shape[0])]  # each row's generated ids

    def pad(self, tok: torch.Tensor) -> torch.Tensor:
        """``tok`` with the rows that have stopped set to ``eos_token_id`` (unchanged without one)."""
        if self.eos_token_id is None:
            return tok
        return torch.where(self.done, torch.full_like(tok, self.eos_token_id), tok)

    def update(self, tok: torch.Tensor) -> bool:
        """Take the (B,) new tokens into account; True when every row has stopped."""
        finished = self.done.clone()
        if self.eos_token_id is not None:
            finished |= tok == self.eos_token_id
        if self.stopper is not None:
            for b, t in enumerate(tok.tolist()):
                if not self.done[b]:
                    self.new_ids[b].append(t)
                    if self.stopper.hit(self.new_ids[b]):
                        finished[b] = True
        self.done = finished
        return bool(self.done.all())


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    max_new_tokens: int = 50,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    stop_strings: list[str] | None = None,
    seed: int | None = None,
    streamer: Callable[[torch.Tensor], None] | None = None,
    attention_mask: torch.Tensor | None = None,
    use_cache: bool = True,
    output_logits: bool = False,
):
    """Continue each row of ``input_ids`` by up to ``max_new_tokens`` tokens.

    With the KV cache every new token costs one position; past the model's ``n_positions`` generation goes
    on over a sliding window (see :class:`_Context`).

    Args:
        model: a GPT-like model (``body``, ``lm_head``, ``config.n_positions``, ``tokenizer``).
        input_ids: (B, T) prompt ids; rows of different lengths are left-padded with ``attention_mask``.
        max_new_tokens: tokens to add at most.
        temperature: 0 = greedy (the default); > 0 samples from softmax(logits / temperature).
        top_k, top_p: restrict sampling to the k best tokens / the nucleus of probability ``top_p``.
        eos_token_id: a row stops after producing this id (None = never); finished rows are padded with it.
        stop_strings: a row stops once its generated text contains one of these (uses ``model.tokenizer``).
        seed: seeds the sampling RNG (the same seed gives the same text).
        streamer: called with the (B,) new ids after every step, as soon as they are known.
        attention_mask: (B, T) 1 = prompt token, 0 = left padding.
        use_cache: use the KV cache (True) or recompute the context each step (False).
        output_logits: also return the next-token logits of every step.
    Returns:
        (B, T + n) ids (n <= max_new_tokens: generation ends early when every row has stopped); with
        ``output_logits`` the pair ``(ids, logits)`` with logits (B, n, V) fp32.
    """
    _check_prompt(model, input_ids, max_new_tokens, temperature, top_k, top_p, seed)
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=input_ids.device).manual_seed(seed) if seed is not None else None
    stops = _StopRules(model, input_ids, eos_token_id, stop_strings)
    ctx = _Context(model, input_ids, attention_mask, use_cache)
    all_logits = []
    for _ in range(max_new_tokens):
        logits = ctx.next_logits()  # (B, V)
        if output_logits:
            all_logits.append(logits)
        tok = stops.pad(next_token(logits, temperature, top_k, top_p, generator))  # (B,)
        ctx.append(tok)
        if streamer is not None:
            streamer(tok)
        if stops.update(tok):
            break
    if was_training:
        model.train()
    if output_logits:
        empty = torch.zeros(len(ctx.seq), 0, model.lm_head.weight.shape[0], device=ctx.seq.device)
        return ctx.seq, torch.stack(all_logits, dim=1) if all_logits else empty  # (B, n, V)
    return ctx.seq


def _check_prompt(model, input_ids: torch.Tensor, max_new_tokens, temperature, top_k, top_p, seed) -> None:
    """Refuse a prompt the model cannot read, or sampling settings that make no sense, in one line."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise LmforgeError("generate needs a (batch, length) tensor of prompt ids with at least one token")
    check_generation_args(max_new_tokens, temperature, top_k, top_p, seed)
    n_pos, T0 = model.config.n_positions, input_ids.shape[1]
    if T0 > n_pos:
        raise LmforgeError(f"the prompt has {T0} tokens but the model reads at most {n_pos}; shorten the prompt")


class TextStream:
    """Incremental detokenizer for streaming one row: feed ids, get the text that is safe to show.

    Text is held back while it ends inside a UTF-8 character (the replacement character) or could be the
    start of a stop string; once a stop string appears, the text before it is released and nothing after.

    Args:
        tokenizer: has ``decode(ids) -> str``.
        stop_strings: strings that end the output (not shown).
    """

    def __init__(self, tokenizer, stop_strings: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stops = [s for s in (stop_strings or []) if s]
        self.ids: list[int] = []
        self.shown = 0  # characters of the decoded text already returned
        self.stopped = False

    def _safe_end(self, text: str) -> int:
        end = len(text)
        while end > 0 and text[end - 1] == "\ufffd":  # an unfinished UTF-8 character
            end -= 1
        hold = 0
        for s in self.stops:  # hold back a tail that may grow into a stop string
            for k in range(min(len(s) - 1, end), 0, -1):
                if text[end - k : end] == s[:k]:
                    hold = max(hold, k)
                    break
        return end - hold

    def put(self, token_id: int) -> str:
        """Add one generated id; return the new text to show (possibly empty)."""
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        text = self.tokenizer.decode(self.ids)
        hits = [text.find(s, max(0, self.shown - len(s))) for s in self.stops]
        hits = [i for i in hits if i >= 0]
        if hits:
            self.stopped = True
            cut = min(hits)
            out = text[self.shown : cut]
            self.shown = max(self.shown, cut)
            return out
        end = max(self._safe_end(text), self.shown)
        out = text[self.shown : end]
        self.shown = end
        return out

    def end(self) -> str:
        """Flush what was held back (nothing after a stop string)."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.ids)
        out = text[self.shown :]
        self.shown = len(text)
        return out


def check_generation_args(
    max_new_tokens: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
) -> None:
    """Refuse sampling settings that make no sense, in one line, before any text is produced.

    Each value is checked for its type and range (NaN and infinity included) before it reaches torch,
    so the CLI and the server give the same answer to the same bad number.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 0 <= max_new_tokens < 2**63:
        raise LmforgeError(f"max_new_tokens must be a whole number >= 0, got {max_new_tokens!r}")
    if not _is_number(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise LmforgeError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 0 <= top_k < 2**63):
        raise LmforgeError(f"top_k must be a whole number >= 1 (or 0 for no limit), got {top_k!r}")
    if top_p is not None and (not _is_number(top_p) or not 0.0 < top_p <= 1.0):  # NaN fails the comparison too
        raise LmforgeError(f"top_p must be a number in (0, 1], got {top_p!r}")
    check_seed(seed)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def generate_text(
    model,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: list[str] | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    on_text: Callable[[str], None] | None = None,
    on_token: Callable[[int], None] | None = None,
) -> str:
    """Continue ``prompt`` with a GPT and return the new text, handing each piece to ``on_text`` as it comes.

    The one text path of ``lmforge generate`` and ``lmforge serve``: the prompt is encoded with the
    model's tokenizer, tokens are decoded with a :class:`TextStream` (so a stop string is never shown),
    and the model runs on the device its weights are on.

    Args:
        model: a GPT model with its tokenizer attached (``lmforge.load``).
        prompt: the text to continue (not part of the result).
        max_new_tokens, temperature, top_k, top_p, seed, use_cache: see :func:`generate`.
        stop: stop when the generated text contains one of these (cut from the result).
        on_text: called with each new piece of text as soon as it is safe to show.
        on_token: called with each generated token id before its text (a server counts tokens with it, and
            stops a generation whose client has gone by raising from it).
    Returns:
        The generated text (the concatenation of the pieces).
    """
    ids = _prompt_ids(model, prompt)
    sink = _TextSink(TextStream(model.tokenizer, stop), on_text, on_token)
    model.generate(
        torch.tensor([ids], device=next(model.parameters()).device),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_strings=stop,
        seed=seed,
        streamer=lambda new_ids: sink.put(int(new_ids[0])),
        use_cache=use_cache,
    )
    return sink.end()


def _prompt_ids(model, prompt: str) -> list[int]:
    """The token ids of ``prompt`` (a one-line error for a model without a tokenizer or an empty prompt)."""
    if model.tokenizer is None:
        raise LmforgeError("the model has no tokenizer files; generate needs tokenizer.json beside the model")
    ids = model.tokenizer.encode(prompt)
    if not ids:
        raise LmforgeError("the prompt is empty; give some text to continue")
    return ids


class _TextSink:
    """Where the tokens of :func:`generate_text` go: each id to ``on_token``, then its safe text to ``on_text``,
    and every piece into the result."""

    def __init__(self, stream: TextStream, on_text: Callable[[str], None] | None,
                 on_token: Callable[[int], None] | None):
        self.stream, self.on_text, self.on_token = stream, on_text, on_token
        self.pieces: list[str] = []

    def put(self, token_id: int) -> None:
        if self.on_token is not None:
            self.on_token(token_id)
        self._emit(self.stream.put(token_id))

    def end(self) -> str:
        """Flush the held-back text; the whole generated text."""
        self._emit(self.stream.end())
        return "".join(self.pieces)

    def _emit(self, piece: str) -> None:
        if piece:
            self.pieces.append(piece)
            if self.on_text is not None:
                self.on_text(piece)


__all__ = [
    "generate", "generate_text", "check_generation_args", "next_token", "filter_logits", "StopStrings", "TextStream"
]
