"""A learned drafter composed with the suffix drafter: per row and step, the draft expected to go further.

Both drafters follow every row (start / append / keep go to both); each decode step a row takes the suffix
drafter's draft when the tokens it expects accepted exceed what the learned drafter has been accepting at this
strategy (a running mean of its accepted tokens per verify, per strategy), and the learned drafter's draft
otherwise. A strategy the learned drafter has not drafted yet gets the learned draft on every row.

The suffix drafter's expectation is its score (how often the prompt's history continued that way, summed over
the draft) times a trust that depends on how long a suffix of the row's context the history matched. Scores
alone mislead both ways: a continuation seen once scores as certain, and on text a policy has not written before
a 1-7 token match is mostly chance (deep_v2, new prompts: its drafts were followed for 0.4-0.7 of their score),
while a 16-31 token match is mostly text written before coming back (followed for 1.15-1.5 of it;
eval/results/suffix_trust_deep_v2). So the trust is
measured per class of match length (1, 2-3, 4-7, 8-15, 16-31, 32+): the tokens the rows went on to emit followed
the class's drafts for so many tokens, over the drafts' scores (sums over about the last 20 steps that had such
drafts, one expected token assumed, so 0 before any). Every row's suffix draft counts, taken or not: the suffix
drafter drafts every row anyway, and the tokens a row emitted show how far its suffix draft would have been
accepted (exactly on a suffix row; on a learned row up to the tokens it emitted, so never more than what the
learned draft got plus one). So rows keep the learned drafter's drafts unless the history has seen their text (a
prompt's second epoch, a sibling that finished, a row repeating itself) and such matches have been right, at the
cost of one suffix lookup per row and step. What it measured: docs/results.md (the suffix drafter).

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
import json
from pathlib import Path

import torch

from tlt.drafters import load_drafter, read_drafter_json, save_folder
from tlt.drafters.base import Drafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.files import read_json
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

SOURCES = ("learned", "suffix")
MEMORY = 0.05  # weight of the newest step in the running means (about the last 20 steps)
RECORD_FILE = "record.json"
MATCH_CLASSES = 6  # the suffix drafts' match lengths, in classes 1, 2-3, 4-7, 8-15, 16-31, 32 and more


def match_class(match: int) -> int:
    return min(max(match, 1).bit_length() - 1, MATCH_CLASSES - 1)


class _Record:
    """What the choice learns from: the learned drafter's running mean of accepted tokens per verify (per
    strategy), per match-length class the running sums of the tokens suffix drafts were followed for and of
    their scores, and per drafter the verifies drafted and draft tokens accepted. Shared by a drafter and the
    copy a push gives the engine."""

    def __init__(self):
        self.learned_accepted: dict[SpecStrategy, float] = {}
        self.suffix_sums = [[0.0, 0.0] for _ in range(MATCH_CLASSES)]  # followed, expected tokens
        self.counts = {source: [0, 0] for source in SOURCES}

    def trust(self, match: int) -> float:
        """Followed / expected tokens of the suffix drafts whose match length is in this one's class, so far
        (one expected token assumed, so 0 before any)."""
        followed, expected = self.suffix_sums[match_class(match)]
        return followed / (expected + 1)

    def copy(self) -> _Record:
        return copy.deepcopy(self)

    def state(self) -> dict:
        """What `save` keeps of it (the counts are per run, not kept)."""
        learned = {str(strategy): value for strategy, value in self.learned_accepted.items()}
        return {"learned_accepted": learned, "suffix_sums": self.suffix_sums}

    @classmethod
    def from_state(cls, state: dict, source: Path) -> _Record:
        """The record `state()` described; a ValueError naming `source` when it is not one."""
        record = cls()
        try:
            learned = {SpecStrategy.parse(k): float(v) for k, v in state["learned_accepted"].items()}
            sums = [[float(followed), float(expected)] for followed, expected in state["suffix_sums"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{source}: not a composed drafter's record ({e!r})") from e
        if len(sums) != MATCH_CLASSES or min(min(pair) for pair in sums) < 0:
            raise ValueError(f"{source}: suffix_sums must be {MATCH_CLASSES} pairs of numbers >= 0, got {sums}")
        record.learned_accepted, record.suffix_sums = learned, sums
        return record


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
            self._learn(tokens, counts)
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
        scored = self.suffix.propose_scored(strategy)
        drafted, record = scored.tree, self.record
        bar = record.learned_accepted.get(strategy)
        take = [bar is not None and row.score * record.trust(row.match) > bar for row in scored.rows]
        self._last = (strategy, take, scored.rows)
        if all(take):
            return drafted
        learned = learned_draft()
        if not any(take):
            return learned
        rows = torch.tensor(take, device=drafted.tokens.device)[:, None]
        tree = DraftTree(
            tokens=torch.where(rows, drafted.tokens, learned.tokens),
            parents=torch.where(rows, drafted.parents, learned.parents),
        )
        if learned.draft_probs is not None:  # a sampled chain: q one-hot on a suffix row's drafted tokens
            one_hot = torch.zeros_like(learned.draft_probs).scatter_(-1, drafted.tokens[:, 1:, None], 1.0)
            tree.draft_probs = torch.where(rows[:, :, None], one_hot, learned.draft_probs)
        return tree

    def _learn(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Fold the last verify into the record: the accepted tokens of the learned rows into its running mean,
        every row's suffix draft (taken or not) with the tokens the row emitted into its match class's sums,
        and the counts."""
        strategy, take, drafts = self._last
        self._last = None
        record, step = self.record, {}
        learned = [0, 0]  # rows, accepted tokens
        for took, draft, emitted, n in zip(take, drafts, tokens.tolist(), counts.tolist(), strict=True):
            source = record.counts["suffix" if took else "learned"]
            source[0] += 1
            source[1] += n - 1
            if not took:
                learned[0] += 1
                learned[1] += n - 1
            if draft.real > 1:  # followed: exact on a suffix row; on a learned row at most its n emitted tokens
                sums = step.setdefault(match_class(draft.match), [0.0, 0.0])
                sums[0] += draft.followed(emitted[:n])
                sums[1] += draft.score
        if learned[0]:
            mean = learned[1] / learned[0]
            old = record.learned_accepted.get(strategy, mean)
            record.learned_accepted[strategy] = (1 - MEMORY) * old + MEMORY * mean
        for cls, (followed, expected) in step.items():
            old = record.suffix_sums[cls]
            record.suffix_sums[cls] = [(1 - MEMORY) * old[0] + followed, (1 - MEMORY) * old[1] + expected]

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
        """`learned/` and `suffix/` (each a saved drafter folder), the choice's record (`record.json`: the learned
        drafter's running means and the trust per match class, so a resumed run keeps them) and the
        composition's tlt_drafter.json."""
        record = self.record.state()

        def fill(folder: Path) -> None:
            self.learned.save(folder / "learned")
            self.suffix.save(folder / "suffix")
            (folder / RECORD_FILE).write_text(json.dumps(record))

        save_folder(path, fill, {"kind": self.kind, "parts": self.parts})

    @classmethod
    def load(cls, path: str | Path) -> ComposedDrafter:
        payload = read_drafter_json(path)
        if payload.get("kind") != cls.kind:
            raise ValueError(f"{path} holds another kind of drafter, not {cls.kind!r}")
        drafter = cls(*(load_drafter(Path(path) / name) for name in SOURCES))
        record = Path(path) / RECORD_FILE
        if record.is_file():  # folders saved before the record was kept start a fresh one
            drafter.record = _Record.from_state(read_json(record), record)
        return drafter
