"""An independent small causal LM as the drafter (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192).

It shares the target's tokenizer (same vocabulary) but nothing else, and runs the lean forward with its own
KV cache. topk == 1 drafts a greedy chain; topk > 1 an EAGLE-2 style beam tree
(https://arxiv.org/abs/2406.16858): each level expands the topk best nodes of the previous level (by
cumulative draft log-prob) with topk children each, and the best verify_tokens - 1 of all drafted nodes form
the tree. Deviation from EAGLE-2: each level re-runs all earlier beam nodes in one forward under a tree mask
(the lean forward shows a query the whole cached prefix, so earlier levels cannot stay cached); cheap for the
small drafters and trees used here.

Cache bookkeeping: row b's cache holds valid K/V for its first cached[b] committed tokens. `propose` first
runs the rest of the committed tokens (those appended since, root included), then drafts in the slots after
the committed ones; speculative K/V are never counted as cached, so the next propose overwrites them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel

from tlt.drafters import read_drafter_json, save_folder
from tlt.drafters.base import Drafter, DrafterMismatchError
from tlt.models.lean import KVCache, LeanModel, compact
from tlt.models.presets import build_model
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree


class SmallLMDrafter(Drafter):
    kind = "small_lm"
    uses_target_hidden = False

    def __init__(self, model: PreTrainedModel):
        self.model = model.eval()
        self.lean = LeanModel.from_hf(self.model)
        self.history: list[list[int]] = []  # committed tokens per row
        self.cached: list[int] = []  # leading committed tokens with valid K/V per row
        self.cache: KVCache | None = None

    @classmethod
    def from_config(cls, cfg, target: torch.nn.Module, seed: int = 0) -> SmallLMDrafter:
        return cls.from_preset(cfg.small_lm_preset, target.config.vocab_size, seed)

    @classmethod
    def from_preset(cls, preset: str, vocab_size: int, seed: int = 0) -> SmallLMDrafter:
        return cls(build_model(preset, vocab_size, seed=seed))

    @property
    def device(self) -> torch.device:
        return self.lean.device

    def bind(self, target: torch.nn.Module) -> None:
        vocab = target.config.vocab_size
        if self.lean.vocab_size != vocab:
            raise DrafterMismatchError(
                f"small_lm drafter has vocab_size={self.lean.vocab_size} but the target has "
                f"vocab_size={vocab}; a draft model must use the target's tokenizer"
            )
        device = next(target.parameters()).device
        if device != self.lean.device:
            self.model.to(device)
            self.lean = LeanModel.from_hf(self.model)
            self.cache = None

    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        self.history = [p[:n] for p, n in zip(tokens.tolist(), lengths.tolist(), strict=True)]
        self.cached = [0] * len(self.history)
        self.cache = None

    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        for row, new, n in zip(self.history, tokens.tolist(), counts.tolist(), strict=True):
            row.extend(new[:n])

    @torch.inference_mode()
    def keep(self, rows: torch.Tensor) -> None:
        kept = rows.tolist()
        self.history = [self.history[r] for r in kept]
        self.cached = [self.cached[r] for r in kept]
        if self.cache is not None:
            self.cache = compact(self.cache, rows.to(self.device), kv_len=max(self.cached, default=0))

    @torch.inference_mode()
    def propose(self, strategy: SpecStrategy) -> DraftTree:
        chain = strategy.topk == 1
        logp = self._catch_up(strategy.steps if chain else strategy.steps * strategy.topk)  # [B, V]
        committed = torch.tensor([len(h) for h in self.history], device=self.device)  # [B]
        root = torch.tensor([h[-1] for h in self.history], device=self.device)[:, None]  # [B, 1]
        if chain:  # verify_tokens may cut the chain short of steps
            drafts = self._chain(logp, committed, strategy.num_draft_tokens)  # [B, N - 1]
            return DraftTree.chain(torch.cat([root, drafts], dim=1))
        tokens, parents = self._beam_tree(logp, committed, strategy)
        no_parent = torch.full_like(root, -1)  # [B, 1]
        return DraftTree(torch.cat([root, tokens], dim=1), torch.cat([no_parent, parents], dim=1))

    def _catch_up(self, draft_slots: int) -> torch.Tensor:
        """Run each row's uncached committed tokens (root included); [B, V] draft log-probs after the root."""
        tails = [h[c:] for h, c in zip(self.history, self.cached, strict=True)]
        Q = max(len(t) for t in tails)
        padded = [t + [0] * (Q - len(t)) for t in tails]
        tokens = torch.tensor(padded, device=self.device)  # [B, Q] right-padded
        cache_lens = torch.tensor(self.cached, device=self.device)  # [B]
        last = torch.tensor([len(t) - 1 for t in tails], device=self.device)[:, None]  # [B, 1]
        kv_len = max(self.cached) + Q
        self._reserve(max(kv_len, max(len(h) for h in self.history) + draft_slots))
        positions = self._positions(cache_lens[:, None] + torch.arange(Q, device=self.device))  # [B, Q]
        _, logits = self.lean.forward(tokens, positions, self.cache, cache_lens, None, kv_len, last)
        self.cached = [len(h) - 1 for h in self.history]  # the root is re-run next time: idempotent propose
        return logits[:, 0].float().log_softmax(dim=-1)

    def _chain(self, logp: torch.Tensor, committed: torch.Tensor, steps: int) -> torch.Tensor:
        """[B, K] greedy draft: one single-token forward per level after the first."""
        token = logp.argmax(dim=-1)  # [B]
        drafts = [token]
        max_committed = int(committed.max())
        for k in range(1, steps):
            slot = committed + k - 1  # draft k goes after the committed tokens and drafts 1..k-1
            _, logits = self.lean.forward(
                token[:, None], self._positions(slot[:, None]), self.cache, slot, kv_len=max_committed + k
            )  # [B, 1, V]
            token = logits[:, 0].argmax(dim=-1)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _beam_tree(
        self, logp: torch.Tensor, committed: torch.Tensor, strategy: SpecStrategy
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """EAGLE-2 beam draft; returns (tokens [B, N - 1], parents [B, N - 1]) of the non-root nodes."""
        K, B = strategy.topk, logp.shape[0]
        score, token = logp.topk(K, dim=-1)  # [B, K] each, best first
        beam = _Beam.first(token, score)
        candidates = _Candidates(token, score, torch.full_like(token, -1))
        for _ in range(1, min(strategy.steps, strategy.num_draft_tokens)):  # deeper levels could not be kept
            child_logp = self._beam_logp(beam, committed)  # [B, K, V]
            child_score, child_token = (beam.score[:, :, None] + child_logp).topk(K, dim=-1)  # [B, K, K]
            parent = beam.candidate[:, :, None].expand(B, K, K)  # [B, K, K] candidate index of each parent
            offset = candidates.size
            candidates.add(child_token.flatten(1), child_score.flatten(1), parent.flatten(1))
            beam = beam.extend(child_token.flatten(1), child_score.flatten(1), offset)
        return candidates.best_tree(strategy.num_draft_tokens)

    def _beam_logp(self, beam: _Beam, committed: torch.Tensor) -> torch.Tensor:
        """[B, K, V] draft log-probs after each node of the beam's last level (all beam nodes re-run)."""
        B, Q = beam.tokens.shape
        K = beam.score.shape[1]
        positions = self._positions(committed[:, None] - 1 + beam.depths[None, :])  # [B, Q]
        last = torch.arange(Q - K, Q, device=self.device).expand(B, K)  # [B, K]
        _, logits = self.lean.forward(
            beam.tokens, positions, self.cache, committed, beam.mask, int(committed.max()) + Q, last
        )  # [B, K, V]
        return logits.float().log_softmax(dim=-1)

    def _positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Clamp to the RoPE table: drafts past the drafter's context are garbage the verifier rejects."""
        return positions.clamp(max=self.lean.max_positions - 1)

    def _reserve(self, slots: int) -> None:
        """Grow the cache (doubling) to at least `slots` slots per row, keeping the cached K/V."""
        B = len(self.history)
        old = 0 if self.cache is None else self.cache.max_len
        if old >= slots:
            return
        lean = self.lean
        shape = (lean.num_layers, B, lean.num_kv_heads, max(slots, 2 * old), lean.head_dim)
        # zeros, not empty: masked slots still enter attention's matmul with weight 0, and 0 * NaN = NaN.
        # Not allocate_cache: slots may pass max_position_embeddings (positions are clamped instead).
        k = torch.zeros(shape, dtype=lean.dtype, device=self.device)
        cache = KVCache(k=k, v=torch.zeros_like(k))
        if old:
            cache.k[:, :, :, :old] = self.cache.k
            cache.v[:, :, :, :old] = self.cache.v
        self.cache = cache

    def save(self, path: str | Path) -> None:
        save_folder(path, self.model.save_pretrained, {"kind": self.kind})

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> SmallLMDrafter:
        payload = read_drafter_json(path)
        if payload["kind"] != cls.kind:
            raise ValueError(f"{path} holds a {payload['kind']!r} drafter, not {cls.kind!r}")
        return cls(AutoModelForCausalLM.from_pretrained(path, dtype=dtype))


class _Beam:
    """The beam nodes drafted so far, level by level (K per level), with their ancestor mask."""

    def __init__(self, tokens, mask, depths, score, candidate):
        self.tokens = tokens  # [B, Q] all beam nodes, level by level
        self.mask = mask  # [B, Q, Q] bool ancestor-or-self mask
        self.depths = depths  # [Q] depth of each node (first level = 1)
        self.score = score  # [B, K] cumulative log-prob of the last level
        self.candidate = candidate  # [B, K] candidate index of the last level's nodes

    @staticmethod
    def first(token: torch.Tensor, score: torch.Tensor) -> _Beam:
        B, K = token.shape
        eye = torch.eye(K, dtype=torch.bool, device=token.device).expand(B, K, K)
        depths = torch.ones(K, dtype=torch.long, device=token.device)
        candidate = torch.arange(K, device=token.device).expand(B, K)
        return _Beam(token, eye, depths, score, candidate)

    def extend(self, tokens: torch.Tensor, scores: torch.Tensor, offset: int) -> _Beam:
        """Keep the K best of the new level's K * K children ([B, K * K], candidates from `offset`)."""
        B, Q = self.tokens.shape
        K = self.score.shape[1]
        score, pick = scores.topk(K, dim=-1)  # [B, K]
        parent = Q - K + pick // K  # [B, K] beam node of each picked child's parent
        parent_rows = self.mask.gather(1, parent[:, :, None].expand(B, K, Q))  # [B, K, Q]
        eye = torch.eye(K, dtype=torch.bool, device=tokens.device).expand(B, K, K)
        new_rows = torch.cat([parent_rows, eye], dim=2)  # [B, K, Q + K]
        mask = torch.cat([F.pad(self.mask, (0, K)), new_rows], dim=1)  # [B, Q + K, Q + K]
        depths = torch.cat([self.depths, self.depths[-1:].expand(K) + 1])
        tokens = torch.cat([self.tokens, tokens.gather(1, pick)], dim=1)  # [B, Q + K]
        return _Beam(tokens, mask, depths, score, offset + pick)


class _Candidates:
    """Every drafted node (C = K + (steps - 1) * K^2): candidate order is topological, siblings best first."""

    def __init__(self, tokens, scores, parents):
        self.tokens = tokens  # [B, C]
        self.scores = scores  # [B, C] cumulative draft log-prob
        self.parents = parents  # [B, C] candidate index of the parent, -1 for the root

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def add(self, tokens: torch.Tensor, scores: torch.Tensor, parents: torch.Tensor) -> None:
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.scores = torch.cat([self.scores, scores], dim=1)
        self.parents = torch.cat([self.parents, parents], dim=1)

    def best_tree(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The n best candidates in candidate order: (tokens [B, n], parents [B, n] as tree node indices).

        A child never scores above its parent (log-probs <= 0) and a stable sort breaks ties by candidate
        order, so every kept node's parent is kept too.
        """
        B = self.tokens.shape[0]
        best = self.scores.sort(dim=1, descending=True, stable=True).indices[:, :n]  # [B, n]
        keep = best.sort(dim=1).values  # [B, n] back in topological order
        node = torch.full_like(self.tokens, -1)  # [B, C] tree node index of each kept candidate
        node.scatter_(1, keep, torch.arange(1, n + 1, device=keep.device).expand(B, n))
        parent = self.parents.gather(1, keep)  # [B, n]
        parents = torch.where(parent >= 0, node.gather(1, parent.clamp(min=0)), 0)
        return self.tokens.gather(1, keep), parents
