"""sim/docs.py: `python -m sim.docs --small` regenerates every README figure into a folder."""

from __future__ import annotations

from sim import docs

PNG = b"\x89PNG\r\n\x1a\n"


def test_make_docs_small_writes_every_figure(tmp_path, capsys):
    assert docs.main(["--small", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(docs.FIGURES)
    for name in docs.FIGURES:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and 5_000 < len(data) < 300_000, name
    out = capsys.readouterr().out
    assert all(f"wrote {tmp_path / name}" in out for name in docs.FIGURES)
