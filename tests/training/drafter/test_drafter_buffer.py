"""DrafterBuffer: byte bound and eviction order, seeded recency-weighted sampling, un-padding, checkpoints."""

import io

import pytest
import torch
from scipy.stats import chisquare

from tlt.models.presets import build_model
from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample

D = 4
BYTES_PER_TOKEN = 8 + 4 * D + 1  # int64 token + float32 [D] feature + bool mask


def _sample(T: int, version: int = 0, fill: float = 0.0) -> DrafterSample:
    return DrafterSample(torch.arange(T), torch.full((T, D), float(fill)), torch.arange(T) >= 1, version)


def _fills(buffer: DrafterBuffer) -> list[float]:
    return _fills_of(buffer.samples)


def test_nbytes_counts_every_tensor():
    assert _sample(10).nbytes == 10 * BYTES_PER_TOKEN
    buffer = DrafterBuffer(max_bytes=10**6)
    buffer.add([_sample(10), _sample(3)])
    assert buffer.nbytes == 13 * BYTES_PER_TOKEN and len(buffer) == 2


def test_byte_bound_evicts_oldest_first():
    buffer = DrafterBuffer(max_bytes=30 * BYTES_PER_TOKEN)
    for i, T in enumerate([10, 10, 5, 5, 10]):  # 40 tokens in all
        buffer.add([_sample(T, fill=i)])
    # the first 10-token sample had to go; 30 tokens remain
    assert _fills(buffer) == [1, 2, 3, 4] and buffer.nbytes == 30 * BYTES_PER_TOKEN
    buffer.add([_sample(12, fill=5)])  # 42 tokens: drop 1 (10) and 2 (5) -> 27
    assert _fills(buffer) == [3, 4, 5] and buffer.nbytes == 27 * BYTES_PER_TOKEN


def test_a_sample_larger_than_the_bound_is_rejected_and_nothing_is_added():
    buffer = DrafterBuffer(max_bytes=10 * BYTES_PER_TOKEN)
    with pytest.raises(ValueError, match="max_bytes"):
        buffer.add([_sample(2), _sample(11)])
    assert len(buffer) == 0 and buffer.nbytes == 0


def test_long_samples_of_the_previous_version_are_evicted_last():
    buffer = DrafterBuffer(max_bytes=30 * BYTES_PER_TOKEN, long_tokens=8)
    buffer.add([_sample(8, version=1, fill=0), _sample(4, version=0, fill=1), _sample(4, version=1, fill=2)])
    buffer.add([_sample(4, version=1, fill=3), _sample(12, version=2, fill=4)])  # 32 tokens
    # oldest first would drop the long version-1 sample; the one-step offset keeps it, the v0 sample goes
    assert _fills(buffer) == [0, 2, 3, 4]
    buffer.add([_sample(10, version=2, fill=5)])  # 38 tokens: short v1 samples go before the long one
    assert _fills(buffer) == [0, 4, 5]


def test_stored_samples_are_copies():
    x = _sample(5)
    buffer = DrafterBuffer(max_bytes=10**6)
    buffer.add([x])
    x.hidden += 1
    x.tokens[0] = 99
    assert buffer.samples[0].hidden.sum() == 0 and buffer.samples[0].tokens[0] == 0


def test_sampling_is_seeded_and_respects_the_token_budget():
    def draws(seed):
        buffer = DrafterBuffer(max_bytes=10**6, seed=seed)
        buffer.add([_sample(2 + i % 7, fill=i) for i in range(40)])
        return [[s.hidden[0, 0].item() for s in buffer.sample(20)] for _ in range(5)]

    first = draws(seed=3)
    assert first == draws(seed=3) and first != draws(seed=4)
    for batch in first:
        assert len(set(batch)) == len(batch)  # without replacement
        assert sum(2 + int(i) % 7 for i in batch) <= 20


def test_one_oversized_sample_is_drawn_alone():
    buffer = DrafterBuffer(max_bytes=10**6)
    buffer.add([_sample(50)])
    assert [s.num_tokens for s in buffer.sample(8)] == [50]


