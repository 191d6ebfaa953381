"""The MLX worker: one thread runs every model load and generation, in arrival order.

mlx_lm's generation stream is thread-local, so all MLX work runs on one
:class:`Worker` thread; Gradio's handler threads only read what it streams
back: the request's place in the queue (:class:`Waiting`), the prefill's
progress (:class:`Prefill`), then the tokens. A run lends the thread to
waiting requests between prefill slices and tokens, so a long prompt does
not hold up a short question; Stop drops a waiting request.
"""

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

# Seconds between looks at a waiting job's place in the queue.
WAIT_POLL = 0.05


class _Done:
    pass


@dataclass
class _Failure:
    error: BaseException


@dataclass
class Waiting:
    """A stream item: the job waits for ``ahead`` jobs (running or queued)."""

    ahead: int


@dataclass
class Prefill:
    """A stream item: ``done`` of the prompt's ``total`` tokens are processed."""

    done: int
    total: int


@dataclass(eq=False)
class _Job:
    run: Callable[[], None]
    cancelled: bool = False
    started: bool = False


class Worker:
    """Runs every MLX job on one daemon thread, in arrival order.

    A job that may ``lend`` the thread runs the jobs waiting behind it at its
    safe points (between prompt slices and between tokens), each to its end,
    then goes on: a short request is not held up by a long prompt. A job that
    has not started yet can be cancelled.
    """

    def __init__(self):
        self._lock = threading.Condition()
        self._waiting: "deque[_Job]" = deque()
        self._running = 0  # jobs on the thread, lent-to ones included
        self._thread = threading.Thread(
            target=self._loop, name="mlx-spec-worker", daemon=True
        )
        self._thread.start()

    def _loop(self):
        while True:
            self._run(self._next(block=True))

    def _next(self, block: bool) -> Optional[_Job]:
        with self._lock:
            while True:
                while self._waiting and self._waiting[0].cancelled:
                    self._waiting.popleft()
                if self._waiting:
                    job = self._waiting.popleft()
                    job.started = True
                    self._running += 1
                    return job
                if not block:
                    return None
                self._lock.wait()

    def _run(self, job: _Job):
        try:
            job.run()
        finally:
            with self._lock:
                self._running -= 1

    def _submit(self, run: Callable[[], None]) -> _Job:
        job = _Job(run)
        with self._lock:
            self._waiting.append(job)
            self._lock.notify()
        return job

    def ahead(self, job: _Job) -> int:
        """How many jobs run or wait before ``job`` (0 once it has started)."""
        with self._lock:
            if job.started:
                return 0
            queued = [j for j in self._waiting if not j.cancelled]
            return self._running + queued.index(job) if job in queued else 0

    def cancel(self, job: _Job) -> bool:
        """Drop ``job`` if it has not started; whether it was dropped."""
        with self._lock:
            if not job.started:
                job.cancelled = True
            return job.cancelled

    def lend(self):
        """On the worker thread: run the jobs waiting now, each to its end."""
        while (job := self._next(block=False)) is not None:
            self._run(job)

    def call(self, fn: Callable, *args, **kwargs):
        """Run ``fn`` on the worker and return its result (or raise its error)."""
        done, box = threading.Event(), {}

        def run():
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # handed back to the caller
                box["error"] = e
            finally:
                done.set()

        self._submit(run)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def stream(
        self,
        make_iter: Callable[[Callable[[int, int], None]], Iterator],
        stop: threading.Event,
        lend: bool = False,
    ) -> Iterator[list]:
        """Iterate ``make_iter(progress)`` on the worker, yielding batches of its items.

        Each batch holds everything produced since the previous one, so a slow
        consumer (the browser) never makes the worker wait. Before the job
        starts, batches hold one :class:`Waiting`; ``progress(done, total)``,
        for the prefill, adds a :class:`Prefill`. Setting ``stop`` drops a
        waiting job, and makes a running one stop after the current item and
        close the iterator (``make_iter`` stops its own prefill); so does
        closing this generator. With ``lend``, the job lends the thread (see
        the class) at each item and prompt slice.
        """
        out: "queue.Queue" = queue.Queue()

        def progress(done: int, total: int):
            out.put(Prefill(done, total))
            if lend and done < total and not stop.is_set():
                self.lend()

        def run():
            if stop.is_set():  # stopped while it waited
                out.put(_Done())
                return
            it = None
            try:
                it = make_iter(progress)
                for item in it:
                    out.put(item)
                    if stop.is_set():
                        break
                    if lend:
                        self.lend()
            except BaseException as e:  # handed back to the consumer
                out.put(_Failure(e))
            finally:
                if it is not None and hasattr(it, "close"):
                    try:
                        it.close()
                    except BaseException as e:
                        out.put(_Failure(e))
                out.put(_Done())

        job = self._submit(run)
        try:
            yield from self._wait_start(job, out, stop)
            if job.cancelled:
                return
            while True:
                batch = [out.get()]
                while True:
                    try:
                        batch.append(out.get_nowait())
                    except queue.Empty:
                        break
                items = []
                for item in batch:
                    if isinstance(item, _Failure):
                        raise item.error
                    if isinstance(item, _Done):
                        if items:
                            yield items
                        return
                    items.append(item)
                yield items
        finally:
            stop.set()
            self.cancel(job)

    def _wait_start(self, job: _Job, out: "queue.Queue", stop: threading.Event):
        """Yield ``[Waiting(n)]`` whenever ``n`` changes until ``job`` starts;
        cancel it if ``stop`` is set first."""
        shown = None
        while out.empty():
            if stop.is_set() and self.cancel(job):
                return
            ahead = self.ahead(job)
            if ahead == 0:
                return
            if ahead != shown:
                shown = ahead
                yield [Waiting(ahead)]
            time.sleep(WAIT_POLL)
