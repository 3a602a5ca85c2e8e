"""A lean pure-PyTorch forward of HF Qwen2 / Llama causal LMs with a preallocated KV cache and tree attention.

The model holds references to the HF module's weight tensors, so an in-place weight update of the HF model is
seen here at once; on CPU the projections also keep packed copies, remade when a weight's version moves
(`Linear`). One `forward` serves prefill (ragged, right-padded), single-token decode and
tree verification: the Q new tokens of row b are written at cache slots cache_lens[b] .. cache_lens[b] + Q -
1 and attend to the row's cached prefix plus the new tokens under a causal or a given tree (ancestor) mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class KVCache:
    """Preallocated keys/values. Rows are batch slots; slot s of row b holds the token at cache position s."""

    k: torch.Tensor  # [L, B, Hkv, S, Dh]
    v: torch.Tensor  # [L, B, Hkv, S, Dh]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


class Linear:
    """x W^T + b over a weight shared with the HF model, on CPU through a copy in oneDNN's packed layout.

    F.linear on CPU multiplies in the weight's own [out, in] layout, call after call; oneDNN's GEMM wants it in a
    blocked layout, which `torch.ops.mkldnn._reorder_linear_weight` makes once (what torch.compile's CPU freezing
    does to linear weights). One-token inputs (a plain step at one row) keep F.linear's matrix-vector product,
    which was as fast. On a 2-core EPYC (eval/results/packed_tiny/) a target forward over 6 tokens of one row then
    costs 1.09 plain steps instead of 1.56, and plain steps at 4-16 rows 1.2-1.3x less. The results differ from
    F.linear's by float rounding, as F.linear's differ between batch shapes.

    The copy is remade when the weight changes in place, seen by its version counter, which copy_, optimizer
    steps and load_state_dict move; writes through `.data` do not, so they are not seen (NativeEngine's
    update_weights copies in place). Elsewhere (GPU, other dtypes, no oneDNN) it is F.linear on the shared weight.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: bool = True):
        self.weight, self.bias = weight, bias  # [out, in], [out] or None
        self.packed = packed and packable(weight)
        self._copy: torch.Tensor | None = None
        self._version = -1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.packed or x.numel() == x.shape[-1]:  # one token: F.linear's matrix-vector product
            return F.linear(x, self.weight, self.bias)
        if self.weight._version != self._version:
            self._version = self.weight._version
            self._copy = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
        return torch.ops.mkldnn._linear_pointwise(x, self._copy, self.bias, "none", [], "")


class FusedLinear:
    """Projections of the same input (q, k, v; gate, up) as one product: on CPU's packed path, one packed copy of
    their stacked weights, the output split after. Returns the parts' outputs, views of the one output.

    Fewer, wider products: a few percent off a forward of 2-64 tokens on a 2-core EPYC (eval/bench_fused.py,
    docs/results.md), the same results bit for bit there. One-token inputs keep each part's F.linear (a stacked
    matrix-vector product was no faster), and so does every input where a part is not packed. The copy replaces
    the parts' own packed copies and is remade when a part's weight or bias changes in place.
    """

    def __init__(self, parts: list[Linear], stacked: bool = True):
        """stacked: False keeps every part's own product (eval/bench_fused.py compares the two)."""
        self.parts = parts
        self.sizes = [part.weight.shape[0] for part in parts]
        same_bias = len({part.bias is None for part in parts}) == 1
        self.packed = stacked and all(part.packed for part in parts) and same_bias
        self._copy: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._versions: tuple[int, ...] = ()

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self.packed or x.numel() == x.shape[-1]:
            return tuple(part(x) for part in self.parts)
        weight, bias = self._stacked()
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "").split(self.sizes, dim=-1)

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        tensors = [t for part in self.parts for t in (part.weight, part.bias) if t is not None]
        versions = tuple(t._version for t in tensors)
        if versions != self._versions:
            self._versions = versions
            weight = torch.cat([part.weight.detach() for part in self.parts])
            has_bias = self.parts[0].bias is not None
            bias = torch.cat([part.bias.detach() for part in self.parts]) if has_bias else None
            self._copy = (torch.ops.mkldnn._reorder_linear_weight(weight), bias)
        return self._copy


