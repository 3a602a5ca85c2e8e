"""Stop rules and output buffers of the native engine (pure tensor logic)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tlt.backends.base import FinishReason
from tlt.backends.native_state import Emission, Outputs, check_stop


def test_check_stop_cuts_at_eos_and_budget():
    tokens = torch.tensor([[4, 2, 5], [4, 5, 6], [2, 2, 2], [7, 8, 2]])
    counts = torch.tensor([3, 3, 1, 2])  # row 3's EOS lies past its count
    remaining = torch.tensor([5, 2, 4, 9])
    stop = check_stop(tokens, counts, remaining, eos=2)
    assert stop.counts.tolist() == [2, 2, 1, 2]
    assert stop.stopped.tolist() == [True, False, True, False]
    assert stop.finished.tolist() == [True, True, True, False]
    assert check_stop(tokens, counts, remaining, eos=None).stopped.tolist() == [False] * 4


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_check_stop_properties(data):
    B = data.draw(st.integers(1, 4))
    L = data.draw(st.integers(1, 5))
    tokens = torch.tensor(
        data.draw(st.lists(st.lists(st.integers(0, 3), min_size=L, max_size=L), min_size=B, max_size=B))
    )
    counts = torch.tensor(data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B)))
    remaining = torch.tensor(data.draw(st.lists(st.integers(1, 6), min_size=B, max_size=B)))
    stop = check_stop(tokens, counts, remaining, eos=0)
    for b in range(B):
        kept = tokens[b, : stop.counts[b]].tolist()
        assert 1 <= len(kept) <= min(counts[b], remaining[b])
        assert 0 not in kept[:-1]  # nothing is kept after an EOS
        assert stop.stopped[b] == (kept[-1] == 0)
        full = tokens[b, : min(counts[b], remaining[b])].tolist()
        assert len(kept) == len(full) or kept[-1] == 0  # only EOS cuts below the budget
        assert stop.finished[b] == (stop.stopped[b] or len(kept) == remaining[b])


def test_outputs_write_appends_kept_tokens_only():
    out = Outputs.allocate(3, max_new_tokens=4, hidden_size=2, device="cpu")
    seq_ids = torch.tensor([2, 0])
    first = Emission(
        tokens=torch.tensor([[5, 6, 7], [8, 9, 1]]),
        counts=torch.tensor([3, 1]),
        logprobs=torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]]),
        prev_hidden=torch.arange(12.0).view(2, 3, 2),
    )
    out.write(seq_ids, first, check_stop(first.tokens, first.counts, torch.tensor([4, 4]), eos=None))
    second = Emission(torch.tensor([[3, 4], [2, 3]]), torch.tensor([2, 2]), torch.zeros(2, 2), torch.zeros(2, 2, 2))
    out.write(seq_ids, second, check_stop(second.tokens, second.counts, torch.tensor([1, 3]), eos=2))
    rollouts = out.rollouts([torch.tensor([1]), torch.tensor([2]), torch.tensor([3])], n=1)
    assert [r.token_ids.tolist() for r in rollouts] == [[8, 2], [], [5, 6, 7, 3]]
    assert [r.finish_reason for r in rollouts] == [
        FinishReason.STOP,
        FinishReason.LENGTH,
        FinishReason.LENGTH,
    ]
    assert rollouts[2].logprobs.tolist() == [-1.0, -2.0, -3.0, 0.0]
    assert rollouts[0].hidden_states.tolist() == [[6.0, 7.0], [0.0, 0.0]]
