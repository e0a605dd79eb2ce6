"""Make the helper modules importable (pytest runs in importlib mode): each test folder's, and
those shared by several folders here (``arg_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path

for folder in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith("_")):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