def packable(weight: torch.Tensor) -> bool:
    """Whether `Linear` multiplies by a packed copy of this weight: CPU, float32 or bfloat16, oneDNN built in."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


@dataclass
class LeanLayer:
    """One decoder layer: its norms' weights and its projections (weights shared with the HF layer)."""

    input_norm: torch.Tensor  # [D]
    qkv: FusedLinear  # q [H * Dh, D], k and v [Hkv * Dh, D], biases where the architecture has them (Qwen2)
    o: Linear  # [D, H * Dh]
    post_norm: torch.Tensor  # [D]
    gate_up: FusedLinear  # gate and up [I, D]
    down: Linear  # [D, I]


def _layer_from_hf(layer: torch.nn.Module, packed: bool, stacked: bool) -> LeanLayer:
    attn, mlp = layer.self_attn, layer.mlp
    if getattr(mlp, "gate_proj", None) is None or getattr(mlp.gate_proj, "bias", None) is not None:
        raise ValueError("LeanModel supports SwiGLU MLPs without bias (Qwen2 / Llama); got another MLP layout")

    def linear(module: torch.nn.Linear) -> Linear:
        return Linear(module.weight, module.bias, packed)

    return LeanLayer(
        input_norm=layer.input_layernorm.weight,
        qkv=FusedLinear([linear(attn.q_proj), linear(attn.k_proj), linear(attn.v_proj)], stacked),
        o=linear(attn.o_proj),
        post_norm=layer.post_attention_layernorm.weight,
        gate_up=FusedLinear([linear(mlp.gate_proj), linear(mlp.up_proj)], stacked),
        down=linear(mlp.down_proj),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: normalise in float32, scale by the weight in the input dtype."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op, same math
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = roll(x, Dh / 2) * [-sin1, sin2]."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def attention_mask(cache_lens: torch.Tensor, num_new: int, kv_len: int, tree_mask: torch.Tensor | None) -> torch.Tensor:
    """[B, 1, Q, S] bool: query q of row b sees the row's cached prefix and its allowed new tokens.

    cache_lens: [B]; the new tokens occupy slots cache_lens[b] .. + Q - 1. tree_mask: [B, Q, Q] or None
    (causal). Slots at or beyond cache_lens[b] + Q (stale or other rows' lengths) are never visible.
    """
    device = cache_lens.device
    rel = torch.arange(kv_len, device=device)[None, :] - cache_lens[:, None]  # [B, S] slot - cache_len
    prefix = (rel < 0)[:, None, :]  # [B, 1, S]
    if tree_mask is None:
        query = torch.arange(num_new, device=device)[None, :, None]  # [1, Q, 1]
        new = (rel[:, None, :] >= 0) & (rel[:, None, :] <= query)  # [B, Q, S]
    else:
        index = rel.clamp(0, num_new - 1)[:, None, :].expand(-1, num_new, -1)  # [B, Q, S]
        in_block = ((rel >= 0) & (rel < num_new))[:, None, :]  # [B, 1, S]
        new = tree_mask.gather(2, index) & in_block
    return (prefix | new)[:, None]


class LeanModel:
    """Inference-only forward over an HF Qwen2 / Llama causal LM's weights (shared, not copied)."""

    def __init__(self, model: torch.nn.Module, packed: bool = True, stacked: bool = True):
        """packed: multiply by packed copies of the weights where `Linear` can (CPU); False keeps F.linear.
        stacked: q, k, v and gate, up as one packed product each (`FusedLinear`); False: one per projection."""
        config = model.config
        inner = model.model
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.hidden_size = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        self.max_positions = config.max_position_embeddings
        self.embed = inner.embed_tokens.weight  # [V, D]
        self.final_norm = inner.norm.weight  # [D]
        self.lm_head = Linear(model.lm_head.weight, packed=packed)  # [V, D] (the embedding itself when tied)
        self.layers = [_layer_from_hf(layer, packed, stacked) for layer in inner.layers]
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self._rope_tables(inner.rotary_emb)

    @classmethod
    def from_hf(cls, model: torch.nn.Module, packed: bool = True, stacked: bool = True) -> LeanModel:
        if getattr(model.config, "model_type", None) not in ("qwen2", "llama"):
            raise ValueError(
                f"LeanModel supports Qwen2 and Llama causal LMs, got model_type={model.config.model_type!r}"
            )
        rope = getattr(model.config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") in ("dynamic", "longrope"):
            raise ValueError(f"LeanModel precomputes RoPE tables; rope_type={rope['rope_type']!r} is not supported")
        if getattr(model.config, "use_sliding_window", False):
            raise ValueError("LeanModel does not implement sliding-window attention; set use_sliding_window=False")
        return cls(model, packed, stacked)

    def _rope_tables(self, rotary: torch.nn.Module) -> None:
        """cos/sin tables for every position, computed as HF does (position * inv_freq in float32)."""
        inv_freq = rotary.inv_freq.float()  # [Dh / 2]
        positions = torch.arange(self.max_positions, device=inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]  # [P, Dh / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, Dh]
        self.cos = (emb.cos() * rotary.attention_scaling).to(self.dtype)
        sin = emb.sin() * rotary.attention_scaling
        half = sin.shape[-1] // 2
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(self.dtype)  # [P, Dh]

    def allocate_cache(self, batch: int, max_len: int) -> KVCache:
        if max_len > self.max_positions:
            raise ValueError(f"cache length {max_len} exceeds max_position_embeddings={self.max_positions}")
        shape = (self.num_layers, batch, self.num_kv_heads, max_len, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return KVCache(k=k, v=torch.zeros_like(k))

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        cache_lens: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        kv_len: int | None = None,
        logits_at: torch.Tensor | None = None,
        select: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run Q new tokens per row; returns (hidden [B, Q, D] after the final norm, logits [B, Q, V]).

        tokens, positions: [B, Q] int64; cache_lens: [B] int64 tokens already cached per row; tree_mask:
        [B, Q, Q] bool ancestor mask (None = causal). kv_len: an upper bound on max(cache_lens) + Q known to
        the caller (saves a host sync); defaults to computing it. The cache must have room for cache_lens + Q.
        logits_at: [B, M] query indices; when given, logits are computed only there ([B, M, V]), e.g. the last
        prompt token of a prefill.
        select: [T] indices into the flattened [B * Q] new tokens; when given, only those are computed (the
        projections and MLPs run on T packed tokens, K/V are written for them only) and the other positions of
        hidden and logits are 0: ragged drafts, whose filler no selected token may attend to (not with
        logits_at).
        """
        B, Q = tokens.shape
        if kv_len is None:
            kv_len = int(cache_lens.max()) + Q
        if kv_len > cache.max_len:
            raise ValueError(f"forward needs {kv_len} cache slots but the cache holds {cache.max_len}")
        mask = attention_mask(cache_lens, Q, kv_len, tree_mask)  # [B, 1, Q, S]
        cos, sin = self.cos[positions][:, :, None], self.signed_sin[positions][:, :, None]  # [B, Q, 1, Dh]
        rows = torch.arange(B, device=tokens.device)[:, None].expand(B, Q)  # [B, Q]
        slots = cache_lens[:, None] + torch.arange(Q, device=tokens.device)[None, :]  # [B, Q]
        where, ragged = (rows, slots), None
        if select is not None:  # every per-token tensor packed to [T, ...]
            tokens, cos, sin, rows, slots = (t.flatten(0, 1)[select] for t in (tokens, cos, sin, rows, slots))
            where, ragged = (rows, slots), (B, Q)
        x = F.embedding(tokens, self.embed)  # [B, Q, D] or [T, D]
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, self.eps)
            attn = self._attention(h, layer, cache.k[i], cache.v[i], where, (cos, sin), mask, select, ragged)
            x = x + layer.o(attn)
            h = rms_norm(x, layer.post_norm, self.eps)
            gate, up = layer.gate_up(h)
            x = x + layer.down(F.silu(gate) * up)
        hidden = rms_norm(x, self.final_norm, self.eps)
        if select is not None:
            return _unpack(hidden, select, B, Q), _unpack(self.lm_head(hidden), select, B, Q)
        if logits_at is None:
            return hidden, self.lm_head(hidden)
        picked = hidden.gather(1, logits_at[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [B, M, D]
        return hidden, self.lm_head(picked)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of final-norm hidden states [..., D]."""
        return self.lm_head(hidden)

    def _attention(self, h, layer: LeanLayer, k_cache, v_cache, where, rope, mask, select, ragged) -> torch.Tensor:
        """GQA attention of h [B, Q, D] (or [T, D] packed by `select`, then `ragged` = (B, Q)); writes the new K/V
        into the caches [B, Hkv, S, Dh] at `where`."""
        tokens = h.shape[:-1]  # (B, Q) or (T,)
        rows, slots = where
        cos, sin = rope
        q, k, v = layer.qkv(h)
        q = q.view(*tokens, self.num_heads, self.head_dim)
        k = k.view(*tokens, self.num_kv_heads, self.head_dim)
        v = v.view(*tokens, self.num_kv_heads, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_cache[rows, :, slots] = k  # indexed view is [B, Q, Hkv, Dh] (or [T, Hkv, Dh])
        v_cache[rows, :, slots] = v
        B, Q = tokens if ragged is None else ragged
        if ragged is not None:
            q = _unpack(q, select, B, Q)
        S = mask.shape[-1]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, H, Q, Dh]
            k_cache[:, :, :S],
            v_cache[:, :, :S],
            attn_mask=mask,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, Q, Dh]
        out = out.transpose(1, 2).reshape(B, Q, self.num_heads * self.head_dim)
        return out if ragged is None else out.flatten(0, 1)[select]


def _unpack(packed: torch.Tensor, select: torch.Tensor, B: int, Q: int) -> torch.Tensor:
    """[T, ...] packed by `select` -> [B, Q, ...], zeros elsewhere."""
    full = packed.new_zeros(B * Q, *packed.shape[1:])
    return full.index_copy_(0, select, packed).view(B, Q, *packed.shape[1:])


def compact(cache: KVCache, rows: torch.Tensor, kv_len: int | None = None) -> KVCache:
    """Keep cache rows `rows` ([B'] int64, in this order) as rows 0..B'-1, reusing the same storage.

    Rows may repeat (to fork a prompt's cache into n samples) when B' <= B; kv_len limits the copy to the
    used slots.
    """
    B2 = rows.shape[0]
    if B2 > cache.batch:
        raise ValueError(f"compact to {B2} rows needs a cache with at least that many rows, has {cache.batch}")
    S = cache.max_len if kv_len is None else kv_len
    cache.k[:, :B2, :, :S] = cache.k[:, rows, :, :S]  # the right side is gathered into a temporary first
    cache.v[:, :B2, :, :S] = cache.v[:, rows, :, :S]
    return KVCache(k=cache.k[:, :B2], v=cache.v[:, :B2])


def commit_path(cache: KVCache, cache_lens: torch.Tensor, path: torch.Tensor) -> None:
    """Move the K/V of accepted tree nodes to contiguous slots after verification.

    The tree's nodes were written at slots cache_lens[b] + node. path: [B, K + 1] node indices of the
    accepted path (root first, increasing, -1 padded). Afterwards path node i of row b sits at slot
    cache_lens[b] + i.
    """
    B, width = path.shape
    steps = torch.arange(width, device=path.device)[None, :]  # [1, K + 1]
    src = cache_lens[:, None] + torch.where(path >= 0, path, steps)  # padding copies a slot onto itself
    dst = cache_lens[:, None] + steps  # [B, K + 1]
    rows = torch.arange(B, device=path.device)[:, None]
    for buffer in (cache.k, cache.v):
        buffer[:, rows, :, dst] = buffer[:, rows, :, src]  # indexed view is [B, K + 1, L, Hkv, Dh]
