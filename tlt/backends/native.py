"""The native rollout engine: pure PyTorch, batched prefill and decode, adaptive speculative decoding.

Split as in nano-vllm: sequence state (`native_state`), a model runner (`native_runner`, one forward per
call) and this engine, whose `_step` is schedule (tuner) -> run (plain step or draft + verify) -> postprocess
(stop rules, drop finished rows). Ragged prompts are prefilled in one right-padded forward with per-row
lengths (one forward beats P small ones on CPU where per-op overhead dominates), once per prompt, and the
cache rows are forked into the n samples. SD can be switched on, off or between strategies on any step: the
drafter sees every committed token.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from tlt.backends.base import Capabilities, DecodeStepStats, Rollout, SamplingParams, check_prompts
from tlt.backends.native_runner import ModelRunner, next_tokens
from tlt.backends.native_state import Emission, Outputs, RunningBatch, StopCheck, check_stop
from tlt.drafters.base import Drafter, dry_run
from tlt.models.lean import LeanModel
from tlt.schedulers.tuners.base import StrategyTuner
from tlt.speculative.sampling import token_logprobs
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

CAPABILITIES = Capabilities(
    per_step_strategy=True,
    drafter_hot_swap=True,
    hidden_states=True,
    tree_drafts=True,
    drafters=("eagle", "small_lm", "ngram", "suffix", "composed"),
)


class NativeEngine:
    """RolloutEngine over an HF Qwen2 / Llama causal LM (moved to `device`; weights shared with the engine).

    Rollout.hidden_states[t] is the target's final-norm hidden state at the position that produced token t
    (HF's last_hidden_state at index P - 1 + t over prompt + response), the pair the drafter trains on;
    Rollout.prompt_hidden_states [P, D] those at the prompt positions (one tensor shared by a prompt's n
    samples). Both only with return_hidden.
    """

    capabilities = CAPABILITIES

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_id: int | None,
        max_seq_len: int,
        tuner: StrategyTuner | None = None,
        drafter: Drafter | None = None,
        return_hidden: bool = False,
        device: str | torch.device = "cpu",
        truncate_prompts: str | None = None,
        draft_int8: bool = False,
        cuda_graphs: bool = False,
        packed_weights: bool = True,
    ):
        """draft_int8: EAGLE drafters draft with an int8 copy of their head (CPU, float32 target), rebuilt at
        every set_drafter(); the output is unchanged, a draft step streams a quarter of the head's bytes.
        cuda_graphs: the target's decode and verify forwards run on static shapes (rows padded to a power of two,
        attention over a multiple of 128 slots) and, on CUDA, are captured as CUDA graphs per shape and replayed
        (`native_graphs`), and so do an EAGLE drafter's consume and draft steps (`EagleDrafter.use_static_shapes`;
        the other drafters' steps stay eager); on CPU the same static path runs uncaptured (it exists to be
        tested there).
        packed_weights: on CPU the target multiplies by copies of its weights in oneDNN's packed layout
        (`tlt.models.lean.Linear`: a 6-token verify of one row costs 1.09 plain steps instead of 1.56 on the tiny
        policy), remade after every update_weights; False multiplies by the shared weights (F.linear), for
        comparison (config: rollout.packed_weights)."""
        if truncate_prompts not in (None, "left"):
            raise ValueError(f"truncate_prompts must be None (raise) or 'left', got {truncate_prompts!r}")
        limit = model.config.max_position_embeddings
        if not 2 <= max_seq_len <= limit:
            raise ValueError(f"max_seq_len must be in [2, max_position_embeddings={limit}], got {max_seq_len}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.eos_token_id = eos_token_id
        self.max_seq_len = max_seq_len
        self.tuner = tuner
        self.return_hidden = return_hidden
        self.truncate_prompts = truncate_prompts
        self.runner = ModelRunner(LeanModel.from_hf(self.model, packed_weights), max_seq_len, static=cuda_graphs)
        self.draft_int8 = draft_int8
        self.drafter: Drafter | None = None
        self.set_drafter(drafter)
        self.weights_version: int | None = None
        self.step_stats: list[DecodeStepStats] = []
        self._max_cache_len = 0  # exact max cache length of the running rows, refreshed every step

    def set_drafter(self, drafter: Drafter | None) -> None:
        if drafter is not None:
            self._bind(drafter)
        self.drafter = drafter

    def _bind(self, drafter: Drafter) -> None:
        if self.draft_int8:
            if not hasattr(drafter, "int8"):
                raise ValueError(
                    f"draft_int8 drafts with an int8 copy of an EAGLE head; a {drafter.kind} drafter has none "
                    "(set speculative.draft_int8=false or drafter.kind=eagle)"
                )
            drafter.int8 = True
        drafter.bind(self.model)
        if self.runner.static is not None and hasattr(drafter, "use_static_shapes"):
            drafter.use_static_shapes(self.max_seq_len, capture=self.runner.static.graphs.capture)

    def close(self) -> None:
        """Nothing to release: the engine lives in this process."""

    def check_drafter(self, drafter: Drafter | None) -> None:
        """Raise unless `drafter` runs against this target: binds it (shapes) and drafts once."""
        if drafter is not None:
            self._bind(drafter)
            dry_run(drafter, self.model)

    @torch.inference_mode()
    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy HF-named tensors into the model in place; checks every name and shape before copying any."""
        self.check_weights(state_dict)
        own = self.model.state_dict()
        for name, tensor in state_dict.items():
            own[name].copy_(tensor)
        self.weights_version = version

    def check_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Raise (KeyError / ValueError) unless every name and shape fits the model; copies nothing."""
        own = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise KeyError(
                f"update_weights: unknown parameter names {unknown[:5]}; expected HF names like {next(iter(own))!r}"
            )
        bad = [
            f"{k}: got {tuple(v.shape)}, model has {tuple(own[k].shape)}"
            for k, v in state_dict.items()
            if v.shape != own[k].shape
        ]
        if bad:
            raise ValueError(f"update_weights: shape mismatch, nothing was loaded: {'; '.join(bad[:5])}")

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, n: int = 1) -> list[Rollout]:
        """n samples per prompt, grouped by prompt (rollout i is prompt i // n, sample i % n)."""
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        self.step_stats = []
        if len(prompts) == 0:
            return []
        prompt_ids = [
            torch.tensor(p, dtype=torch.long, device=self.device)
            for p in check_prompts(prompts, self.max_seq_len, self.truncate_prompts, sampling.max_new_tokens)
        ]
        generator = torch.Generator(self.device)
        if sampling.seed is None:
            generator.seed()
        else:
            generator.manual_seed(sampling.seed)
        with torch.inference_mode():
            outputs = Outputs.allocate(
                len(prompt_ids) * n,
                sampling.max_new_tokens,
                self.runner.lean.hidden_size if self.return_hidden else None,
                self.device,
            )
            batch = self._prefill(prompt_ids, n, sampling, generator, outputs)
            while batch.size:
                batch = self._step(batch, sampling, generator, outputs)
        return outputs.rollouts(prompt_ids, n)

    @property
    def _drafting(self) -> bool:
        return self.drafter is not None and self.tuner is not None

    def _prefill(self, prompts, n, sampling, generator, outputs: Outputs) -> RunningBatch:
        lengths = torch.tensor([p.numel() for p in prompts], device=self.device)
        tokens = torch.nn.utils.rnn.pad_sequence(prompts, batch_first=True)  # [P, T] right-padded
        hidden, logits = self.runner.prefill(tokens, lengths, n)  # [P, T, D], [P, V]
        if self.return_hidden:
            outputs.prompt_hidden = hidden.clone()
        rows = torch.arange(len(prompts), device=self.device).repeat_interleave(n)  # [R]
        logits, lengths = logits[rows], lengths[rows]
        first = next_tokens(logits, sampling, generator)  # [R]
        last_hidden = hidden[rows, lengths - 1][:, None]  # [R, 1, D]
        if self._drafting:
            use_hidden = self.drafter.uses_target_hidden
            self.drafter.start(tokens[rows], hidden[rows] if use_hidden else None, lengths)
        budget = torch.clamp(self.max_seq_len - lengths, max=sampling.max_new_tokens)
        batch = RunningBatch(
            seq_ids=torch.arange(rows.numel(), device=self.device),
            cache_lens=lengths - 1,  # _commit adds the first token's count
            pending=first,
            remaining=budget,
        )
        emission = Emission(
            first[:, None],
            torch.ones_like(first),
            token_logprobs(logits, first, sampling)[:, None],
            last_hidden,
        )
        batch, _, _ = self._commit(batch, emission, outputs)
        return batch

    def _step(self, batch: RunningBatch, sampling, generator, outputs: Outputs) -> RunningBatch:
        start = time.perf_counter()
        strategy = self._schedule(batch)
        kv_len = self._max_cache_len + (strategy.verify_tokens if strategy else 1)
        tree = None if strategy is None else self._draft(strategy, batch.size, sampling, generator)
        if tree is not None and tree.real is not None:  # ragged drafts: nothing drafted is a plain step
            width = max(tree.real)
            if width == 1:
                tree = None
            elif self.runner.static is None:  # and eager shapes verify as wide as the longest (static ones keep
                tree = tree.narrow(width)  # the strategy's width: one captured graph per strategy, not per width)
        if tree is None:
            emission, accepted = self.runner.decode(batch, kv_len, sampling, generator), None
        else:
            levels = min(strategy.steps, tree.num_nodes - 1)  # drafters draft at most `steps` deep
            emission, accepted = self.runner.speculate(batch, tree, levels, kv_len, sampling, generator)
        size = batch.size
        batch, generated, num_accepted = self._commit(batch, emission, outputs, accepted)
        self._record(strategy, tree, size, num_accepted, generated, time.perf_counter() - start)
        return batch

    def _draft(self, strategy: SpecStrategy, batch_size: int, sampling, generator) -> DraftTree:
        if sampling.greedy:
            tree = self.drafter.propose(strategy)
        else:
            tree = self.drafter.propose_sampled(strategy, sampling, generator)
        shape = tuple(tree.tokens.shape)
        if shape != (batch_size, strategy.verify_tokens):
            raise ValueError(
                f"drafter {type(self.drafter).__name__} proposed a tree of shape {shape} for strategy "
                f"{strategy}; expected [B, N] = [{batch_size}, {strategy.verify_tokens}]"
            )
        real = tree.real
        if real is not None and (len(real) != batch_size or not all(1 <= n <= strategy.verify_tokens for n in real)):
            raise ValueError(
                f"drafter {type(self.drafter).__name__} gave real={real} for {batch_size} rows of strategy "
                f"{strategy}; expected one count per row in 1..{strategy.verify_tokens} (the root included)"
            )
        probs = tree.draft_probs
        expected = (batch_size, strategy.verify_tokens - 1, self.runner.lean.vocab_size)
        if probs is not None and (tuple(probs.shape) != expected or not tree.has_chain_parents()):
            raise ValueError(
                f"drafter {type(self.drafter).__name__} returned draft_probs of shape {tuple(probs.shape)}; "
                f"sampled drafts must be a chain with draft_probs [B, N - 1, V] = {list(expected)}"
            )
        return tree

    def _schedule(self, batch: RunningBatch) -> SpecStrategy | None:
        """The tuner's strategy, or None (plain) without a drafter or when a tree would overflow the cache."""
        if not self._drafting:
            return None
        strategy = self.tuner.select(batch.size)
        if strategy is None or self._max_cache_len + strategy.verify_tokens > self.max_seq_len:
            return None
        return strategy

    def _commit(
        self, batch: RunningBatch, emission: Emission, outputs: Outputs, accepted: torch.Tensor | None = None
    ) -> tuple[RunningBatch, int, int]:
        """Stop rules, output write, drafter sync, drop finished rows; returns (batch, generated tokens,
        accepted draft tokens). The step's one host sync reads these counts."""
        stop: StopCheck = check_stop(emission.tokens, emission.counts, batch.remaining, self.eos_token_id)
        outputs.write(batch.seq_ids, emission, stop)
        if self._drafting:
            hidden = emission.prev_hidden if self.drafter.uses_target_hidden else None
            self.drafter.append(emission.tokens, hidden, stop.counts)
        last = emission.tokens.gather(1, (stop.counts - 1)[:, None]).squeeze(1)
        batch = RunningBatch(
            seq_ids=batch.seq_ids,
            cache_lens=batch.cache_lens + emission.counts,
            pending=last,
            remaining=batch.remaining - stop.counts,
        )
        alive = ~stop.finished
        num_accepted = stop.counts.new_zeros(()) if accepted is None else accepted.sum()
        num_alive, generated, max_len, num_accepted = torch.stack(
            [alive.sum(), stop.counts.sum(), (batch.cache_lens * alive).max(), num_accepted]
        ).tolist()
        self._max_cache_len = max_len
        if num_alive < batch.size:
            rows = torch.sort((~alive).to(torch.uint8), stable=True).indices[:num_alive]  # no device read
            batch = batch.keep(rows)
            if num_alive:
                self.runner.keep(rows, kv_len=max_len)
                if self._drafting:
                    self.drafter.keep(rows)
        return batch, generated, num_accepted

    def _record(self, strategy, tree, size: int, num_accepted: int, generated: int, seconds: float) -> None:
        """A step's stats; the tuner learns what its choice yielded (a ragged draft with nothing drafted ran a
        plain step: SD off in the stats, the strategy's yield for the tuner)."""
        if tree is None:
            drafted = 0
        else:
            drafted = size * (tree.num_nodes - 1) if tree.real is None else sum(tree.real) - size
        self.step_stats.append(
            DecodeStepStats(
                running_batch=size,
                sd_on=tree is not None,
                strategy=None if tree is None else str(strategy),
                drafted_tokens=drafted,
                accepted_tokens=num_accepted,
                generated_tokens=generated,
                seconds=seconds,
            )
        )
        if self._drafting:
            self.tuner.update(strategy, size, generated, seconds)
