"""Generations in ``lmforge serve``: a bounded number of slots, each generation in a thread of its own that
stops at the next token when its client has gone or the server is shutting down.

Both ``/v1/generate`` and ``/v1/completions`` run :func:`generate_one`, which is
:func:`lmforge.generation.generate_text` (the text path of ``lmforge generate``) plus a token count and a
check before every token.  A request holds its slot until its thread has really stopped, so the number of
running generations (``/health``) never counts one that nobody waits for, and never misses one that
still uses the cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import StreamingResponse

from ..errors import LmforgeError
from ..generation import generate_text
from .errors import HTTPError, one_line

logger = logging.getLogger(__name__)

#: how often a waiting request asks whether its client is still there
POLL_S = 0.1
#: pieces of a stream a generation may run ahead of its client before it waits for the client to read
AHEAD = 64
#: how long a generation waits for a streaming client that reads nothing before it gives up its slot
STALL_S = 30.0


class Cancelled(Exception):
    """Raised inside a generation thread to stop it (its client left, or the server is shutting down)."""


@dataclasses.dataclass
class Generated:
    """One generation's text, how many tokens it took, and whether a stop string ended it."""

    text: str
    tokens: int
    stopped: bool


class Slot:
    """One running generation's claim; :meth:`check` raises :class:`Cancelled` once it should stop."""

    def __init__(self, stopping: threading.Event):
        self.cancel = threading.Event()
        self._stopping = stopping

    def check(self) -> None:
        if self._stopping.is_set():
            raise Cancelled("the server is shutting down; the generation was cancelled")
        if self.cancel.is_set():
            raise Cancelled("the client went away")


def generate_one(model, prompt: str, options: dict, slot: Slot, on_text: Callable[[str], None] | None = None):
    """``generate_text(model, prompt, **options)``, checking ``slot`` before every token.

    Returns:
        :class:`Generated`: the text (what ``lmforge generate`` prints after the prompt), the number of tokens
        generated, and whether one of ``options["stop"]`` ended it.
    """
    ids: list[int] = []

    def on_token(token_id: int) -> None:
        slot.check()
        ids.append(token_id)

    text = generate_text(model, prompt, on_text=on_text, on_token=on_token, **options)
    stops = [s for s in options.get("stop") or [] if s]
    stopped = bool(stops) and any(s in model.tokenizer.decode(ids) for s in stops)
    return Generated(text, len(ids), stopped)


class Generations:
    """The generation slots of one server: at most ``limit`` at once, all stopped by :meth:`stop_all`."""

    def __init__(self, limit: int, stall_s: float = STALL_S):
        self.limit = limit
        self.stall_s = stall_s
        self.running = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def _take(self) -> Slot:
        if self.stopping.is_set():
            raise HTTPError(503, "the server is shutting down; try another server or later")
        with self._lock:
            if self.running >= self.limit:
                raise HTTPError(
                    429, f"{self.running} generations are running (the limit, --max-generations); try again shortly"
                )
            self.running += 1
        return Slot(self.stopping)

    def _free(self) -> None:
        with self._lock:
            self.running -= 1

    def stop_all(self) -> None:
        """Refuse new generations and stop the running ones at their next token (server shutdown)."""
        self.stopping.set()

    async def run(self, request: Request, work: Callable[[Slot], Any]) -> Any:
        """Run ``work(slot)`` in a thread holding one slot, and return its result.

        While it runs, the client is asked every ``POLL_S`` whether it is still there; if it has gone the
        generation stops at its next token.  Refusals: 429 (no slot), 503 (shutting down), 499 (the client
        left: nobody reads it).
        """
        slot = self._take()

        def guarded():
            try:
                return work(slot)
            finally:
                self._free()

        result, failure = None, None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_client, request, slot)
            try:
                result = await anyio.to_thread.run_sync(guarded)
            except Exception as e:  # raised below, outside the task group (which would wrap it)
                failure = e
            finally:
                tg.cancel_scope.cancel()
        if isinstance(failure, Cancelled):
            raise HTTPError(499 if slot.cancel.is_set() else 503, str(failure))
        if failure is not None:
            raise failure
        return result

    def stream(self, work: Callable[[Slot, Callable[[Any], None]], Any], events) -> StreamingResponse:
        """Answer with server-sent events while ``work(slot, emit)`` runs in a thread holding one slot.

        ``events`` turns the worker's messages into the text of the response: it gets an async iterator of
        ``("piece", x)`` for each ``emit(x)``, then one of ``("done", result)``, ``("error", line)``,
        ``("cancelled", line)``, and yields strings.  The slot's generation stops at its next token when the
        response ends for any reason (finished, client gone, server shutting down).
        """
        slot = self._take()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        unread = threading.Semaphore(AHEAD)  # a stalled client stops the generation, which then loses its slot

        def put(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def emit(value: Any) -> None:
            slot.check()
            if not unread.acquire(timeout=self.stall_s):
                raise Cancelled(f"the client read nothing for {self.stall_s:g} s; the generation gave up its slot")
            put("piece", value)

        def guarded() -> None:
            try:
                put("done", work(slot, emit))
            except Cancelled as e:
                put("cancelled", str(e))
            except LmforgeError as e:
                put("error", one_line(e))
            except Exception as e:  # the stream has started: the error travels as an event
                logger.exception("generation failed")
                put("error", one_line(f"internal error: {type(e).__name__}: {e}"))
            finally:
                self._free()

        threading.Thread(target=guarded, name="lmforge-generate", daemon=True).start()

        async def messages() -> AsyncIterator[tuple[str, Any]]:
            while True:
                kind, value = await queue.get()
                if kind == "piece":
                    unread.release()
                yield kind, value
                if kind != "piece":
                    return

        return _SlotStream(events(messages()), slot)


async def _watch_client(request: Request, slot: Slot) -> None:
    while not slot.cancel.is_set():
        await anyio.sleep(POLL_S)
        if await request.is_disconnected():
            slot.cancel.set()


class _SlotStream(StreamingResponse):
    """A stream of server-sent events that stops its generation however the response ends."""

    def __init__(self, content, slot: Slot):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.slot = slot

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.cancel.set()
