"""sim/compile_notice.py: a first run says, in one line with progress, that it compiles kernels."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numba
from numba.core import event

from sim.compile_notice import HEADER, CompileNotice, _Finishing


class _Listener(event.Listener):
    def __init__(self, notice: CompileNotice):
        self.notice = notice

    def on_start(self, ev: event.Event) -> None:
        self.notice.on_start(ev)

    def on_end(self, ev: event.Event) -> None:
        self.notice.on_end(ev)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _compile_two_kernels() -> None:
    """Two fresh kernels (not cached), the first calling the second: two top-level compilations
    with one nested inside the first."""
    @numba.njit(cache=False)
    def inner(x):
        return x + 1

    @numba.njit(cache=False)
    def outer(x):
        return inner(x) * 2

    assert outer(1) == 4
    assert inner(2.5) == 3.5  # a second signature: compiled on its own, at top level


def test_compilations_make_one_line_naming_the_kernels_then_the_count():
    stream = io.StringIO()
    notice = CompileNotice(stream)
    with event.install_listener("numba:compile", _Listener(notice)):
        _compile_two_kernels()
    notice.finish()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.startswith(HEADER + " outer inner - 2 kernels in ")  # the nested compile of inner is part of outer's


def test_on_a_terminal_the_line_is_rewritten_in_place():
    stream = _Terminal()
    notice = CompileNotice(stream)
    with event.install_listener("numba:compile", _Listener(notice)):
        _compile_two_kernels()
    notice.finish()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.count("\r") >= 4
    assert "now outer" in text and "1 done" in text
    assert text.rsplit("\r", 1)[1].startswith(HEADER + " 2 kernels in ")


def test_no_compilation_writes_nothing():
    stream = io.StringIO()
    notice = CompileNotice(stream)
    notice.finish()
    assert stream.getvalue() == ""


def test_other_output_ends_the_notice_line_first():
    stream = io.StringIO()
    notice = CompileNotice(stream)
    out = _Finishing(stream, notice)
    with event.install_listener("numba:compile", _Listener(notice)):
        _compile_two_kernels()
    out.write("error: something\n")
    notice.finish()  # already ended: nothing more
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith(HEADER) and lines[1] == "error: something"


def test_the_console_script_shows_it_on_stderr_only():
    code = textwrap.dedent("""
        import numba
        from sim import compile_notice
        compile_notice.install()

        @numba.njit(cache=False)
        def f(x):
            return x + 1

        print("result", f(1))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "result 2\n"
    assert run.stderr.startswith(HEADER + " f - 1 kernel in ") and run.stderr.count("\n") == 1
