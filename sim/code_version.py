"""The digest of the package's Python sources: what a sweep point's id and a calibration record.

Its own module because both the sweep's resolver and the calibration need it, and neither may
import the other.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of the package's Python sources (data files are hashed where a point uses them)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]
