"""The one exception type for problems a user can fix.

Every user-facing failure (bad YAML, out-of-range field, corrupt trace, impossible budget)
is raised as :class:`SimError` with a single-line message of the form
``<file>: <field>: <what is wrong and what is allowed>``. The CLI prints it as
``error: <message>`` and exits with status 2, so users never see a traceback.
"""

from __future__ import annotations


class SimError(Exception):
    """A user error with a one-line, actionable message."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        source = " ".join(str(source).split()) if source else source  # one line, whatever a path or key holds
        field = " ".join(str(field).split()) if field else field
        parts = [p for p in (source, field) if p]
        text = " ".join(str(message).split())  # force one line
        self.source = source
        self.field = field
        self.detail = text
        super().__init__(": ".join([*parts, text]) if parts else text)


class Stopped(Exception):
    """A command stopped by a signal after saving its work: the CLI prints ``message`` as it
    is (it says what was kept) and exits with ``status`` (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.message = message
        self.status = status


def interrupt_behind(exc: BaseException | None) -> BaseException | None:
    """The Ctrl-C (or SIGTERM raised as one) behind ``exc``, if any.

    A signal whose handler raises while a compiled (numba) kernel runs comes out as a
    SystemError ("returned a result with an exception set") caused by the interrupt: that is
    the user stopping the run, which the CLI reports as such, not as a crash.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
