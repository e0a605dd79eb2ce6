"""Tokenizers: BERT's WordPiece (reads ``vocab.txt``) and a byte tokenizer for tiny models.

The WordPiece tokenizer follows Hugging Face's ``BertTokenizer`` (uncased): clean control
characters, space out CJK characters, lower-case, strip accents, split on whitespace and
punctuation, then split each word greedily into the longest vocabulary pieces, continuation
pieces prefixed ``##``; a word that cannot be split becomes ``[UNK]``.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np

from sim.errors import SimError

from .weights import BYTE_VOCAB


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class WordPiece:
    """Uncased BERT WordPiece tokenizer over a ``vocab.txt`` (one token per line)."""

    def __init__(self, vocab: dict[str, int], max_chars_per_word: int = 100):
        self.vocab = vocab
        self.max_chars = max_chars_per_word
        for special in ("[UNK]", "[CLS]", "[SEP]"):
            if special not in vocab:
                raise SimError(f"vocabulary lacks the special token {special}", field="vocab.txt")
        self.unk, self.cls, self.sep = vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"]

    @classmethod
    def from_file(cls, path: str | Path) -> WordPiece:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise SimError(f"cannot read vocabulary ({exc})", source=str(path)) from None
        return cls({tok: i for i, tok in enumerate(lines) if tok})

    def basic_split(self, text: str) -> list[str]:
        """Words and punctuation marks after cleaning, lower-casing and accent stripping."""
        cleaned = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch).startswith("C") and ch not in "\t\n\r"):
                continue
            if _is_cjk(cp):
                cleaned.append(f" {ch} ")
            else:
                cleaned.append(" " if ch.isspace() else ch)
        out: list[str] = []
        for word in "".join(cleaned).split():
            word = unicodedata.normalize("NFD", word.lower())
            word = "".join(c for c in word if unicodedata.category(c) != "Mn")
            current = []
            for ch in word:
                if _is_punct(ch):
                    if current:
                        out.append("".join(current))
                        current = []
                    out.append(ch)
                else:
                    current.append(ch)
            if current:
                out.append("".join(current))
        return out

    def wordpiece(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk]
        ids: list[int] = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.vocab:
                    piece = self.vocab[sub]
                    break
                end -= 1
            if piece is None:
                return [self.unk]
            ids.append(piece)
            start = end
        return ids

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` without special tokens."""
        ids = [i for word in self.basic_split(text) for i in self.wordpiece(word)]
        return np.asarray(ids, dtype=np.int64)


class ByteTokenizer:
    """UTF-8 bytes shifted by 3 (0 pad, 1 bos, 2 eos): the tiny models' vocabulary."""

    bos, eos, vocab_size = 1, 2, BYTE_VOCAB

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64) + 3
