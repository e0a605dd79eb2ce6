"""GPT-2 byte-level BPE, built from a GGUF file's tokenizer metadata (SmolLM2's tokenizer).

Encoding is three steps, as llama.cpp and Hugging Face's ``tokenizers`` do it for SmolLM2
(GGUF ``tokenizer.ggml.pre = "smollm"``):

1. control tokens written in the text (``<|im_start|>`` ...) become their ids;
2. pre-tokenisation: every digit is its own piece, then GPT-2's pattern
   ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``;
3. each piece's UTF-8 bytes are mapped to GPT-2's printable characters and merged by
   rank (lowest first) with the file's merge list.

Python's ``re`` has no ``\\p{..}`` classes, so letters are ``[^\\W\\d_]`` (alphabetic, plus
the rare non-decimal numerals) and numbers ``\\d`` (decimal digits): identical for
English text, which is what the test against llama.cpp's own tokenizer checks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from sim.errors import SimError

_LETTERS = r"[^\W\d_]"
_OTHER = r"(?:[^\s\w]|_)"
_PIECE = re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?{_LETTERS}+| ?\d+| ?{_OTHER}+|\s+(?!\S)|\s+")
_DIGIT = re.compile(r"(\d)")
CONTROL = 3  # GGUF token_type of control tokens


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


class ByteBPE:
    """Byte-level BPE tokenizer: ``encode`` (text -> ids) and ``decode`` (ids -> text)."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_type: Sequence[int] | None = None,
                 bos: int = -1, eos: int = -1):
        self.tokens = list(tokens)
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            a, sep, b = merge.partition(" ")
            if not sep:
                raise SimError(f"merge {rank} ({merge!r}) is not two tokens separated by a space",
                               field="tokenizer.ggml.merges")
            self.ranks[(a, b)] = rank
        types = list(token_type) if token_type is not None else [1] * len(self.tokens)
        self.control = {self.tokens[i]: i for i, t in enumerate(types) if t == CONTROL}
        self._control_re = (re.compile("(" + "|".join(re.escape(t) for t in sorted(self.control, key=len,
                                                                                   reverse=True)) + ")")
                            if self.control else None)
        self.bos, self.eos = bos, eos
        self._b2u = bytes_to_unicode()
        self._u2b = {c: b for b, c in self._b2u.items()}
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def _bpe(self, piece: str) -> list[int]:
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        word = [self._b2u[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best, at = None, -1
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            word[at:at + 2] = [word[at] + word[at + 1]]
        try:
            ids = [self.vocab[w] for w in word]
        except KeyError as exc:
            raise SimError(f"BPE produced {exc.args[0]!r}, which is not in the vocabulary",
                           field="tokenizer") from None
        if len(self._cache) < 100_000:
            self._cache[piece] = ids
        return ids

    def pieces(self, text: str) -> list[str]:
        """Pre-tokenised pieces of plain text (no control tokens)."""
        out: list[str] = []
        for part in _DIGIT.split(text):
            if part:
                out.extend(_PIECE.findall(part))
        return out

    def encode(self, text: str, *, special: bool = True) -> np.ndarray:
        """Token ids of ``text`` (no BOS: SmolLM2's GGUF sets ``add_bos_token`` false)."""
        parts = self._control_re.split(text) if special and self._control_re is not None else [text]
        ids: list[int] = []
        for part in parts:
            if part in self.control:
                ids.append(self.control[part])
            elif part:
                for piece in self.pieces(part):
                    ids.extend(self._bpe(piece))
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids``; invalid UTF-8 (a character cut between tokens) becomes U+FFFD."""
        data = bytearray()
        for i in np.asarray(ids, dtype=np.int64).reshape(-1):
            if not 0 <= i < len(self.tokens):
                raise SimError(f"token id {int(i)} is outside [0, {len(self.tokens)})", field="ids")
            tok = self.tokens[int(i)]
            if tok in self.control:
                data += tok.encode("utf-8")
            else:
                data += bytes(self._u2b[c] for c in tok)
        return data.decode("utf-8", errors="replace")
