"""One line on stderr while numba compiles the simulator's kernels, so a first run is not silent.

numba compiles each ``@njit(cache=True)`` kernel the first time a process calls it and keeps
the result on disk (``__pycache__`` or ``$NUMBA_CACHE_DIR``); a fresh install's first
``sim run`` therefore spends most of its time compiling. :func:`install` registers a numba
event listener: at the first compilation it writes ``compiling numba kernels on first use
(kept for later runs):`` and then, as each kernel is done, its progress (on a terminal the
line is rewritten with the count, the seconds so far and the kernel at hand; in a log the
kernels' names are appended), and ends the line with the count and the time when anything
else is written to stdout or stderr, or at exit. Runs that load every kernel from the
cache print nothing.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import Any, TextIO

HEADER = "compiling numba kernels on first use (kept for later runs):"


class CompileNotice:
    """The notice's state; its :meth:`on_start` / :meth:`on_end` are numba's listener methods."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.depth = 0  # kernels compiling now: a kernel compiles the ones it calls inside its own event
        self.done = 0
        self.started: float | None = None
        self.current = ""
        self._lock = threading.RLock()

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def on_start(self, event: Any) -> None:
        with self._lock:
            self.depth += 1
            if self.depth > 1:
                return
            self.current = _name(event)
            if self.started is None:
                self.started = time.perf_counter()
                self._write(HEADER if not self.tty else self._status())
            elif self.tty:
                self._write(self._status())

    def on_end(self, event: Any) -> None:
        with self._lock:
            self.depth = max(0, self.depth - 1)
            if self.depth or self.started is None:
                return
            self.done += 1
            self._write(self._status() if self.tty else f" {_name(event)}")

    def _status(self) -> str:
        assert self.started is not None
        return (f"\r{HEADER} {self.done} done, {time.perf_counter() - self.started:.1f} s"
                + (f", now {self.current}" if self.depth else "") + "\x1b[K")

    def finish(self) -> None:
        """End the line (count and seconds), if a compilation started one."""
        with self._lock:
            if self.started is None:
                return
            took = time.perf_counter() - self.started
            summary = f"{self.done} kernel{'s' if self.done != 1 else ''} in {took:.1f} s\n"
            self._write(f"\r{HEADER} {summary}\x1b[K" if self.tty else f" - {summary}")
            self.started = None
            self.done = 0


class _Finishing:
    """A stream that ends an open notice line before anything else is written to it."""

    def __init__(self, stream: TextIO, notice: CompileNotice):
        self._stream, self._notice = stream, notice

    def write(self, text: str) -> int:
        if text and self._notice.started is not None:
            self._notice.finish()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_INSTALLED: CompileNotice | None = None


def install(stream: TextIO | None = None) -> CompileNotice:
    """Show the notice for compilations in this process from now on (once per process).

    The console script calls this; library calls and tests that call ``sim.cli.main`` do not,
    so their output stays exactly what the commands print.
    """
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    from numba.core import event

    notice = CompileNotice(sys.stderr if stream is None else stream)

    class _Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            notice.on_start(ev)

        def on_end(self, ev: event.Event) -> None:
            notice.on_end(ev)

    event.register("numba:compile", _Listener())
    sys.stdout = _Finishing(sys.stdout, notice)  # type: ignore[assignment]
    sys.stderr = _Finishing(sys.stderr, notice)  # type: ignore[assignment]
    atexit.register(notice.finish)
    _INSTALLED = notice
    return notice


def _name(event: Any) -> str:
    dispatcher = event.data.get("dispatcher") if isinstance(getattr(event, "data", None), dict) else None
    func = getattr(dispatcher, "py_func", None)
    return getattr(func, "__name__", "kernel")
