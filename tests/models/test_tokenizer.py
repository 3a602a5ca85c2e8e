import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tlt.models.io import save_hf_folder
from tlt.models.presets import build_model
from tlt.models.tokenizer import train_tokenizer

CORPUS = [
    f"Question: {a} + {b} = ?\nSolution:\n{a} + {b} = {a + b}\nThe answer is \\boxed{{{a + b}}}."
    for a, b in zip(range(0, 300, 7), range(5, 900, 13), strict=False)
]
TOKENIZER = train_tokenizer(CORPUS, vocab_size=320)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_arbitrary_unicode(text):
    nfc = unicodedata.normalize("NFC", text)  # Qwen2's normalizer: text comes back in NFC
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == nfc
    assert TOKENIZER.decode(TOKENIZER.encode(nfc)) == nfc


@pytest.fixture(scope="module")
def loaded_from_model_folder(tmp_path_factory):
    """The tokenizer as `tlt train`, lm-eval and vLLM see it: AutoTokenizer on a saved Qwen2 model folder."""
    folder = tmp_path_factory.mktemp("model")
    save_hf_folder(build_model("test", len(TOKENIZER)), TOKENIZER, folder)
    return AutoTokenizer.from_pretrained(folder)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text() | st.sampled_from(CORPUS))
def test_model_folder_loader_encodes_like_the_trained_tokenizer(loaded_from_model_folder, text):
    assert loaded_from_model_folder.encode(text) == TOKENIZER.encode(text)


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
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(CORPUS, vocab_size=100)
