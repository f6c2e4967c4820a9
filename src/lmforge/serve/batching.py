"""A micro-batching queue: requests to one model that arrive together run as one batch.

Each :class:`MicroBatcher` owns one worker task on the event loop.  A request submits its items
(e.g. the texts to embed) and awaits their results; the worker takes what is queued, waits at most
``wait_s`` for more (up to ``max_batch`` items), runs ``fn`` on all of them in one worker thread, and
hands each request its slice.  Under load the requests that arrive while a batch runs form the next
one, so the model's forward passes fill up by themselves; a lone request waits ``wait_s`` at most.

If a batch fails (e.g. one request's text is refused by the model), each of its requests is run
alone, so the bad request gets its own error and the others their answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio.to_thread

logger = logging.getLogger(__name__)


class MicroBatcher:
    """Collect items from concurrent requests and run ``fn(items) -> results`` on them together.

    Args:
        fn: takes a list of items and returns one result per item, in order (runs in a worker thread).
        max_batch: most items per call of ``fn`` (1 = no batching: every request runs alone).
        wait_s: how long the first request of a batch waits for company.
        name: for the logs.
    """

    def __init__(
        self, fn: Callable[[list[Any]], Sequence[Any]], max_batch: int = 16, wait_s: float = 0.002, name: str = "batch"
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.fn = fn
        self.max_batch = max_batch
        self.wait_s = max(0.0, wait_s)
        self.name = name
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self.calls = 0  # calls of fn (for the bench and the tests)
        self.items = 0

    async def submit(self, items: list[Any]) -> list[Any]:
        """Queue ``items`` (one request's) and return their results once their batch has run."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._work(self._queue))
        fut = loop.create_future()
        await self._queue.put((list(items), fut))
        return await fut

    async def _next_batch(self, queue: asyncio.Queue) -> list[tuple[list[Any], asyncio.Future]]:
        batch = [await queue.get()]
        n = len(batch[0][0])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while n < self.max_batch:
            if not queue.empty():
                nxt = queue.get_nowait()
            else:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    nxt = await asyncio.wait_for(queue.get(), left)
                except (asyncio.TimeoutError, TimeoutError):
                    break
            batch.append(nxt)
            n += len(nxt[0])
        return batch

    def _run(self, items: list[Any]) -> list[Any]:
        self.calls += 1
        self.items += len(items)
        results = list(self.fn(items))
        if len(results) != len(items):
            raise RuntimeError(f"internal error: {self.name} gave {len(results)} results for {len(items)} items")
        return results

    async def _work(self, queue: asyncio.Queue) -> None:
        while True:
            batch = await self._next_batch(queue)
            batch = [(items, fut) for items, fut in batch if not fut.done()]  # a client may have gone
            if not batch:
                continue
            flat = [x for items, _ in batch for x in items]
            try:
                results = await anyio.to_thread.run_sync(self._run, flat)
            except Exception as e:
                if len(batch) == 1:
                    _settle(batch[0][1], error=e)
                    continue
                # one request may have spoiled the batch: run each alone so only it gets the error
                logger.debug("%s: a batch of %d requests failed; running them one by one", self.name, len(batch))
                for items, fut in batch:
                    try:
                        _settle(fut, await anyio.to_thread.run_sync(self._run, items))
                    except Exception as e1:
                        _settle(fut, error=e1)
                continue
            k = 0
            for items, fut in batch:
                _settle(fut, results[k : k + len(items)])
                k += len(items)


def _settle(fut: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if fut.done():  # the client went away
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
