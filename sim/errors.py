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


def fail(message: str, *, source: str | None = None, field: str | None = None) -> SimError:
    """Build a :class:`SimError`; written ``raise fail(...)`` so call sites read as prose."""
    return SimError(message, source=source, field=field)
