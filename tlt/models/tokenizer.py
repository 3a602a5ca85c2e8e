"""A small byte-level BPE tokenizer trained on the task corpus.

Byte-level, so any text (unicode, LaTeX, binary junk) encodes; digits are split one per token so arithmetic is
learnable by tiny models. Saved as a Hugging Face folder that `AutoTokenizer.from_pretrained` loads.

The normalizer and pre-tokenizer are exactly Qwen2's (NFC; one digit a piece; a space before a digit is a piece
of its own). transformers builds `Qwen2Tokenizer` for any folder whose config says `model_type: qwen2` and
installs those rules over whatever tokenizer.json holds, so a tokenizer trained with other rules would encode
differently once saved next to the model: in `tlt train`, in lm-eval and in vLLM. With Qwen2's rules the
tokenizer in memory, the saved one and every loader agree token for token.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE with Qwen2's normalizer and pre-tokenizer (digits split one by one) on `texts`."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (all bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, clean_up_tokenization_spaces=False
    )
