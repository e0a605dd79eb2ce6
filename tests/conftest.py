"""Make each test folder's helper modules importable (pytest runs in importlib mode)."""

from __future__ import annotations

import sys
from pathlib import Path

for folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith("_")):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
