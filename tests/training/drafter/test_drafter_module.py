"""The drafter LightningModule trains from a DrafterBuffer (packed or padded), frozen weights untouched."""

import logging

import pytest
import torch

from tlt.config import DrafterConfig
from tlt.drafters.eagle import EagleDrafter
from tlt.models.presets import build_model
from tlt.training.drafter.buffer import DrafterBuffer
from tlt.training.drafter.module import BufferBatches, DrafterModule, fit_drafter
from tlt.training.drafter.packing import PackedBatch


def _buffer(target, seed: int = 0) -> DrafterBuffer:
    """Rollout-like rows (prompt + response of varied lengths) through the target's log-prob forward."""
    g = torch.Generator().manual_seed(seed)
    lengths = [6, 9, 14, 20, 7, 30, 11, 5]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attention, response = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, T in enumerate(lengths):
        ids[b, :T] = torch.randint(3, 64, (T,), generator=g)
        attention[b, :T], response[b, 3:T] = 1, 1
    with torch.no_grad():
        hidden = target(ids, attention_mask=attention, output_hidden_states=True).hidden_states[-1]
    buffer = DrafterBuffer(max_bytes=10**7, seed=seed)
    buffer.add_from_forward(ids, hidden, attention, response, version=0)
    return buffer


@pytest.mark.parametrize("packing", [True, False])
def test_batches_from_the_buffer(packing):
    target = build_model("test", vocab_size=64)
    batches = iter(BufferBatches(_buffer(target), batch_tokens=40, packing=packing))
    batch = next(batches)
    assert isinstance(batch, PackedBatch)
    docs = batch.document_ids.unique()
    assert (docs >= 0).sum() > 1 and sum(int((batch.document_ids == d).sum()) for d in docs if d >= 0) <= 40
    if packing:
        assert batch.tokens.shape[1] == max(int((batch.document_ids == d).sum()) for d in docs if d >= 0)
    else:
        assert batch.tokens.shape[0] == int((docs >= 0).sum())


@pytest.mark.parametrize("packing", [True, False])
def test_fit_trains_the_head_and_leaves_frozen_weights_alone(packing):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.manual_seed(0)
    target = build_model("test", vocab_size=64)  # tied: one tensor is both embedding and LM head
    drafter = EagleDrafter.from_target(target, seed=0)
    frozen = {k: v.clone() for k, v in target.state_dict().items()}
    trainable = {k: v.clone() for k, v in drafter.head.state_dict().items()}
    assert not any(k.startswith(("embed", "lm_head")) for k in trainable)
    cfg = DrafterConfig(lr=1e-2, batch_tokens=48, packing=packing)
    last = fit_drafter(drafter.head, _buffer(target), cfg, max_steps=3, progress=False)
    assert set(last) == {"loss", "top1"} and last["loss"] > 0
    assert all(torch.equal(v, frozen[k]) for k, v in target.state_dict().items())
    assert drafter.head.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()
    assert not drafter.head.embed.requires_grad and not drafter.head.training
    changed = [k for k, v in drafter.head.state_dict().items() if not torch.equal(v, trainable[k])]
    assert "fc.weight" in changed and "layers.0.mlp.down_proj.weight" in changed


def test_bf16_mixed_loss_is_close_to_float32_and_trains_float32_weights():
    torch.manual_seed(0)
    target = build_model("test", vocab_size=64)
    head = EagleDrafter.from_target(target, seed=0).head.train()
    batch = next(iter(BufferBatches(_buffer(target), batch_tokens=64, packing=True)))
    losses = {}
    for precision in ("32-true", "bf16-mixed"):
        module = DrafterModule(head, DrafterConfig(precision=precision), max_steps=1)
        out = module.batch_loss(batch)
        out.loss.backward()
        losses[precision] = out.loss.item()
        assert out.loss.dtype == torch.float32
        assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in head.parameters())
        head.zero_grad(set_to_none=True)
    assert losses["32-true"] != losses["bf16-mixed"]  # bf16 arithmetic ran
    assert losses["bf16-mixed"] == pytest.approx(losses["32-true"], rel=0.02)
