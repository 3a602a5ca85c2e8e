"""The EAGLE drafter: a one-layer head over the target's features, chain or EAGLE-2 tree drafting.

State per row (see tlt.drafters.base): the KV cache holds one entry per consumed pair (h_i, x_{i+1}), at
position i; after the pairs of the T + 1 committed tokens x_0..x_T it holds T entries, and its output at the
newest pair, h'_T, gives the first draft level (EAGLE: the target's h_T is not known yet). Pairs delivered by
`append` are buffered and consumed in one forward by the next `propose` (or every `flush_every` appends, a
bound on the buffer's memory), so plain decoding steps cost the drafter only the buffering, and rows that finish
before the next `propose` are never consumed. The prompts wait the same way: `start` keeps one copy of each
distinct prompt and the first flush consumes those of the rows still running, so a rollout that never
speculates never runs the head. (With flush_every = 32 a rollout that never speculated took 8% longer than
plain decoding on the tiny policy, with 256 4%: the periodic catch-up forwards were the difference.) Draft
nodes are written past the committed entries and never advance the cache length, so anything speculative is
discarded by construction.

Tree drafting follows EAGLE-2 (https://arxiv.org/abs/2406.16858): each level feeds the top-k frontier nodes
(by cumulative log-prob) in one forward under tree attention, each gets top-k children, and the N - 1 best of
all candidates are verified. topk == 1 gives the greedy chain.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tlt.drafters.base import Drafter, DrafterMismatchError
from tlt.drafters.eagle_head import EagleConfig, EagleHead
from tlt.models.graphs import Graphs, batch_bucket, kv_blocks, kv_bucket, pad_rows
from tlt.models.lean import attention_mask
from tlt.speculative.sampling import probs_from_logits, sample_tokens
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

if TYPE_CHECKING:
    from tlt.backends.base import SamplingParams

WEIGHTS_FILE = "model.safetensors"
STATIC_CHUNK = 64  # static shapes: pairs consumed per forward at most (the flush's padded width)
STATIC_DRAFT_SLOTS = 64  # static shapes: draft slots past the committed entries (a tree needs topk * (depth - 1))


class EagleDrafter(Drafter):
    kind = "eagle"
    uses_target_hidden = True

    def __init__(self, head: EagleHead, flush_every: int = 256, int8: bool = False):
        self.head = head.eval()
        self.flush_every = flush_every
        self.int8 = int8  # draft with an int8 copy of the head, rebuilt by every bind()
        self.drafting_head: EagleHead = self.head  # what propose() runs: the head, or its int8 copy
        self.k: torch.Tensor | None = None  # [B, Hkv, S, Dh] committed pairs' keys, then draft scratch
        self.v: torch.Tensor | None = None
        self.cache_lens: torch.Tensor | None = None  # [B] consumed pairs per row
        self.last_token: torch.Tensor | None = None  # [B] x_T, the root of the next tree
        self.feature: torch.Tensor | None = None  # [B, D] h'_T predicted at the newest consumed pair
        self.pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (tokens, hidden, valid)
        self.prompts: _Prompts | None = None  # start()'s distinct prompts, until the first flush consumes them
        self.appends = 0  # append() calls buffered since the last flush: flush_every bounds them
        self.graphs: Graphs | None = None  # static shapes (`use_static_shapes`), else eager
        self.static_len = 0  # static shapes: the engine's max_seq_len, which bounds every row's entries
        self.buffer: tuple[torch.Tensor, torch.Tensor] | None = None  # static shapes: k, v of all cache rows

    @classmethod
    def from_config(cls, cfg, target: torch.nn.Module, seed: int = 0) -> EagleDrafter:
        return cls.from_target(target, seed=seed)

    @classmethod
    def from_target(cls, target: torch.nn.Module, seed: int = 0) -> EagleDrafter:
        """An untrained head shaped like one of the target's layers, deterministic for a seed, bound to it."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = EagleHead(EagleConfig.from_target(target.config))
        drafter = cls(head)
        drafter.bind(target)
        return drafter

    @property
    def config(self) -> EagleConfig:
        return self.head.config

    def clone(self) -> EagleDrafter:
        """An unbound copy of the trainable head only: the target's embedding and LM head are not copied."""
        weight = self.head.fc.weight
        with torch.random.fork_rng(devices=[]):  # the throwaway init must not move the global RNG
            head = EagleHead(self.config).to(device=weight.device, dtype=weight.dtype)
        head.load_state_dict(self.head.state_dict())
        return type(self)(head, self.flush_every, self.int8)

    def bind(self, target: torch.nn.Module) -> None:
        cfg, tcfg = self.config, target.config
        got = (tcfg.hidden_size, tcfg.vocab_size)
        if got != (cfg.hidden_size, cfg.vocab_size):
            raise DrafterMismatchError(
                f"EAGLE drafter was built for hidden_size={cfg.hidden_size}, vocab_size={cfg.vocab_size} "
                f"but the target has hidden_size={got[0]}, vocab_size={got[1]}; train a drafter for this "
                "target (tlt train-drafter)"
            )
        if tcfg.max_position_embeddings > cfg.max_position_embeddings:
            raise DrafterMismatchError(
                f"EAGLE drafter covers {cfg.max_position_embeddings} positions, the target "
                f"{tcfg.max_position_embeddings}"
            )
        embed = target.get_input_embeddings().weight
        self.head.to(device=embed.device, dtype=embed.dtype)
        self.head.share(embed, target.get_output_embeddings().weight)
        self.drafting_head = int8_copy(self.head) if self.int8 else self.head

    def use_static_shapes(self, max_seq_len: int, capture: bool) -> None:
        """Consume and draft on static shapes, as the engine's target does under `rollout.cuda_graphs`: rows padded
        to a power of two, one cache of max_seq_len + slack slots per row allocated per generate, attention over
        a multiple of 128 slots sized from a host-side bound on the rows' lengths (no device read), pairs consumed
        in padded chunks; on CUDA each shape is captured as a CUDA graph (tlt.models.graphs), except sampled
        chains (their draws stay eager). The drafts equal the eager path's."""
        self.graphs, self.static_len, self.buffer = Graphs(capture), max_seq_len, None

    # ---- state -------------------------------------------------------------------------------------------

    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        """Keep each distinct prompt once (the engine forks each prompt into n rows) for the first flush."""
        if hidden is None:
            raise ValueError("the EAGLE drafter needs the target's hidden states (uses_target_hidden=True)")
        B = tokens.shape[0]
        key = torch.cat([lengths[:, None], tokens], dim=1)  # [B, 1 + T]
        unique, inverse = torch.unique(key, dim=0, return_inverse=True)
        first = torch.full((unique.shape[0],), B, device=tokens.device).scatter_reduce(
            0, inverse, torch.arange(B, device=tokens.device), "amin"
        )  # [U] a row holding each distinct prompt
        self.prompts = _Prompts(tokens[first], hidden[first], lengths[first], row_prompt=inverse)
        self.k = self.v = self.cache_lens = self.feature = None
        self.pending, self.appends = [], 0
        self.last_token = tokens.gather(1, (lengths - 1)[:, None]).squeeze(1)

    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        if prev_hidden is None:
            raise ValueError("the EAGLE drafter needs the target's hidden states (uses_target_hidden=True)")
        valid = torch.arange(tokens.shape[1], device=tokens.device) < counts[:, None]  # [B, L]
        self.pending.append((tokens, prev_hidden, valid))
        self.appends += 1
        self.last_token = tokens.gather(1, (counts - 1)[:, None]).squeeze(1)
        if self.appends >= self.flush_every:
            self._flush()

    def keep(self, rows: torch.Tensor) -> None:
        if self.prompts is not None:
            self.prompts.row_prompt = self.prompts.row_prompt[rows]
        else:
            self.k, self.v = self._take(rows)
            self.cache_lens, self.feature = self.cache_lens[rows], self.feature[rows]
        if self.last_token is not None:
            self.last_token = self.last_token[rows]
        if len(self.pending) > 1:  # one block to index, not one per buffered step
            self.pending = [tuple(torch.cat(parts, dim=1) for parts in zip(*self.pending, strict=True))]
        self.pending = [(t[rows], h[rows], v[rows]) for t, h, v in self.pending]

    @torch.inference_mode()
    def _flush(self) -> None:
        """Consume the prompts of the running rows if still waiting, then the buffered pairs: the chunks merged
        into one right-padded block per row."""
        if self.prompts is not None:
            self._consume_prompts()
        if not self.pending:
            return
        tokens, hidden, valid = (torch.cat(parts, dim=1) for parts in zip(*self.pending, strict=True))
        order = torch.sort((~valid).to(torch.uint8), dim=1, stable=True).indices  # valid entries first
        tokens = tokens.gather(1, order)
        hidden = hidden.gather(1, order[:, :, None].expand(-1, -1, hidden.shape[-1]))
        self.pending, self.appends = [], 0
        self._consume(tokens, hidden, valid.sum(dim=1))

    def _consume_prompts(self) -> None:
        """Start the cache from the prompts that running rows hold: consume each once, then fork it to its rows."""
        prompts, self.prompts = self.prompts, None
        needed, row_prompt = torch.unique(prompts.row_prompt, return_inverse=True)
        tokens, hidden, lengths = prompts.tokens[needed], prompts.hidden[needed], prompts.lengths[needed]
        (U, T), cfg = tokens.shape, self.config
        self.k, self.v = self._allocate(U, row_prompt.numel(), T)
        dtype = self.head.fc.weight.dtype
        self.cache_lens = torch.zeros(U, dtype=torch.long, device=tokens.device)
        self.max_len = 0
        self.feature = torch.zeros(U, cfg.hidden_size, dtype=dtype, device=tokens.device)
        if T > 1:
            self._consume(tokens[:, 1:], hidden[:, :-1], lengths - 1)
        self.k, self.v = self._take(row_prompt)
        self.cache_lens, self.feature = self.cache_lens[row_prompt], self.feature[row_prompt]

    def _consume(self, tokens: torch.Tensor, hidden: torch.Tensor, counts: torch.Tensor) -> None:
        """Append pairs tokens[b, :counts[b]] ([B, Q], hidden [B, Q, D]) to the cache; keep the last h'."""
        if self.graphs is not None:
            for start in range(0, tokens.shape[1], STATIC_CHUNK):
                chunk = slice(start, start + STATIC_CHUNK)
                self._consume_static(tokens[:, chunk], hidden[:, chunk], (counts - start).clamp(0, STATIC_CHUNK))
            return
        B, Q = tokens.shape
        kv_len = int(self.cache_lens.max()) + Q  # the proposal's one host read
        self._reserve(kv_len)
        positions = self.cache_lens[:, None] + torch.arange(Q, device=tokens.device)  # [B, Q]
        mask = attention_mask(self.cache_lens, Q, kv_len, None)  # [B, 1, Q, S] causal
        out = self._forward(tokens, hidden, positions, mask)  # [B, Q, D]
        self._consumed(out, counts, kv_len)

    def _consume_static(self, tokens: torch.Tensor, hidden: torch.Tensor, counts: torch.Tensor) -> None:
        """`_consume` of at most STATIC_CHUNK pairs per row, padded to a power of two wide and to the rows'
        bucket; the host-side bound on the rows' lengths sizes the attention."""
        (B, width), rows = tokens.shape, batch_bucket(tokens.shape[0])
        Q = batch_bucket(width)
        kv_len = kv_bucket(self.max_len + Q, self.buffer[0].shape[2])
        k, v = (x[:rows] for x in self.buffer)

        def forward(tokens, hidden, lens):
            positions = lens[:, None] + torch.arange(Q, device=lens.device)
            mask = attention_mask(lens, Q, kv_len, None)
            return (self._head(tokens, hidden, positions, mask, lens, 0, k, v),)

        columns = (0, Q - width)
        inputs = (pad_rows(F.pad(tokens, columns), rows), pad_rows(F.pad(hidden, (0, 0, *columns)), rows))
        (out,) = self.graphs.run(("consume", rows, Q, kv_len), forward, (*inputs, pad_rows(self.cache_lens, rows)))
        self._consumed(out[:B], counts, min(self.max_len + width, self.static_len))

    def _consumed(self, out: torch.Tensor, counts: torch.Tensor, max_len: int) -> None:
        """The cache after consuming counts [B] pairs whose head outputs are `out` [B, Q, D]."""
        B = out.shape[0]
        last = (counts - 1).clamp(min=0)
        has_pairs = (counts > 0)[:, None]
        self.feature = torch.where(has_pairs, out[torch.arange(B, device=out.device), last], self.feature)
        self.cache_lens = self.cache_lens + counts
        self.max_len = max_len  # >= max(cache_lens): drafting sizes its masks from it without reading the device

    def _forward(self, tokens, hidden, positions, mask, offset: int = 0) -> torch.Tensor:
        return self._head(tokens, hidden, positions, mask, self.cache_lens, offset, self.k, self.v)

    def _head(self, tokens, hidden, positions, mask, lens, offset: int, k, v) -> torch.Tensor:
        """Head forward of Q new queries per row ([B, Q]) written at cache slots lens + offset + q of k, v."""
        Q = tokens.shape[1]
        rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
        slots = lens[:, None] + offset + torch.arange(Q, device=tokens.device)  # [B, Q]
        return self.drafting_head(tokens, hidden, positions, mask, cache=(k, v, rows, slots))

    def _allocate(self, rows: int, running: int, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A zeroed cache for `rows` prompts; static shapes: views of a buffer for the `running` rows' bucket
        (reused while large enough; new graphs with a new buffer)."""
        cfg, weight = self.config, self.head.fc.weight
        if self.graphs is None:
            shape = (rows, cfg.num_kv_heads, _capacity(prompt_len + 64), cfg.head_dim)
            k = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            return k, torch.zeros_like(k)
        need = max(batch_bucket(running), rows)
        slots = kv_blocks(self.static_len + STATIC_CHUNK + STATIC_DRAFT_SLOTS)
        if self.buffer is None or self.buffer[0].shape[0] < need:
            shape = (need, cfg.num_kv_heads, slots, cfg.head_dim)
            k = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            self.buffer = (k, torch.zeros_like(k))
            self.graphs = Graphs(self.graphs.capture)
        return tuple(x[:rows].zero_() for x in self.buffer)

    def _take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache rows `rows` ([n] indices), in order: gathered, or moved to the front of the static buffer."""
        if self.graphs is None:
            return self.k[rows], self.v[rows]
        for own, full in zip((self.k, self.v), self.buffer, strict=True):
            full[: rows.numel()] = own[rows]
        return tuple(x[: rows.numel()] for x in self.buffer)

    def _reserve(self, slots: int) -> None:
        """Grow the cache (doubling) to hold `slots` entries per row."""
        if slots <= self.k.shape[2]:
            return
        if self.graphs is not None:
            raise ValueError(f"static drafting holds {self.k.shape[2]} slots per row, {slots} asked")
        grow = _capacity(slots) - self.k.shape[2]
        pad = (0, 0, 0, grow)
        self.k, self.v = F.pad(self.k, pad), F.pad(self.v, pad)

    # ---- drafting ----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, strategy: SpecStrategy) -> DraftTree:
        self._flush()
        return self._draft(strategy, None)

    @torch.inference_mode()
    def propose_sampled(
        self, strategy: SpecStrategy, sampling: SamplingParams, generator: torch.Generator | None
    ) -> DraftTree:
        """Chains at temperature > 0 are sampled level by level from q, the head's distribution under the
        step's temperature / top-k / top-p (q tracks the target's p, so min(1, p / q) accepts most drafts);
        trees and greedy steps draft as `propose`."""
        if strategy.topk != 1 or sampling.greedy:
            return self.propose(strategy)
        self._flush()
        return self._draft(strategy, (sampling, generator))

    def _draft(self, strategy: SpecStrategy, sample) -> DraftTree:
        """The strategy's draft tree from the rows' state: eager, or on static shapes (`use_static_shapes`)."""
        depth = min(strategy.steps, strategy.verify_tokens - 1)  # deeper nodes could never be selected
        scratch = strategy.topk * (depth - 1)  # draft slots written past the committed entries
        state = (self.last_token, self.feature, self.cache_lens)

        def draft(last, feature, lens, k, v, max_len):
            if strategy.topk == 1:
                return self._chain(last, feature, lens, depth, max_len, k, v, sample)
            return self._tree(last, feature, lens, strategy, depth, max_len, k, v)

        if self.graphs is None:
            self._reserve(self.max_len + scratch)
            out = draft(*state, self.k, self.v, self.max_len)
        elif sample is not None:  # the draws stay eager, on the running rows only, as on the eager path
            out = draft(*state, self.k, self.v, self._static_kv(scratch) - scratch)
        else:
            rows, kv_len = batch_bucket(self.feature.shape[0]), self._static_kv(scratch)
            k, v = (x[:rows] for x in self.buffer)
            key = ("draft", strategy, rows, kv_len)
            padded = tuple(pad_rows(x, rows) for x in state)
            out = self.graphs.run(key, lambda *x: draft(*x, k, v, kv_len - scratch), padded)
            out = tuple(x[: self.feature.shape[0]] for x in out)
        if strategy.topk != 1:
            return DraftTree(tokens=out[0], parents=out[1])
        tree = DraftTree.chain(out[0])
        tree.draft_probs = out[1] if sample is not None else None
        return tree

    def _static_kv(self, scratch: int) -> int:
        if scratch > STATIC_DRAFT_SLOTS:
            raise ValueError(
                f"static drafting keeps {STATIC_DRAFT_SLOTS} draft slots per row; this strategy writes {scratch} "
                "(topk * (depth - 1)): use a smaller strategy or rollout.cuda_graphs=false"
            )
        return kv_bucket(self.max_len + scratch, self.buffer[0].shape[2])

    def _tree(self, last_token, feature0, lens0, strategy: SpecStrategy, depth: int, max_len: int, k, v):
        """EAGLE-2 beam drafting (works for any topk; `_chain` is the faster topk == 1 case): (tokens, parents)."""
        K = strategy.topk
        B, D = feature0.shape
        beam = _Beam.root(self._log_probs(feature0[:, None]), K)  # depth-1 candidates
        fed_total = K * (depth - 1)  # level l feeds its K frontier nodes as fed nodes K * (l - 1) + slot
        ancestors = torch.zeros(B, fed_total, fed_total, dtype=torch.bool, device=k.device)
        own = torch.eye(K, dtype=torch.bool, device=k.device).expand(B, K, K)
        parent = torch.full((B, K), -1, dtype=torch.long, device=k.device)  # fed index of the parent
        feature = feature0[:, None].expand(B, K, D)  # [B, K, D] the parent's output feature
        for level in range(1, depth):
            fed = slice(K * (level - 1), K * level)
            inherited = ancestors.gather(1, parent.clamp(min=0)[:, :, None].expand(-1, -1, fed_total))
            ancestors[:, fed] = inherited & (parent >= 0)[:, :, None]  # [B, K, F]
            ancestors[:, fed, fed] |= own
            mask = _tree_mask(lens0, ancestors[:, fed, : K * level], max_len + K * level)
            positions = (lens0 + level - 1)[:, None].expand(B, K)  # depth-l nodes sit at T - 1 + l
            out = self._head(beam.frontier_tokens, feature, positions, mask, lens0, K * (level - 1), k, v)
            source = beam.expand(self._log_probs(out), K)  # [B, K] frontier slot of each new frontier node
            feature = out.gather(1, source[:, :, None].expand(-1, -1, D))
            parent = K * (level - 1) + source
        tree = beam.select(last_token, strategy.num_draft_tokens)
        return tree.tokens, tree.parents

    def _chain(self, last_token, feature, lens0, depth: int, max_len: int, k, v, sample=None):
        """The top-1 beam without the tree bookkeeping: level l is one causal query at slot cache_len + l - 1.
        Returns (tokens [B, depth + 1],) or, with `sample` = (sampling, generator), each level's token drawn from
        q instead of taken as its argmax, (tokens, draft_probs [B, depth, V]).
        """
        token, q = self._pick(feature, sample)  # [B]
        tokens, probs = [last_token, token], [q]
        for level in range(1, depth):
            lens = lens0 + level - 1  # [B] the node's slot; the earlier draft slots are its ancestors
            mask = attention_mask(lens, 1, max_len + level, None)  # slots past a row's own are masked
            feature = self._head(token[:, None], feature[:, None], lens[:, None], mask, lens0, level - 1, k, v)[:, 0]
            token, q = self._pick(feature, sample)
            tokens.append(token)
            probs.append(q)
        tokens = torch.stack(tokens, dim=1)
        return (tokens,) if sample is None else (tokens, torch.stack(probs, dim=1))

    def _pick(self, feature: torch.Tensor, sample) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Next draft token per row ([B]) from predicted features [B, D]: argmax, or a draw from q (returned)."""
        logits = self.drafting_head.logits(feature)
        if sample is None:
            return logits.argmax(dim=-1), None
        sampling, generator = sample
        q = probs_from_logits(logits, sampling)
        return sample_tokens(q, generator), q

    def _log_probs(self, feature: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.drafting_head.logits(feature).float(), dim=-1)  # [B, Q, V]

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """A folder with the trainable head's safetensors (never the target's tensors) + tlt_drafter.json."""
        from safetensors.torch import save_file

        from tlt.drafters import save_folder

        state = {k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}
        meta = {"kind": self.kind, **dataclasses.asdict(self.config)}
        save_folder(path, lambda tmp: save_file(state, str(tmp / WEIGHTS_FILE)), meta)

    @classmethod
    def load(cls, path: str | Path) -> EagleDrafter:
        """A saved drafter (unbound: pass it to an engine, or call `bind(target)`)."""
        from safetensors.torch import load_file

        from tlt.drafters import read_drafter_json

        meta = read_drafter_json(path)
        if meta.pop("kind") != cls.kind:
            raise ValueError(f"{path} holds a drafter of another kind, not {cls.kind!r}")
        meta.pop("exported_for", None)  # an EAGLE-1 export (tlt.drafters.export) reads back as well
        head = EagleHead(EagleConfig(**meta))
        state = load_file(str(Path(path) / WEIGHTS_FILE))
        own = head.state_dict()
        extra = sorted(k for k in state if k not in own)
        nonzero = [k for k in extra if bool(state[k].any())]
        if nonzero:
            raise ValueError(
                f"{path}: tensors {nonzero[:4]} are not part of tlt's EAGLE head (fc without bias); a drafter "
                "saved by an older tlt must be trained again (tlt train-drafter)"
            )
        head.load_state_dict({k: v for k, v in state.items() if k in own})  # drops an export's zero biases
        return cls(head)


def int8_copy(head: EagleHead) -> EagleHead:
    """A copy of the head whose decoder layer's linears run int8 (fbgemm dynamic quantization), for CPUs.

    Weights are quantized once, per output channel; activations per call, per tensor. A drafter's numbers never
    change what SD outputs (the target verifies every token, and the drafter's own probabilities are what it
    sampled from), only how many drafts are accepted; a one-token step of the layer streams a quarter of the
    bytes, which is what it costs on a CPU. The fc stays float: its input concatenates the token embedding and
    the target's feature, whose scales differ, and one activation scale for both cost the `small` drafter 7% of
    its accepted tokens (0.3% of them with fc float). Norms, RoPE and the shared embedding / LM head stay float.
    """
    if head.embed.device.type != "cpu" or head.embed.dtype != torch.float32:
        raise ValueError(
            f"int8 drafting needs a float32 target on CPU, got {head.embed.dtype} on {head.embed.device}; "
            "set speculative.draft_int8=false"
        )
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError as err:  # removed from torch after the pinned 2.13
        raise ImportError(
            f"int8 drafting uses torch.ao.quantization.quantize_dynamic, missing in torch {torch.__version__}; "
            "install torch==2.13.0 or set speculative.draft_int8=false"
        ) from err
    twin = EagleHead(head.config)
    twin.load_state_dict(head.state_dict())
    twin.share(head.embed, head.lm_head)
    with warnings.catch_warnings():  # torch 2.13 announces the quantized tensor types' future removal
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return quantize_dynamic(twin.eval(), {"layers": per_channel_dynamic_qconfig}, dtype=torch.qint8)


@dataclasses.dataclass
class _Prompts:
    """The distinct prompts of a batch ([U, T] tokens, [U, T, D] hidden, [U] lengths), not consumed yet, and
    the prompt of every running row ([B] indices into them)."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    lengths: torch.Tensor
    row_prompt: torch.Tensor


