"""Suffix drafting: model-free drafts from what was already written for the same prompt.

In GRPO every prompt is sampled n times per step, and in multi-epoch RL it comes back step after step; the
responses share long spans. This drafter matches the end of a row's context against suffix trees over

  (a) the prompt, (b) the row's own response,
  (c) the responses of the other rows of the same prompt in this generate() call, as they grow (running and
      finished rows alike),
  (d) earlier responses to the same prompt, from previous generate() calls (steps), kept across calls and
      weight updates,

and drafts the continuation the trees have seen most often (a chain), or when topk > 1 a tree of the most frequent
continuations (arctic's best-first expansion up to the strategy's node count, then cut to its depth and width), as
far as the match allows (the draft follows the match length: at most `spec_factor` x the matched tokens, nodes for
a tree, and only tokens whose path the history followed at least `min_token_prob` of the time), padded to the
strategy's node count with filler. The tree says how many nodes each row drafted (`DraftTree.real`), so the native
engine verifies only those: as wide as the longest draft of the step, the target computing the drafted nodes only,
and a plain step when no row drafted anything. Drafts are deterministic, so the engine verifies them with the
target-only rule and SD stays lossless.

The index is arctic-inference's C++ `SuffixTree` (the suffix trees of the suffix-decoding library vLLM uses;
microseconds per row and step). Per distinct prompt (keyed by its token ids) one tree over its responses (b, c,
d), each response stored after the prompt's last `max_depth` tokens, so that a new row matches earlier responses
from its first decode step on, and the prompt (a) is in it with every response (arctic's own
`SuffixDecodingCache` keeps responses without their prompt, which a first step cannot match, and evicts only by
count). A prompt longer than that lead gets a second tree over the whole prompt, and a draft comes from the tree
whose match scores higher. (A separate prompt tree for every prompt, as before, drafted worse: its continuations
are seen once, so they score as certain and won over the responses' tree; with 21-44 token prompts, dropping it
raised tokens per verify by 2-8%, docs/results.md.) What is kept: per prompt at most `history_responses` finished
responses (oldest out first; running ones are never evicted), over all prompts at most `history_tokens` stored
tokens (least recently used prompt out first; the prompts of the running call stay). The store is saved with the drafter
(`history.json`) and restored by `load`, so a resumed RL run keeps it. In an RL run on several ranks every rank's
store takes in the other ranks' responses after each step (`add_history`), so a prompt finds its earlier responses
whichever rank draws it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from tlt.drafters import read_drafter_json, save_folder
from tlt.drafters.base import Drafter
from tlt.drafters.ngram import _Trie, host_tensor
from tlt.files import read_json
from tlt.speculative.strategy import SpecStrategy
from tlt.speculative.tree import DraftTree

INSTALL_HINT = (
    "the suffix drafter needs arctic-inference 0.3.0 (C++ suffix trees): `make install` builds it from its sdist, "
    "or `pip install nanobind==2.9.2 ninja cmake && pip install --no-build-isolation arctic-inference==0.3.0`"
)
HISTORY_FILE = "history.json"


@dataclass
class RowDraft:
    """One row's draft as lists, with what the history knows of it: `score`, the tokens it expects accepted
    (arctic's score over the kept nodes: for a chain, the expected accepted length were the history's frequencies
    the target's probabilities), and `match`, the length of the context's suffix the history matched (0: no
    draft)."""

    tokens: list[int]
    parents: list[int]
    real: int  # drafted nodes, the root included; filler after them
    score: float
    match: int

    def followed(self, emitted: list[int]) -> int:
        """Draft nodes the emitted tokens follow from the root: the draft tokens a verify of this draft accepted,
        or would have accepted had these tokens been its target's (a row another drafter drafted)."""
        node, depth = 0, 0
        for token in emitted:
            child = range(node + 1, self.real)  # a node's children come after it
            node = next((i for i in child if self.parents[i] == node and self.tokens[i] == token), None)
            if node is None:
                return depth
            depth += 1
        return depth


@dataclass
class ScoredDrafts:
    """A step's drafts: the batch's tree and each row's `RowDraft`."""

    tree: DraftTree
    rows: list[RowDraft]


def suffix_tree_class():
    """arctic-inference's SuffixTree, or an ImportError that says how to install it."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return SuffixTree


class _PromptHistory:
    """The index of one prompt: a tree over its responses (each led by the prompt's last `max_depth` tokens, one
    sequence per response), a tree over the prompt when the prompt is longer than that lead, and the response
    tokens (to count, evict and save them)."""

    def __init__(self, prompt: list[int], max_depth: int, max_responses: int):
        tree = suffix_tree_class()
        self.prompt, self.max_responses = prompt, max_responses
        self.lead = prompt[-max_depth:]
        self.tree = tree(max_depth)
        self.trees = [self.tree]
        if len(prompt) > max_depth:  # else every response's lead holds the whole prompt
            self.trees.insert(0, tree(max_depth))
            self.trees[0].extend(0, prompt)
        self.responses: OrderedDict[int, list[int]] = OrderedDict()  # sequence id -> tokens, oldest first
        self.running: set[int] = set()
        self.next_id = 0

    def start(self) -> int:
        seq, self.next_id = self.next_id, self.next_id + 1
        self.tree.extend(seq, self.lead)
        self.responses[seq] = []
        self.running.add(seq)
        return seq

    def add(self, seq: int, tokens: list[int]) -> None:
        self.tree.extend(seq, tokens)
        self.responses[seq].extend(tokens)

    def finish(self, seq: int) -> None:
        """The response is complete; the oldest finished ones beyond max_responses leave the index."""
        self.running.discard(seq)
        finished = [s for s in self.responses if s not in self.running]
        for old in finished[: max(len(self.responses) - self.max_responses, 0)]:
            self.tree.remove(old)
            del self.responses[old]

    def speculate(self, context: list[int], steps: int, factor: float, min_prob: float, tree: bool):
        """The better-scoring draft of the trees (arctic's `Draft`: token_ids, parents, score, match_len)."""
        drafts = [t.speculate(context, steps, factor, 0.0, min_prob, tree) for t in self.trees]
        return max(drafts, key=lambda d: d.score)

    @property
    def tokens(self) -> int:
        """Tokens stored in the responses' tree."""
        return sum(len(self.lead) + len(r) for r in self.responses.values())


class _Row:
    """A running row: its prompt's history, its sequence id there, and its context's last tokens."""

    def __init__(self, history: _PromptHistory, request: int, context: list[int], max_depth: int):
        self.history, self.request, self.max_depth = history, request, max_depth
        self.context = context[-max_depth:]

    def extend(self, tokens: list[int]) -> None:
        self.history.add(self.request, tokens)
        self.context = (self.context + tokens)[-self.max_depth :]


class SuffixDrafter(Drafter):
    """Suffix-tree drafter over the prompt, the row's response and the prompt's other and earlier responses.

    Args:
        history_tokens: response tokens kept over all prompts (least-recently-used prompt evicted first).
        history_responses: responses kept per prompt (oldest evicted first).
        max_depth: the suffix trees' depth (longest match and draft considered).
        spec_factor: a draft is at most spec_factor x the matched length (and the strategy's steps) long.
        min_token_prob: a drafted token must have followed the match at least this often (its share).
    """

    kind = "suffix"
    uses_target_hidden = False

    @classmethod
    def from_config(cls, cfg, target, seed: int = 0) -> SuffixDrafter:
        return cls(
            history_tokens=cfg.history_tokens,
            history_responses=cfg.history_responses,
            spec_factor=cfg.suffix_spec_factor,
            min_token_prob=cfg.suffix_min_token_prob,
        )

    def __init__(
        self,
        history_tokens: int = 1_000_000,
        history_responses: int = 64,
        max_depth: int = 64,
        spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ):
        if history_tokens < 0 or history_responses < 0 or max_depth < 1:
            raise ValueError(
                f"need history_tokens >= 0, history_responses >= 0, max_depth >= 1; got {history_tokens}, "
                f"{history_responses}, {max_depth}"
            )
        if not spec_factor > 0 or not 0 <= min_token_prob <= 1:
            raise ValueError(f"need spec_factor > 0 and min_token_prob in [0, 1]; got {spec_factor}, {min_token_prob}")
        suffix_tree_class()  # fail at construction, with the install hint, when arctic-inference is missing
        self.history_tokens, self.history_responses, self.max_depth = history_tokens, history_responses, max_depth
        self.spec_factor, self.min_token_prob = spec_factor, min_token_prob
        self.histories: OrderedDict[tuple[int, ...], _PromptHistory] = OrderedDict()  # least recently used first
        self.rows: list[_Row] = []
        self.device = torch.device("cpu")

    def bind(self, target: torch.nn.Module) -> None:
        self.device = next(target.parameters()).device

    def start(self, tokens: torch.Tensor, hidden: torch.Tensor | None, lengths: torch.Tensor) -> None:
        self._stop_rows()
        self.rows = []
        for prompt, n in zip(tokens.tolist(), lengths.tolist(), strict=True):
            history = self._history(prompt[:n])
            self.rows.append(_Row(history, history.start(), prompt[:n], self.max_depth))
        self._evict(keep={row.history for row in self.rows})

    def _history(self, prompt: list[int]) -> _PromptHistory:
        key = tuple(prompt)
        if key not in self.histories:
            self.histories[key] = _PromptHistory(prompt, self.max_depth, self.history_responses)
        self.histories.move_to_end(key)
        return self.histories[key]

    def _evict(self, keep: set) -> None:
        """Drop least-recently-used prompts (not in `keep`) until the responses fit history_tokens."""
        total = sum(h.tokens for h in self.histories.values())
        for key in list(self.histories):
            if total <= self.history_tokens:
                return
            if self.histories[key] not in keep:
                total -= self.histories.pop(key).tokens

    def _stop_rows(self, rows: list[_Row] | None = None) -> None:
        for row in self.rows if rows is None else rows:
            row.history.finish(row.request)

    def append(self, tokens: torch.Tensor, prev_hidden: torch.Tensor | None, counts: torch.Tensor) -> None:
        for row, new, n in zip(self.rows, tokens.tolist(), counts.tolist(), strict=True):
            row.extend(new[:n])

    def keep(self, rows: torch.Tensor) -> None:
        kept = rows.tolist()
        dropped = set(range(len(self.rows))) - set(kept)
        self._stop_rows([self.rows[r] for r in dropped])  # their responses stay in the prompt's history
        self.rows = [self.rows[r] for r in kept]

    def propose(self, strategy: SpecStrategy) -> DraftTree:
        return self.propose_scored(strategy).tree

    def propose_scored(self, strategy: SpecStrategy) -> ScoredDrafts:
        """The drafts with, per row, the history's own expectation of them and its match length."""
        rows = [self._row_draft(row, strategy) for row in self.rows]
        both = host_tensor([[row.tokens for row in rows], [row.parents for row in rows]], self.device)
        tree = DraftTree(tokens=both[0], parents=both[1], real=[row.real for row in rows])  # one host copy
        return ScoredDrafts(tree, rows)

    def _row_draft(self, row: _Row, strategy: SpecStrategy) -> RowDraft:
        """The row's draft: arctic's chain or tree, cut to the strategy, then filler."""
        tree = strategy.topk > 1  # a tree's node budget is the strategy's nodes; the trie cuts it to its shape
        budget = strategy.verify_tokens - 1 if tree else strategy.steps
        draft = row.history.speculate(row.context, budget, self.spec_factor, self.min_token_prob, tree)
        root, N = row.context[-1], strategy.verify_tokens
        if not tree:  # a chain: no tree bookkeeping
            kept = draft.token_ids[: min(strategy.steps, N - 1)]
            tokens = [root, *kept]
            real = len(tokens)
            score = sum(draft.probs[: len(kept)])
            return RowDraft(tokens + [root] * (N - real), list(range(-1, N - 1)), real, score, draft.match_len)
        trie, nodes = _Trie(root, strategy), []
        for token, parent in zip(draft.token_ids, draft.parents, strict=True):  # topological: parents first
            under = 0 if parent < 0 else nodes[parent]
            nodes.append(None if under is None else trie.attach(under, token))
        trie.pad(root)
        score = sum(p for p, node in zip(draft.probs, nodes, strict=True) if node is not None)  # of the kept nodes
        return RowDraft(trie.tokens, trie.parents, trie.real, score, draft.match_len)

    def for_engine(self) -> SuffixDrafter:
        return self  # its history is what the engine feeds it (Drafter.for_engine)

    def probe(self) -> SuffixDrafter:
        return type(self)(**self.config())

    def clone(self) -> SuffixDrafter:
        """A copy with the same settings and history store (the C++ trees are rebuilt, not deep-copied)."""
        twin = type(self)(**self.config())
        twin.restore(self.history())
        twin.device = self.device
        return twin

    # ---- persistence -------------------------------------------------------------------------------------

    def config(self) -> dict:
        return {
            "history_tokens": self.history_tokens,
            "history_responses": self.history_responses,
            "max_depth": self.max_depth,
            "spec_factor": self.spec_factor,
            "min_token_prob": self.min_token_prob,
        }

    def history(self) -> list[dict]:
        """The store, least recently used prompt first: each prompt and its cached responses, oldest first."""
        return [{"prompt": h.prompt, "responses": list(h.responses.values())} for h in self.histories.values()]

    def restore(self, history: list[dict]) -> None:
        """Rebuild the store from `history()` (the running rows are dropped)."""
        self.rows, self.histories = [], OrderedDict()
        self.add_history(history)

    def add_history(self, history: list[dict]) -> None:
        """Add finished responses (entries as `history()` gives them) to the store, as if this drafter had seen
        them: another rank's rollouts, so that a prompt finds its earlier responses whichever rank drew it."""
        if not isinstance(history, list):
            raise ValueError(f"a suffix drafter history is a list of prompt entries, got {type(history).__name__}")
        for i, entry in enumerate(history):
            if not isinstance(entry, dict) or not {"prompt", "responses"} <= set(entry):
                raise ValueError(f"suffix drafter history entry {i}: expected {{'prompt': [...], 'responses': [...]}}")
            prompt_history = self._history([int(t) for t in entry["prompt"]])
            for response in entry["responses"]:
                seq = prompt_history.start()
                prompt_history.add(seq, [int(t) for t in response])
                prompt_history.finish(seq)
        self._evict(keep={row.history for row in self.rows})

    def save(self, path: str | Path) -> None:
        """The config (`tlt_drafter.json`) and the history store (`history.json`), atomically."""
        history = self.history()

        def fill(folder: Path) -> None:
            (folder / HISTORY_FILE).write_text(json.dumps(history))

        save_folder(path, fill, {"kind": self.kind, **self.config()})

    @classmethod
    def load(cls, path: str | Path) -> SuffixDrafter:
        payload = read_drafter_json(path)
        if payload.pop("kind") != cls.kind:
            raise ValueError(f"{path} holds another kind of drafter, not {cls.kind!r}")
        drafter = cls(**payload)
        history = Path(path) / HISTORY_FILE
        if history.is_file():
            entries = read_json(history)
            try:
                drafter.restore(entries)
            except ValueError as e:
                raise ValueError(f"{history}: not a suffix drafter history ({e})") from e
        return drafter
