"""WordPiece and byte tokenizers."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import SimError
from sim.inference.tokenizer import ByteTokenizer, WordPiece

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "un", "##aff", "##able", "cafe", ",", "!", "runn", "##ing",
         "a", "##b"]


@pytest.fixture
def wp() -> WordPiece:
    return WordPiece({tok: i for i, tok in enumerate(VOCAB)})


def test_greedy_longest_match_with_continuation_pieces(wp):
    assert wp.encode("unaffable").tolist() == [5, 6, 7]
    assert wp.encode("Running").tolist() == [11, 12]


def test_punctuation_accents_case_and_unknown_words(wp):
    assert wp.basic_split("The CAFÉ,unaffable!") == ["the", "cafe", ",", "unaffable", "!"]
    assert wp.encode("the xyz").tolist() == [4, 1]  # a word with no split is [UNK]
    assert wp.encode("abbb").tolist() == [13, 14, 14, 14]
    assert wp.encode("a" * 101).tolist() == [1]


def test_vocabulary_needs_special_tokens(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("hello\nworld\n")
    with pytest.raises(SimError, match="special token"):
        WordPiece.from_file(path)
    with pytest.raises(SimError, match="cannot read"):
        WordPiece.from_file(tmp_path / "missing.txt")


def test_byte_tokenizer_is_utf8_shifted():
    ids = ByteTokenizer().encode("hé")
    assert ids.tolist() == [ord("h") + 3, 0xC3 + 3, 0xA9 + 3]
    assert ids.max() < ByteTokenizer.vocab_size


def test_real_vocabulary_gives_bert_ids(minilm):
    tok = WordPiece.from_file(minilm / "vocab.txt")
    ids = tok.encode("The weather is lovely today.")
    assert np.array_equal(ids, [1996, 4633, 2003, 8403, 2651, 1012])
    assert (tok.cls, tok.sep) == (101, 102)
