from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tlt.models.tokenizer import train_tokenizer

CORPUS = [
    f"Question: {a} + {b} = ?\nSolution:\n{a} + {b} = {a + b}\nThe answer is \\boxed{{{a + b}}}."
    for a, b in zip(range(0, 300, 7), range(5, 900, 13), strict=False)
]
TOKENIZER = train_tokenizer(CORPUS, vocab_size=320)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_arbitrary_unicode(text):
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


def test_digits_are_single_tokens():
    pieces = TOKENIZER.tokenize("12345 + 678")
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("12345678")


def test_special_tokens_and_save_load(tmp_path):
    assert (TOKENIZER.pad_token_id, TOKENIZER.bos_token_id, TOKENIZER.eos_token_id) == (0, 1, 2)
    TOKENIZER.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Question: ∑ \\frac{1}{2} 🙂\x00"
    assert loaded.encode(text) == TOKENIZER.encode(text)
    assert loaded.eos_token_id == 2


def test_vocab_too_small_is_rejected():
    import pytest

    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CORPUS, vocab_size=100)
