"""EAGLE-1 loss against hand-computed values; a training step never touches the target's embedding / head."""

import math

import pytest
import torch

from tlt.drafters.eagle import EagleDrafter
from tlt.models.presets import build_model
from tlt.training.drafter.loss import EagleLoss

LOG1PE = math.log(1 + math.e)  # log(e^1 + e^0)


def _case():
    """Two positions, D = V = 2, lm_head = identity (logits == features)."""
    pred = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # [1, 2, 2]
    target = torch.tensor([[[0.0, 0.0], [3.0, 0.0]]])
    return pred, target, torch.eye(2)


def test_single_position_by_hand():
    pred, target, head = _case()
    out = EagleLoss()(pred, target, head, torch.tensor([[1, 0]]))
    # SmoothL1 of (1, 0) vs (0, 0): (0.5 * 1^2 + 0) / 2 features
    feature = 0.25
    # softmax(target) = (1/2, 1/2); log_softmax(pred) = (1 - LOG1PE, -LOG1PE)
    token = -(0.5 * (1 - LOG1PE) + 0.5 * -LOG1PE)
    assert out.feature.item() == pytest.approx(feature, abs=1e-6)
    assert out.token.item() == pytest.approx(token, abs=1e-6)
    assert out.loss.item() == pytest.approx(feature + 0.1 * token, abs=1e-6)


def test_two_positions_average_and_weights():
    pred, target, head = _case()
    out = EagleLoss(w_feature=2.0, w_token=0.5)(pred, target, head, torch.tensor([[True, True]]))
    # position 1: |3 - 0| >= 1 -> 3 - 0.5 = 2.5, mean over 2 features 1.25; pred uniform -> CE = log 2
    feature = (0.25 + 1.25) / 2
    token = (-(0.5 * (1 - LOG1PE) + 0.5 * -LOG1PE) + math.log(2)) / 2
    assert out.feature.item() == pytest.approx(feature, abs=1e-6)
    assert out.token.item() == pytest.approx(token, abs=1e-6)
    assert out.loss.item() == pytest.approx(2.0 * feature + 0.5 * token, abs=1e-6)


def test_empty_mask_is_zero_and_gradient_reaches_pred_only():
    pred, target, head = _case()
    pred.requires_grad_(True)
    target.requires_grad_(True)
    assert EagleLoss()(pred, target, head, torch.zeros(1, 2)).loss.item() == 0.0
    EagleLoss()(pred, target, head, torch.tensor([[1, 1]])).loss.backward()
    assert pred.grad.abs().sum() > 0 and target.grad is None


def test_top1_agreement():
    pred = torch.tensor([[[2.0, 0.0], [0.0, 2.0], [5.0, 1.0]]])
    target = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 9.0]]])
    out = EagleLoss()(pred, target, torch.eye(2), torch.tensor([[1, 1, 0]]))
    assert out.top1.item() == pytest.approx(0.5)


def test_negative_weights_are_rejected():
    with pytest.raises(ValueError, match="w_feature"):
        EagleLoss(w_feature=-1.0)


def test_training_step_leaves_the_target_embedding_and_head_unchanged():
    torch.manual_seed(0)
    target = build_model("test", vocab_size=64)  # tied: one tensor is both embedding and LM head
    drafter = EagleDrafter.from_target(target, seed=0)
    head = drafter.head.train()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    trainable = {k: v.clone() for k, v in head.state_dict().items()}
    tokens = torch.randint(3, 64, (2, 8))
    with torch.no_grad():
        hidden = target.model(tokens).last_hidden_state  # [2, 8, D]
    opt = torch.optim.AdamW(head.parameters(), lr=1e-2)
    pred = head.train_forward(tokens[:, 1:], hidden[:, :-1])
    EagleLoss()(pred, hidden[:, 1:], head.lm_head, torch.ones(2, 7)).loss.backward()
    opt.step()
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    assert all(p.grad is None for p in target.parameters())
    assert not any(torch.equal(v, trainable[k]) for k, v in head.state_dict().items())
    assert head.embed.data_ptr() == target.get_input_embeddings().weight.data_ptr()  # still shared
