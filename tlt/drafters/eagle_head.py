"""The EAGLE draft head: fc(concat(embed(x_{i+1}), h_i)) -> one decoder layer -> predicted feature h'_{i+1}.

EAGLE-1 (https://arxiv.org/abs/2401.15077) layout: the head predicts the target's last-layer feature
*after* the target's final norm (our LeanModel / HF `last_hidden_state`), so logits are
`F.linear(h', lm_head)` with the target's head and no norm of its own. As in EAGLE-1 the single layer has no
input norm (its input is the fc output). The target's embedding and LM head are shared by reference as
non-persistent buffers (frozen, never in `state_dict()`, never trained). Parameter names follow HF (`fc`,
`layers.0.self_attn.q_proj`, ...) and the fc has no bias: the layout vLLM / SGLang EAGLE-1 checkpoints use
(`tlt.drafters.export`). One `forward` serves
training ([B, T] batches, optionally packed) and drafting (new queries written into a caller-owned KV cache
under a given mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tlt.models.lean import apply_rope


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int  # D, must equal the target's
    vocab_size: int  # V, must equal the target's
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    attention_bias: bool = True  # q/k/v biases (Qwen2 has them, Llama does not)

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "vocab_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EagleConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"EagleConfig.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"EagleConfig.head_dim must be even (RoPE), got {self.head_dim}")

    @classmethod
    def from_target(cls, config) -> EagleConfig:
        """Shapes of the target's own decoder layer (an HF Qwen2 / Llama config)."""
        rope = getattr(config, "rope_parameters", None) or {}
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            max_position_embeddings=config.max_position_embeddings,
            attention_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        )


class EagleAttention(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        D, H, Hkv, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(D, H * Dh, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(D, Hkv * Dh, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(D, Hkv * Dh, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, Dh

    def forward(self, x, rope, mask, cache=None) -> torch.Tensor:
        """x: [B, Q, D]; rope: (cos, signed_sin) [B, Q, 1, Dh]; mask: [B, 1, Q, S] bool.

        cache: None (attend over the Q new tokens, S = Q) or (k, v, rows, slots): k/v [B, Hkv, S_max, Dh]
        buffers, the new K/V are written at [rows, :, slots] ([B, Q] indices) and the first S slots attended.
        """
        B, Q, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, Q, self.num_heads, self.head_dim), *rope)
        k = apply_rope(self.k_proj(x).view(B, Q, self.num_kv_heads, self.head_dim), *rope)
        v = self.v_proj(x).view(B, Q, self.num_kv_heads, self.head_dim)
        if cache is None:
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, Q, Dh]
        else:
            k_cache, v_cache, rows, slots = cache
            k_cache[rows, :, slots] = k  # indexed view is [B, Q, Hkv, Dh]
            v_cache[rows, :, slots] = v
            S = mask.shape[-1]
            k, v = k_cache[:, :, :S], v_cache[:, :, :S]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
        )  # [B, H, Q, Dh]
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class EagleMLP(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EagleLayer(nn.Module):
    """A Qwen2 / Llama decoder layer without the input norm (EAGLE-1's first layer)."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.self_attn = EagleAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = EagleMLP(cfg)

    def forward(self, x, rope, mask, cache=None) -> torch.Tensor:
        x = x + self.self_attn(x, rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """The trainable head plus the target's shared (frozen) embedding and LM head."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)  # as vLLM's / SGLang's EAGLE-1
        self.layers = nn.ModuleList([EagleLayer(cfg)])
        self.register_buffer("embed", None, persistent=False)  # [V, D] the target's, shared
        self.register_buffer("lm_head", None, persistent=False)  # [V, D] the target's, shared
        cos, signed_sin = _rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)  # [P, Dh]
        self.register_buffer("signed_sin", signed_sin, persistent=False)  # [P, Dh]

    def share(self, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        """Use the target's embedding / LM head tensors (detached views: same storage, no gradient)."""
        self.embed = embed.detach()
        self.lm_head = lm_head.detach()

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of predicted (post-final-norm) features [..., D]."""
        return F.linear(feature, self.lm_head)

    def forward(self, tokens, hidden, positions, mask, cache=None) -> torch.Tensor:
        """Predicted features [B, Q, D] of pairs (hidden[:, i], tokens[:, i]).

        tokens: [B, Q] int64 x_{i+1}; hidden: [B, Q, D] target feature h_i; positions: [B, Q] RoPE positions;
        mask: [B, 1, Q, S] bool (True = attend); cache: see EagleAttention.forward.
        """
        if self.embed is None:
            raise RuntimeError("EagleHead has no embedding: bind the drafter to its target first")
        x = self.fc(torch.cat([F.embedding(tokens, self.embed), hidden.to(self.embed.dtype)], dim=-1))
        rope = (self.cos[positions][:, :, None], self.signed_sin[positions][:, :, None])  # [B, Q, 1, Dh]
        for layer in self.layers:
            x = layer(x, rope, mask, cache)
        return x

    def train_forward(self, tokens, hidden, position_ids=None, document_ids=None) -> torch.Tensor:
        """Training forward over a [B, T] batch, causal within each document; returns [B, T, D].

        position_ids: [B, T] (default 0..T-1); document_ids: [B, T] int, tokens attend only within their
        document (sequence packing; padding may get its own id). Every token sees itself, so no query row
        is empty.
        """
        B, T = tokens.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=tokens.device).expand(B, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()[None]  # [1, T, T]
        if document_ids is not None:
            mask = mask & (document_ids[:, :, None] == document_ids[:, None, :])  # [B, T, T]
        return self(tokens, hidden, position_ids, mask[:, None].expand(B, 1, T, T))


def _rope_tables(cfg: EagleConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """HF default RoPE: cos and [-sin1, sin2] tables [P, Dh] for every position."""
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    freqs = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, Dh]
    sin, half = emb.sin(), cfg.head_dim // 2
    return emb.cos(), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