def test_sampling_is_recency_weighted_with_the_one_step_offset():
    """First draws follow w = decay ** age, long previous-version samples at 1 (chi-square, alpha 1e-3)."""
    decay = 0.5
    buffer = DrafterBuffer(max_bytes=10**6, decay=decay, long_tokens=4, seed=0)
    groups = {  # (version, tokens): count
        (0, 2): 10,
        (1, 2): 10,
        (1, 4): 5,  # long samples of the previous version: the one-step offset
        (2, 2): 10,
        (0, 4): 5,  # long, but two versions old: decays as usual
    }
    for (version, T), n in groups.items():
        buffer.add([_sample(T, version=version) for _ in range(n)])
    weight = {(0, 2): 0.25, (1, 2): 0.5, (1, 4): 1.0, (2, 2): 1.0, (0, 4): 0.25}
    torch.testing.assert_close(
        buffer.weights(), torch.tensor([weight[(s.version, s.num_tokens)] for s in buffer.samples]).double()
    )
    draws = 4000
    counts = dict.fromkeys(groups, 0)
    for _ in range(draws):
        (s,) = buffer.sample(1)  # the budget admits only the first draw
        counts[(s.version, s.num_tokens)] += 1
    total = sum(n * weight[g] for g, n in groups.items())
    expected = [draws * n * weight[g] / total for g, n in groups.items()]
    assert chisquare(list(counts.values()), expected).pvalue > 1e-3
    # an explicit current version ages everything by one more step
    assert buffer.weights(current_version=3).max().item() == decay


def _padded(rows: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(map(len, rows))
    ids, mask = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        where = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
        ids[b, where], mask[b, where] = torch.tensor(r), 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_add_from_forward_unpads_in_alignment_with_an_unpadded_forward(side):
    torch.manual_seed(0)
    model = build_model("test", vocab_size=64).eval()
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [20, 21, 22, 23, 24]]
    num_prompt = [3, 1, 2]
    ids, attention = _padded(rows, side)
    response = torch.zeros_like(ids)
    for b, (r, P) in enumerate(zip(rows, num_prompt, strict=True)):
        start = 0 if side == "right" else ids.shape[1] - len(r)
        response[b, start + P : start + len(r)] = 1
    with torch.no_grad():  # the trainer's log-prob forward
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        out = model(ids, attention_mask=attention, position_ids=position_ids, output_hidden_states=True)
    buffer = DrafterBuffer(max_bytes=10**6)
    assert buffer.add_from_forward(ids, out.hidden_states[-1], attention, response, version=7) == 3
    for s, r, P in zip(buffer.samples, rows, num_prompt, strict=True):
        with torch.no_grad():
            alone = model(torch.tensor([r]), output_hidden_states=True).hidden_states[-1][0]  # [T, D]
        assert s.tokens.tolist() == r and s.version == 7
        assert s.loss_mask.tolist() == [False] * P + [True] * (len(r) - P)
        torch.testing.assert_close(s.hidden, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_add_from_forward_keeps_each_feature_with_its_token(side):
    rows = [[3, 4, 5, 6], [7, 8]]
    ids, attention = _padded(rows, side)
    hidden = ids[:, :, None].float().expand(-1, -1, D)  # h_t encodes x_t: alignment is exact
    buffer = DrafterBuffer(max_bytes=10**6)
    buffer.add_from_forward(ids, hidden, attention, attention, version=0)
    for s, r in zip(buffer.samples, rows, strict=True):
        assert s.tokens.tolist() == r and s.hidden[:, 0].tolist() == [float(t) for t in r]


def test_rows_without_a_trainable_pair_are_skipped():
    ids, attention = _padded([[3, 4, 5], [6, 7, 8]], "right")
    response = torch.tensor([[0, 0, 0], [1, 0, 0]])  # no response token after the first position
    buffer = DrafterBuffer(max_bytes=10**6)
    assert buffer.add_from_forward(ids, torch.zeros(2, 3, D), attention, response, version=0) == 0
    assert len(buffer) == 0


def test_state_dict_round_trip_restores_samples_and_the_sampling_stream():
    buffer = DrafterBuffer(max_bytes=10**6, seed=5)
    buffer.add([_sample(2 + i % 5, version=i % 3, fill=i) for i in range(20)])
    buffer.sample(10)
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    restored = DrafterBuffer(max_bytes=10**6, seed=123)
    restored.load_state_dict(torch.load(blob))
    assert _fills(restored) == _fills(buffer) and restored.nbytes == buffer.nbytes
    assert [s.version for s in restored.samples] == [s.version for s in buffer.samples]
    assert all(torch.equal(a.loss_mask, b.loss_mask) for a, b in zip(restored.samples, buffer.samples, strict=True))
    for _ in range(3):  # both sampling streams continue identically
        assert _fills_of(restored.sample(10)) == _fills_of(buffer.sample(10))


def _fills_of(samples: list[DrafterSample]) -> list[float]:
    return [s.hidden[0, 0].item() for s in samples]
