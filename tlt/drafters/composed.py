"""A learned drafter composed with the suffix drafter: per row and step, the draft expected to go further.

Both drafters follow every row (start / append / keep go to both); each decode step a row takes the suffix
drafter's draft when the tokens it expects accepted (its score: how often the row's prompt history continued that
way, summed over the draft) exceed what the learned drafter has been accepting at this strategy, and the learned
drafter's draft otherwise. The learned drafter's expectation is a running mean of its accepted tokens per verify
(per strategy, from the counts the engine appends), and the suffix score is scaled by how far its past scores came
true (accepted over expected tokens on suffix rows, both sums decaying every step, one token of each assumed: a
first suffix row that accepts little makes the next ones rarer at once); a strategy the learned drafter has not
drafted yet gets the learned draft on every row. So rows keep the learned drafter's drafts unless the history has
seen their text (a prompt's second epoch, a sibling that finished, a row repeating itself) and has been right
there, at the cost of one suffix lookup per row and step. What it measured: docs/results.md (the suffix drafter).

When every row of a step takes the suffix draft, the learned drafter does not draft at all (it still follows the
rows), so such steps cost next to nothing to draft.

Why per row and not per step (the tuner choosing a drafter for the whole batch): the learned drafter accepts far
more on unseen text and the suffix drafter far more on repeated text, and a step's rows mix both; the learned
drafter drafts every row anyway (one batched forward), so a row's swap costs nothing on the target side.

Lossless: a row's choice depends only on the committed tokens and past acceptances, never on this step's target
coins. Greedy: each row's tree is verified as is. At temperature > 0 the learned drafter's sampled chain comes
with its q (`DraftTree.draft_probs`); a suffix row's draft is deterministic, so its q is one-hot on the drafted
token and min(1, p / q) accepts it with probability p(token), the residual being p without it: the target-only
rule, exact like every other row. Trees (topk > 1) are deterministic in both drafters and swap row by row.

`attribution()` counts, per drafter, the verifies it drafted and the draft tokens accepted there.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from tlt.drafters import load_drafter, read_drafter_json, save_folder
from tlt.drafters.base import Drafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

SOURCES = ("learned", "suffix")
MEMORY = 0.05  # weight of the newest step in the running means (about the last 20 steps)


class _Record:
    """What the choice learns from: the learned drafter's running mean of accepted tokens per verify (per
    strategy), the running ratio of accepted to expected tokens on suffix rows, and per drafter the verifies
    drafted and draft tokens accepted. Shared by a drafter and the copy a push gives the engine."""

    def __init__(self):
        self.learned_accepted: dict[SpecStrategy, float] = {}
        self.suffix_sums = [0.0, 0.0]  # decaying sums of accepted and expected tokens on suffix rows
        self.counts = {source: [0, 0] for source in SOURCES}

    @property
    def suffix_realized(self) -> float:
        """Accepted / expected tokens on suffix rows so far (one token of each assumed, so 1 at the start)."""
        accepted, expected = self.suffix_sums
        return (accepted + 1) / (expected + 1)

    def copy(self) -> _Record:
        return copy.deepcopy(self)


class ComposedDrafter(Drafter):
    """`learned` (EAGLE, small LM, or any drafter) and a `SuffixDrafter`, chosen per row (module docstring)."""

    kind = "composed"

    def __init__(self, learned: Drafter, suffix: SuffixDrafter):
        if not isinstance(suffix, SuffixDrafter) or isinstance(learned, (SuffixDrafter, ComposedDrafter)):
            raise ValueError(
                f"a composed drafter is a learned drafter plus a suffix drafter; got {learned.kind!r} + "
                f"{getattr(suffix, 'kind', type(suffix).__name__)!r}"
            )
        self.learned, self.suffix = learned, suffix
        self.uses_target_hidden = learned.uses_target_hidden
        self.record = _Record()
        self._last: tuple[SpecStrategy, torch.Tensor, torch.Tensor] | None = None  # strategy, suffix rows, scores

    @property
    def parts(self) -> list[str]:
        return [self.learned.kind, self.suffix.kind]

    def attribution(self) -> dict[str, dict[str, int]]:
        """Per drafter: the verifies (rows) it drafted and the draft tokens accepted on them, so far."""
        return {source: {"verifies": v, "accepted": a} for source, (v, a) in self.record.counts.items()}

    def take_attribution(self) -> dict[str, dict[str, int]]:
        """`attribution()` since the last take (an RL step's), and restart the counts."""
        counts = self.attribution()
        self.record.counts = _Record().counts
        return counts

    # ---- the drafter contract: both parts follow every row ------------------------------------------------

    def bind(self, target: torch.nn.Module) -> None:
        self.learned.bind(target)
        self.suffix.bind(target)

    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        self._last = None
        self.learned.start(tokens, hidden, lengths)
        self.suffix.start(tokens, None, lengths)

    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        if self._last is not None:
            self._learn(counts - 1)
        self.learned.append(tokens, prev_hidden, counts)
        self.suffix.append(tokens, None, counts)

    def keep(self, rows: torch.Tensor) -> None:
        self._last = None
        self.learned.keep(rows)
        self.suffix.keep(rows)

    def propose(self, strategy: SpecStrategy) -> DraftTree:
        return self._merge(strategy, lambda: self.learned.propose(strategy))

    def propose_sampled(self, strategy, sampling, generator) -> DraftTree:
        return self._merge(strategy, lambda: self.learned.propose_sampled(strategy, sampling, generator))

    # ---- the per-row choice -------------------------------------------------------------------------------

    def _merge(self, strategy: SpecStrategy, learned_draft) -> DraftTree:
        """The suffix drafts first; the learned drafter drafts only when some row keeps its draft (when every
        row takes the suffix draft, the step skips the learned drafter's cost, and a deterministic tree goes
        to the verifier, which applies the target-only rule)."""
        drafted, scores = self.suffix.propose_scored(strategy)
        scores = torch.tensor(scores, device=drafted.tokens.device)
        bar = self.record.learned_accepted.get(strategy)
        take = (
            scores * self.record.suffix_realized > bar
            if bar is not None
            else torch.zeros_like(scores, dtype=torch.bool)
        )
        self._last = (strategy, take, scores)
        if bool(take.all()):
            return drafted
        learned = learned_draft()
        if not bool(take.any()):
            return learned
        rows = take[:, None]
        tree = DraftTree(
            tokens=torch.where(rows, drafted.tokens, learned.tokens),
            parents=torch.where(rows, drafted.parents, learned.parents),
        )
        if learned.draft_probs is not None:  # a sampled chain: q one-hot on a suffix row's drafted tokens
            one_hot = torch.zeros_like(learned.draft_probs).scatter_(-1, drafted.tokens[:, 1:, None], 1.0)
            tree.draft_probs = torch.where(rows[:, :, None], one_hot, learned.draft_probs)
        return tree

    def _learn(self, accepted: torch.Tensor) -> None:
        """Fold the last verify's accepted draft tokens ([B]) into the running means and the counts."""
        strategy, take, scores = self._last
        self._last = None
        record = self.record
        accepted = accepted.to(scores.device).clamp(min=0).float()
        suffix_step = [0.0, 0.0]  # accepted, expected on this step's suffix rows
        for source, rows in zip(SOURCES, (~take, take), strict=True):
            n = int(rows.sum())
            if n == 0:
                continue
            total = float(accepted[rows].sum())
            record.counts[source][0] += n
            record.counts[source][1] += int(total)
            if source == "learned":
                old = record.learned_accepted.get(strategy, total / n)
                record.learned_accepted[strategy] = (1 - MEMORY) * old + MEMORY * total / n
            else:
                suffix_step = [total, float(scores[rows].sum())]
        # the sums decay every verify, so a suffix drafter kept off by a poor record is tried again as its
        # history grows (after about 1 / MEMORY steps its score counts nearly at face value again)
        record.suffix_sums = [
            (1 - MEMORY) * old + new for old, new in zip(record.suffix_sums, suffix_step, strict=True)
        ]

    # ---- copies and persistence ---------------------------------------------------------------------------

    def clone(self) -> ComposedDrafter:
        """An independent copy of both parts (the suffix history rebuilt) and of the record."""
        return self._with(self.learned.clone(), self.suffix.clone(), self.record.copy())

    def for_engine(self) -> ComposedDrafter:
        """The learned part cloned; the suffix history and the record shared (Drafter.for_engine)."""
        return self._with(self.learned.for_engine(), self.suffix.for_engine(), self.record)

    def probe(self) -> ComposedDrafter:
        return self._with(self.learned.probe(), self.suffix.probe(), self.record.copy())

    def _with(self, learned: Drafter, suffix: SuffixDrafter, record: _Record) -> ComposedDrafter:
        twin = type(self)(learned, suffix)
        twin.record = record
        return twin

    def save(self, path: str | Path) -> None:
        """`learned/` and `suffix/` (each a saved drafter folder) and the composition's tlt_drafter.json."""

        def fill(folder: Path) -> None:
            self.learned.save(folder / "learned")
            self.suffix.save(folder / "suffix")

        save_folder(path, fill, {"kind": self.kind, "parts": self.parts})

    @classmethod
    def load(cls, path: str | Path) -> ComposedDrafter:
        payload = read_drafter_json(path)
        if payload.get("kind") != cls.kind:
            raise ValueError(f"{path} holds another kind of drafter, not {cls.kind!r}")
        return cls(*(load_drafter(Path(path) / name) for name in SOURCES))
