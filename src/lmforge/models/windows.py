"""How ``embed`` reads a text longer than the model's positions: overlapping windows, one rule for every family.

A text of ``n`` tokens and a model that reads at most ``size`` text tokens at once (BERT:
``max_position_embeddings - 2`` for ``[CLS]`` and ``[SEP]``; GPT: ``n_positions``) is cut into windows of
``size`` tokens that start every ``size // 2`` tokens, the last one ending at the text's end.  Every
token lies in one or two windows and takes its vectors from the one where it sees the most context:

- a bidirectional model (BERT, ELMo) sees both sides, so the window where the token's nearer edge is
  farthest away (the larger of ``min(tokens before it, tokens after it)``); with half-window strides
  that puts every token but the text's first and last quarter-windows in the middle half of its window;
- a causal model (GPT) sees only the tokens before it, so the window with the most of those (the
  earliest window holding the token): every token past the first window has at least half a window of
  left context.

No token is dropped and none is read twice into the output; a text that fits is one window, read as before.
"""

from __future__ import annotations

import bisect
import dataclasses


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of a text: tokens ``start:end`` are read; tokens ``own_start:own_end`` take their vectors here."""

    start: int
    end: int
    own_start: int
    own_end: int


def plan_windows(n: int, size: int | None, causal: bool = False) -> list[Window]:
    """The windows a text of ``n`` tokens is read in, in order.

    Args:
        n: the text's length in tokens (0 gives one empty window).
        size: the most text tokens one window holds (>= 1); None = any length (one window).
        causal: the model sees only earlier tokens (see the module docstring).
    Returns:
        Windows whose owned ranges are consecutive and cover ``0..n`` exactly; windows that own no token
        are left out, except the first (which carries the text's ``[CLS]`` vector).
    """
    if size is not None and size < 1:
        raise ValueError(f"window size must be >= 1, got {size}")
    if size is None or n <= size:
        return [Window(0, n, 0, n)]
    stride = max(1, size // 2)
    starts = list(range(0, n - size, stride)) + [n - size]
    owner = [_best_window(i, starts, size, causal) for i in range(n)]
    windows = []
    for k, s in enumerate(starts):
        lo = bisect.bisect_left(owner, k)
        hi = bisect.bisect_right(owner, k)
        if hi > lo or k == 0:
            windows.append(Window(s, s + size, lo, hi))
    return windows


def _best_window(i: int, starts: list[int], size: int, causal: bool) -> int:
    """Index of the window (among those holding token ``i``) where ``i`` sees the most context; the earliest on ties."""
    best, best_context = -1, -1
    k = bisect.bisect_right(starts, i) - 1  # the last window starting at or before i
    while k >= 0 and starts[k] + size > i:
        before, after = i - starts[k], starts[k] + size - 1 - i
        context = before if causal else min(before, after)
        if context >= best_context:  # walking backwards: >= keeps the earliest of equals
            best, best_context = k, context
        k -= 1
    return best
