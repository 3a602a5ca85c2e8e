"""The EAGLE-1 drafter loss, shared by offline distillation and online (spot) training."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterLossOutput:
    loss: torch.Tensor  # [] w_feature * feature + w_token * token
    feature: torch.Tensor  # [] masked mean SmoothL1 of the features
    token: torch.Tensor  # [] masked mean soft cross-entropy
    top1: torch.Tensor  # [] masked fraction where argmax(head(h_pred)) == argmax(head(h_target)) (no gradient)


class EagleLoss(nn.Module):
    """EAGLE-1 loss (Li et al., 2024, https://arxiv.org/abs/2401.15077, eq. 3-5; TLT uses the same weights).

    loss = w_feature * SmoothL1(h_pred, h_target)
         + w_token * CE(softmax(head(h_target)), log_softmax(head(h_pred)))

    SmoothL1 (beta 1) is averaged over the D features of a position; the cross-entropy is summed over the
    vocabulary; both are averaged over the positions where `mask` is set (EAGLE-1 divides by
    mask.sum() + 1e-5, we divide by max(mask.sum(), 1) so an empty mask gives 0). The target distribution
    carries no gradient.
    """

    def __init__(self, w_feature: float = 1.0, w_token: float = 0.1):
        super().__init__()
        if w_feature < 0 or w_token < 0:
            raise ValueError(f"loss weights must be >= 0, got w_feature={w_feature}, w_token={w_token}")
        self.w_feature, self.w_token = w_feature, w_token

    def forward(
        self, pred: torch.Tensor, target: torch.Tensor, lm_head: torch.Tensor, mask: torch.Tensor
    ) -> DrafterLossOutput:
        """pred, target: [B, T, D] predicted / true post-norm features; lm_head: [V, D]; mask: [B, T].

        Returns a DrafterLossOutput of scalars.
        """
        mask = mask.to(pred.dtype)
        count = mask.sum().clamp(min=1.0)
        feature = F.smooth_l1_loss(pred, target.detach(), reduction="none").mean(-1)  # [B, T]
        target_logits = F.linear(target.detach(), lm_head)  # [B, T, V]
        pred_logp = torch.log_softmax(F.linear(pred, lm_head).float(), dim=-1)  # [B, T, V]
        target_p = torch.softmax(target_logits.float(), dim=-1)
        token = -(target_p * pred_logp).sum(-1)  # [B, T]
        feature_loss = (feature * mask).sum() / count
        token_loss = (token * mask).sum() / count
        with torch.no_grad():
            top1 = ((pred_logp.argmax(-1) == target_logits.argmax(-1)).to(pred.dtype) * mask).sum() / count
        return DrafterLossOutput(
            loss=self.w_feature * feature_loss + self.w_token * token_loss,
            feature=feature_loss,
            token=token_loss,
            top1=top1,
        )
