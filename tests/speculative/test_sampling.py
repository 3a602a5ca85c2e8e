"""Tests for tlt.speculative.sampling: the sampling distribution shared by plain decoding and SD."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tlt.backends.base import SamplingParams
from tlt.speculative.sampling import probs_from_logits, processed_logits, sample_tokens, token_logprobs

NEG_INF = float("-inf")


def test_temperature_scales_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, -1.0]])
    out = processed_logits(logits, SamplingParams(temperature=0.5))
    assert torch.equal(out, torch.tensor([[2.0, 4.0, -2.0]]))


def test_greedy_is_one_hot_at_lowest_argmax() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.1))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))
    assert probs.dtype == torch.float32


def test_top_k_keeps_exactly_k_lowest_index_on_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    out = processed_logits(logits, SamplingParams(top_k=2))
    assert torch.equal(out, torch.tensor([[NEG_INF, 3.0, 3.0, NEG_INF, NEG_INF]]))


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.45, [0]), (0.55, [0, 1]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_prefix_reaching_mass(top_p: float, kept: list[int]) -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    probs = probs_from_logits(logits, SamplingParams(top_p=top_p))
    assert (probs > 0).nonzero().flatten().tolist() == kept
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    expected = torch.zeros(4)
    expected[kept] = torch.tensor([0.5, 0.3, 0.15, 0.05])[kept] / sum([0.5, 0.3, 0.15, 0.05][i] for i in kept)
    torch.testing.assert_close(probs, expected)


def test_top_p_applies_to_top_k_renormalised_distribution() -> None:
    # top-k 2 leaves {0.5, 0.3} -> {0.625, 0.375}; top_p 0.6 then keeps only the first token.
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    probs = probs_from_logits(logits, SamplingParams(top_k=2, top_p=0.6))
    assert torch.equal(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_processed_logits_batched_leading_dims() -> None:
    logits = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]]])  # [1, 2, 3]
    out = processed_logits(logits, SamplingParams(top_k=1))
    assert torch.equal(out, torch.tensor([[[2.0, NEG_INF, NEG_INF], [NEG_INF, NEG_INF, 2.0]]]))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    V=st.integers(1, 12),
    temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]),
    top_k=st.integers(0, 14),
    top_p=st.floats(0.05, 1.0),
)
def test_kept_set_is_top_k_then_minimal_nucleus(
    seed: int, V: int, temperature: float, top_k: int, top_p: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, V, generator=g) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = probs_from_logits(logits, params)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    k = top_k if 0 < top_k < V else V
    for row, p in zip(logits, probs, strict=True):
        order = torch.sort(row, descending=True, stable=True).indices
        base = torch.softmax(row[order[:k]] / temperature, dim=-1)  # top-k renormalised, descending
        kept = int((p > 0).sum())
        assert 1 <= kept <= k
        assert set((p > 0).nonzero().flatten().tolist()) == set(order[:kept].tolist())
        if top_p < 1.0:
            assert base[:kept].sum() >= top_p - 1e-6  # reaches the mass
            assert base[: kept - 1].sum() < top_p + 1e-6  # and no smaller prefix does
        torch.testing.assert_close(p[order[:kept]], base[:kept] / base[:kept].sum())


def test_sample_tokens_one_hot_and_never_zero_mass() -> None:
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.5]]).repeat(500, 1)
    tokens = sample_tokens(probs, g)
    assert tokens.shape == (1000,)
    assert torch.equal(tokens[0::2], torch.full((500,), 2))
    assert set(tokens[1::2].tolist()) == {0, 2}


def test_sample_tokens_is_deterministic_for_a_seed() -> None:
    probs = torch.softmax(torch.randn(64, 7, generator=torch.Generator().manual_seed(1)), dim=-1)
    a = sample_tokens(probs, torch.Generator().manual_seed(5))
    b = sample_tokens(probs, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_sample_tokens_matches_distribution_chi_square() -> None:
    # Goodness of fit at alpha = 1e-3 with 20000 draws of one fixed distribution.
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    n = 20000
    tokens = sample_tokens(p.expand(n, 5), torch.Generator().manual_seed(7))
    counts = torch.bincount(tokens, minlength=5).double()
    assert stats.chisquare(counts.numpy(), (p.double() * n).numpy()).pvalue > 1e-3


def test_sample_tokens_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sample_tokens(torch.ones(3), None)


def test_token_logprobs_use_temperature_before_truncation() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    tokens = torch.tensor([2])
    params = SamplingParams(temperature=0.5, top_k=1)
    expected = 0.0 / 0.5 - math.log(math.exp(4.0) + math.exp(2.0) + 1.0)
    out = token_logprobs(logits, tokens, params)
    torch.testing.assert_close(out, torch.tensor([expected]))


def test_token_logprobs_greedy_uses_temperature_one() -> None:
    logits = torch.tensor([[[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])  # [1, 2, 3]
    tokens = torch.tensor([[1, 2]])
    out = token_logprobs(logits, tokens, SamplingParams(temperature=0.0))
    torch.testing.assert_close(out, torch.log_softmax(logits, -1)[0, [0, 1], [1, 2]].unsqueeze(0))


def test_token_logprobs_shape_error() -> None:
    with pytest.raises(ValueError, match="vocab dim"):
        token_logprobs(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), SamplingParams())
