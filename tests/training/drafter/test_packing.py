"""Sequence packing: first-fit rows, the EAGLE pair shift within documents, no attention across samples."""

import pytest
import torch

from tlt.config import DrafterConfig
from tlt.drafters.eagle import EagleDrafter
from tlt.models.presets import build_model
from tlt.training.drafter.buffer import DrafterSample
from tlt.training.drafter.module import DrafterModule
from tlt.training.drafter.packing import PAD_DOCUMENT, first_fit, pack, pad

D = 2


def _toy(tokens: list[int], num_prompt: int, offset: float) -> DrafterSample:
    T = len(tokens)
    hidden = offset + torch.arange(T * D, dtype=torch.float).view(T, D)
    return DrafterSample(torch.tensor(tokens), hidden, torch.arange(T) >= num_prompt, version=0)


def test_first_fit_decreasing_by_hand():
    assert first_fit([5, 3, 3, 2, 1], 6) == [[0, 4], [1, 2], [3]]
    with pytest.raises(ValueError, match="max_tokens=4"):
        first_fit([3, 5], 4)


def test_first_fit_respects_the_row_length_and_covers_every_sample():
    lengths = [(i * 37) % 50 + 1 for i in range(200)]
    bins = first_fit(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert len(bins) <= -(-sum(lengths) // 64) + 2  # near the lower bound


def test_pack_layout_positions_documents_and_padding():
    samples = [_toy([1, 2, 3], 1, 0), _toy([4, 5, 6, 7, 8], 2, 100), _toy([9, 10], 0, 200)]
    batch = pack(samples, max_tokens=6)  # rows: [doc 1] [doc 0, doc 2] (longest first)
    assert batch.tokens.tolist() == [[4, 5, 6, 7, 8], [1, 2, 3, 9, 10]]
    assert batch.document_ids.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 2, 2]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert batch.loss_mask.tolist() == [[False, False, True, True, True], [False, True, True, True, True]]
    assert batch.hidden[1, 3].tolist() == [200.0, 201.0]
    padded = pad(samples)
    assert padded.tokens.tolist() == [[1, 2, 3, 0, 0], [4, 5, 6, 7, 8], [9, 10, 0, 0, 0]]
    assert padded.document_ids[0].tolist() == [0, 0, 0, PAD_DOCUMENT, PAD_DOCUMENT]
    assert not padded.loss_mask[0, 3:].any() and padded.hidden[0, 3:].abs().sum() == 0
    assert pack(samples).tokens.shape == (2, 5)  # default row length: the longest sample


def test_row_chunks_cover_every_row_each_cut_to_its_longest():
    samples = [_toy([1, 2, 3], 1, 0), _toy([4, 5, 6, 7, 8], 2, 100), _toy([9, 10], 0, 200)]
    padded = pad(samples)  # rows of 3, 5, 2 real tokens, L = 5
    chunks = padded.row_chunks(10)  # 2 rows per chunk
    assert [c.tokens.tolist() for c in chunks] == [[[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], [[9, 10]]]
    assert chunks[1].document_ids.tolist() == [[2, 2]]
    assert sum(c.num_loss_tokens for c in chunks) == padded.num_loss_tokens
    assert len(padded.row_chunks(1)) == 3  # at least one row per chunk


def test_pairs_never_cross_a_document_boundary():
    a, b = _toy([1, 2, 3], 1, 0), _toy([9, 10, 11], 0, 200)
    p = pack([a, b], max_tokens=6).pairs()  # one row: 1 2 3 | 9 10 11
    assert p.tokens.tolist() == [[2, 3, 9, 10, 11]]  # x_{i+1}
    assert p.hidden[0, :, 0].tolist() == [0, 2, 4, 200, 202]  # h_i
    assert p.target[0, :, 0].tolist() == [2, 4, 200, 202, 204]  # h_{i+1}
    assert p.document_ids.tolist() == [[0, 0, 0, 1, 1]] and p.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    # pair 2, (x_0 of b, h_2 of a) -> h_0 of b, would cross the boundary: no loss
    assert p.loss_mask.tolist() == [[True, True, False, True, True]]
    assert pack([a, b], 6).num_loss_tokens == pad([a, b]).num_loss_tokens == 4


@pytest.fixture(scope="module")
def module():
    torch.manual_seed(0)
    target = build_model("test", vocab_size=64)
    drafter = EagleDrafter.from_target(target, seed=0)
    with torch.no_grad():  # a non-trivial head: large random fc weights so features differ between positions
        drafter.head.fc.weight.normal_(0, 0.5)
    return DrafterModule(drafter.head, DrafterConfig(), max_steps=1)


def _random_samples(lengths: list[int], prompts: list[int], seed: int) -> list[DrafterSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for T, P in zip(lengths, prompts, strict=True):
        tokens = torch.randint(3, 64, (T,), generator=g)
        out.append(DrafterSample(tokens, torch.randn(T, 128, generator=g), torch.arange(T) >= P, 0))
    return out


def _outputs(module: DrafterModule, samples: list[DrafterSample], packed: bool) -> list[torch.Tensor]:
    """Per-sample head outputs [T_s - 1, D] of each sample's pairs, from one packed or padded forward."""
    batch = pack(samples) if packed else pad(samples)
    p = batch.pairs()
    with torch.no_grad():
        out = module.head.train_forward(p.tokens, p.hidden, p.position_ids, p.document_ids)  # [B, L - 1, D]
    per_sample = []
    for i, s in enumerate(samples):
        rows, cols = (p.document_ids == i).nonzero(as_tuple=True)
        per_sample.append(out[rows, cols][: s.num_tokens - 1])  # the document's last position is no pair
    return per_sample


LENGTHS, PROMPTS = [9, 4, 13, 6, 3, 11], [3, 1, 5, 0, 1, 4]


def test_packed_loss_is_the_token_weighted_mean_of_per_sample_losses(module):
    samples = _random_samples(LENGTHS, PROMPTS, seed=1)
    with torch.no_grad():
        alone = [module.batch_loss(pad([s])) for s in samples]
        packed = module.batch_loss(pack(samples))
        padded = module.batch_loss(pad(samples))
    counts = torch.tensor([float(pad([s]).num_loss_tokens) for s in samples])
    losses = torch.stack([o.loss for o in alone])
    expected = (losses * counts).sum() / counts.sum()
    assert pack(samples).tokens.shape[0] < len(samples)  # really packed
    torch.testing.assert_close(packed.loss, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded.loss, expected, atol=1e-5, rtol=0)


def test_with_equal_loss_counts_the_packed_loss_is_the_plain_mean(module):
    samples = _random_samples([7, 5, 9, 6], [3, 0, 5, 2], seed=2)
    assert {pad([s]).num_loss_tokens for s in samples} == {4}  # T - max(P, 1)
    with torch.no_grad():
        alone = torch.stack([module.batch_loss(pad([s])).loss for s in samples])
        packed = module.batch_loss(pack(samples)).loss
    torch.testing.assert_close(packed, alone.mean(), atol=1e-5, rtol=0)


def test_packed_outputs_equal_unpacked_ones(module):
    samples = _random_samples(LENGTHS, PROMPTS, seed=3)
    for s, packed, padded in zip(
        samples, _outputs(module, samples, True), _outputs(module, samples, False), strict=True
    ):
        with torch.no_grad():
            alone = module.head.train_forward(s.tokens[None, 1:], s.hidden[None, :-1])[0]
        # features of magnitude ~5: the last float32 bits differ with the CPU's kernels (AMD vs Intel AVX-512)
        torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


def test_changing_one_sample_leaves_the_other_samples_outputs_unchanged(module):
    samples = _random_samples(LENGTHS, PROMPTS, seed=4)
    layout = pack(samples).document_ids
    assert layout[layout[:, 0] == 0, -1].item() == 1  # sample 0 shares a row and precedes sample 1
    before = _outputs(module, samples, packed=True)
    changed = list(samples)
    g = torch.Generator().manual_seed(9)
    s = samples[0]
    changed[0] = DrafterSample(
        torch.randint(3, 64, s.tokens.shape, generator=g),
        torch.randn(s.hidden.shape, generator=g),
        s.loss_mask,
        0,
    )
    assert torch.equal(pack(changed).document_ids, layout)
    after = _outputs(module, changed, packed=True)
    assert not torch.allclose(before[0], after[0])
    for i in range(1, len(samples)):
        assert torch.equal(before[i], after[i])