def _capacity(slots: int) -> int:
    """Cache capacity for `slots` entries: the next power of two (at least 64)."""
    return max(64, 1 << (slots - 1).bit_length())


def _tree_mask(cache_lens: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[B, 1, Q, S] bool: the committed prefix, plus draft slots cache_lens + j of the ancestors [B, Q, F]."""
    F_ = ancestors.shape[2]
    rel = torch.arange(kv_len, device=cache_lens.device)[None, :] - cache_lens[:, None]  # [B, S]
    index = rel.clamp(0, F_ - 1)[:, None, :].expand(-1, ancestors.shape[1], -1)  # [B, Q, S]
    in_block = ((rel >= 0) & (rel < F_))[:, None, :]
    return ((rel < 0)[:, None, :] | (ancestors.gather(2, index) & in_block))[:, None]


@dataclasses.dataclass
class _Beam:
    """EAGLE-2 candidates in creation order (a topological order), with the current frontier."""

    tokens: list[torch.Tensor]  # per level [B, C_l] int64
    scores: list[torch.Tensor]  # per level [B, C_l] cumulative log-prob
    parents: list[torch.Tensor]  # per level [B, C_l] candidate index of the parent, -1 for the root
    frontier: torch.Tensor  # [B, K] candidate index of each frontier node
    num: int  # candidates so far

    @staticmethod
    def root(log_probs: torch.Tensor, K: int) -> _Beam:
        scores, tokens = log_probs[:, 0].topk(K, dim=-1)  # [B, K]
        B = tokens.shape[0]
        index = torch.arange(K, device=tokens.device).expand(B, K)
        return _Beam([tokens], [scores], [torch.full_like(tokens, -1)], index, K)

    @property
    def frontier_tokens(self) -> torch.Tensor:
        return torch.cat(self.tokens, 1).gather(1, self.frontier)  # [B, K]

    def expand(self, log_probs: torch.Tensor, K: int) -> torch.Tensor:
        """Add K children per frontier node (log_probs [B, K, V]); keep the K best as the new frontier.

        Returns [B, K]: the frontier slot (0..K-1) each new frontier node descends from.
        """
        child_lp, child_tok = log_probs.topk(K, dim=-1)  # [B, K, K]
        front_scores = torch.cat(self.scores, 1).gather(1, self.frontier)  # [B, K]
        # [B, K * K] cumulative scores, frontier-major with each node's children best first
        scores = (front_scores[:, :, None] + child_lp).flatten(1)
        self.tokens.append(child_tok.flatten(1))
        self.scores.append(scores)
        self.parents.append(self.frontier.repeat_interleave(K, dim=1))
        best = scores.topk(K, dim=-1).indices  # [B, K]
        self.frontier = self.num + best
        self.num += K * K
        return best // K

    def select(self, root: torch.Tensor, n: int) -> DraftTree:
        """The n best candidates (ancestor-closed) in creation order, as a DraftTree rooted at `root` [B]."""
        tokens, scores, parents = (torch.cat(x, 1) for x in (self.tokens, self.scores, self.parents))
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # ties: parents first
        chosen = order[:, :n].sort(dim=1).values  # [B, n] creation (topological) order
        B = tokens.shape[0]
        node_of = torch.zeros_like(tokens).scatter_(
            1, chosen, torch.arange(1, n + 1, device=tokens.device).expand(B, n)
        )  # candidate -> tree node (root = 0)
        parent = parents.gather(1, chosen)
        parent = torch.where(parent < 0, 0, node_of.gather(1, parent.clamp(min=0)))
        minus_one = torch.full((B, 1), -1, dtype=torch.long, device=tokens.device)
        return DraftTree(
            tokens=torch.cat([root[:, None], tokens.gather(1, chosen)], dim=1),
            parents=torch.cat([minus_one, parent], dim=1),
        )
