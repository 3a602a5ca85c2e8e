import torch

from tlt.training.sft import SFTExample, collate, length_grouped_batches


def test_collate_masks_prompt_and_padding():
    batch = [SFTExample(torch.tensor([5, 6, 7, 2]), 2), SFTExample(torch.tensor([8, 9, 2]), 1)]
    out = collate(batch, pad_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7, 2], [8, 9, 2, 0]]
    assert out["labels"].tolist() == [[-100, -100, 7, 2], [-100, 9, 2, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_length_grouped_batches_cover_everything_once_and_are_seeded():
    lengths = [(i * 37) % 101 for i in range(500)]
    a = length_grouped_batches(lengths, batch_size=16, seed=3, group=4)
    assert sorted(i for b in a for i in b) == list(range(500))
    assert a == length_grouped_batches(lengths, batch_size=16, seed=3, group=4)
    assert a != length_grouped_batches(lengths, batch_size=16, seed=4, group=4)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in a) / len(a)
    assert spread < 30  # sorted inside groups: little padding (random batches spread ~90)
