"""How far one draft tree merging EAGLE's chain with a suffix chain could go beyond EAGLE alone (#25's composition).

The composed drafter (`tlt.drafters.composed`) gives each row either EAGLE's draft or the suffix drafter's. The
other design #25 names drafts both into one tree, so a verify keeps whichever branch the target follows further.
Before building it, this replays its best case on EAGLE's own rollouts: pass 1 (a plain engine, seed 2r + 1)
gives every prompt `--samples` responses of history; pass 2 (seed 2r + 2) decodes the same prompts, `--samples`
each and `--group` prompts per generate() call (one RL rank's share), with EAGLE SD at `--strategy` on every step,
while suffix drafters restored from pass 1 follow every row and draft a chain at every step (`--suffix`). After the
pass each suffix chain is compared with the tokens its row went on to emit. Those tokens are target samples, so
its match length is distributed as what the suffix branch accepts under the target-only rule (exact for
deterministic drafts, as in `eval.bench_suffix`). Per row and step the merged tree is credited with the longer of
EAGLE's realized tokens and the suffix branch's, as if the verifier knew which branch the target would follow: an
upper estimate. A merged tree drafts what EAGLE drafts and verifies more nodes, so its rollout speedup over EAGLE
alone cannot exceed the ratio of these tokens per verify; the table gives that ratio per running batch size, the
share of verifies where the suffix branch goes further, and the nodes it adds to a verify.

  OMP_NUM_THREADS=1 python -m eval.composed_ceiling --target tlt/assets/deep_v2/policy \
      --drafter tlt/assets/deep_v2/drafter --out eval/results/composed_ceiling_deep_v2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from eval.long_tail import RANGES, batch_range
from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.drafters import load_drafter
from tlt.drafters.base import Drafter
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.bench.passes import first_pass_history, measure
from tlt.eval.heldout import heldout_prompt_ids
from tlt.machine import describe_machine
from tlt.models.io import load_hf_folder
from tlt.schedulers.tuners.base import FixedTuner
from tlt.speculative.strategy import SpecStrategy

SUMS = ("verifies", "eagle", "suffix", "merged", "suffix_longer", "suffix_nodes")


class Observed(Drafter):
    """EAGLE drafts; suffix drafters follow the same rows and their chains are kept, with each row's position.

    `records` gets one entry per row and verify: (sequence, response position, running rows, EAGLE's emitted
    tokens, per suffix drafter its chain's drafted tokens)."""

    kind = "observed"

    def __init__(self, eagle: Drafter, suffixes: dict[str, tuple[SuffixDrafter, SpecStrategy]]):
        self.eagle, self.suffixes = eagle, suffixes
        self.uses_target_hidden = eagle.uses_target_hidden
        self.records: list[tuple] = []
        self._pending: list[list[list[int]]] | None = None  # per suffix drafter, per row: its drafted tokens

    def _all(self):
        return [self.eagle, *(s for s, _ in self.suffixes.values())]

    def bind(self, target):
        for d in self._all():
            d.bind(target)

    def start(self, tokens, hidden, lengths):
        self.eagle.start(tokens, hidden, lengths)
        for s, _ in self.suffixes.values():
            s.start(tokens, None, lengths)
        self.seqs, self.positions, self._pending = list(range(tokens.shape[0])), [0] * tokens.shape[0], None

    def append(self, tokens, prev_hidden, counts):
        counts_list = counts.tolist()
        if self._pending is not None:
            for row, seq in enumerate(self.seqs):
                drafts = [pending[row] for pending in self._pending]
                self.records.append((seq, self.positions[row], len(self.seqs), counts_list[row], drafts))
            self._pending = None
        self.eagle.append(tokens, prev_hidden, counts)
        for s, _ in self.suffixes.values():
            s.append(tokens, None, counts)
        self.positions = [p + n for p, n in zip(self.positions, counts_list, strict=True)]

    def keep(self, rows):
        kept = rows.tolist()
        self.seqs, self.positions = [self.seqs[r] for r in kept], [self.positions[r] for r in kept]
        for d in self._all():
            d.keep(rows)

    def _observe(self):
        self._pending = []
        for s, strategy in self.suffixes.values():
            tree = s.propose(strategy)
            tokens = tree.tokens.tolist()
            self._pending.append([t[1:n] for t, n in zip(tokens, tree.real, strict=True)])

    def propose(self, strategy):
        self._observe()
        return self.eagle.propose(strategy)

    def propose_sampled(self, strategy, sampling, generator):
        self._observe()
        return self.eagle.propose_sampled(strategy, sampling, generator)

    def save(self, path):
        raise NotImplementedError("an observing drafter exists for this benchmark only; save its parts")


def tally(records: list[tuple], responses: list[list[int]], out: dict[str, dict[str, dict]]) -> None:
    """Add the records to `out`: per suffix drafter (its keys, in the records' order) and running-batch range of
    eval.long_tail, the sums in SUMS over rows and verifies."""
    names = list(out)
    for seq, position, rows, eagle, drafts in records:
        ahead = responses[seq][position:]
        for name, draft in zip(names, drafts, strict=True):
            match = next((i for i, (a, b) in enumerate(zip(draft, ahead, strict=False)) if a != b), None)
            match = min(len(draft), len(ahead)) if match is None else match
            suffix = min(match + 1, len(ahead))  # the bonus token, unless the response ended
            sums = out[name].setdefault(batch_range(rows), dict.fromkeys(SUMS, 0))
            sums["verifies"] += 1
            sums["eagle"] += eagle
            sums["suffix"] += suffix
            sums["merged"] += max(eagle, suffix)
            sums["suffix_longer"] += suffix > eagle
            sums["suffix_nodes"] += len(draft)


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--drafter", required=True, help="saved EAGLE drafter folder")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt, in both passes")
    parser.add_argument("--group", type=int, default=2, help="prompts per generate() call in pass 2")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--strategy", default="5_1_6", help="EAGLE's strategy on every step")
    parser.add_argument(
        "--suffix",
        default="5_1_6:1,15_1_16:2,31_1_32:4",
        help="suffix chains observed, STRATEGY:SPEC_FACTOR, comma-separated",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _suffixes(spec: str, history: list[dict]) -> dict[str, tuple[SuffixDrafter, SpecStrategy]]:
    out = {}
    for item in spec.split(","):
        strategy, factor = item.split(":")
        drafter = SuffixDrafter(spec_factor=float(factor))
        drafter.restore(history)
        out[item] = (drafter, SpecStrategy.parse(strategy))
    return out


@dataclass
class Replay:
    """What a replay's passes share: the policy, its EOS id, the engines' length (room for EAGLE's widest verify
    after the longest response), the EAGLE drafter, the held-out prompts and a plain engine for first passes."""

    model: torch.nn.Module
    eos: int
    max_seq_len: int
    eagle: Drafter
    prompts: list[list[int]]
    plain: NativeEngine

    @classmethod
    def load(cls, args) -> Replay:
        model, tokenizer = load_hf_folder(args.target)
        prompts = heldout_prompt_ids(tokenizer, args.prompts)
        widest = SpecStrategy.parse(args.strategy).verify_tokens
        max_seq_len = max(map(len, prompts)) + args.max_new_tokens + widest
        plain = NativeEngine(model, tokenizer.eos_token_id, max_seq_len)
        return cls(model, tokenizer.eos_token_id, max_seq_len, load_drafter(args.drafter), prompts, plain)

    def history(self, args, round_: int) -> list[dict]:
        """Round `round_`'s suffix history: a plain pass over the prompts, `args.samples` each, seed 2r + 1."""
        return first_pass_history(self.plain, self.prompts, args.samples, args.max_new_tokens, seed=2 * round_ + 1)

    def observe(self, observed: Observed, args, seed: int, tally: Callable, sums: dict) -> None:
        """EAGLE at `args.strategy` on every step decodes the prompts at T = 1, `args.samples` each and
        `args.group` prompts per generate() call (seed: `seed` + the call's first prompt), while `observed`'s
        suffix drafters draft beside it; each call's records and responses go to `tally(records, responses,
        sums)`."""
        tuner = FixedTuner(args.strategy, threshold=1 << 30)
        engine = NativeEngine(self.model, self.eos, self.max_seq_len, tuner=tuner, drafter=observed)
        for start in range(0, len(self.prompts), args.group):
            observed.records = []
            sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=seed + start)
            rollouts = engine.generate(self.prompts[start : start + args.group], sampling, n=args.samples)
            tally(observed.records, [r.token_ids.tolist() for r in rollouts], sums)


def run(args) -> dict:
    replay = Replay.load(args)
    names = args.suffix.split(",")
    rounds = []
    for round_ in range(args.rounds):
        sums = {name: {} for name in names}
        observed = Observed(replay.eagle.clone(), _suffixes(args.suffix, replay.history(args, round_)))
        replay.observe(observed, args, 2 * round_ + 2, tally, sums)
        rounds.append(sums)
        merged = {n: _ratio(s) for n, s in sums.items()}
        print(f"[composed_ceiling] round {round_ + 1}/{args.rounds}: merged / EAGLE tokens per verify {merged}",
              file=sys.stderr)  # fmt: skip
    return {"machine": describe_machine(), "settings": vars(args), "rounds": rounds}


def _total(buckets: dict[str, dict]) -> dict:
    return {field: sum(b[field] for b in buckets.values()) for field in SUMS}


def _ratio(buckets: dict[str, dict]) -> float:
    total = _total(buckets)
    return total["merged"] / max(total["eagle"], 1)


def table(report: dict) -> str:
    s, m, rounds = report["settings"], report["machine"], report["rounds"]
    target = "/".join(Path(s["target"]).parts[-2:])
    lines = [
        f"# A merged EAGLE + suffix draft tree, best case, replayed on EAGLE's rollouts ({target})",
        "",
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T = 1, up to {s['max_new_tokens']} tokens; per "
        f"round r, pass 1 (plain, seed 2r + 1) is the suffix history, pass 2 (seed 2r + 2, {s['group']} prompts per "
        f"call) decodes with EAGLE at {s['strategy']} on every step while the suffix chains are drafted and compared "
        f"with what each row emitted. {len(rounds)} rounds. Tokens per verify: emitted per row and verify (accepted "
        "+ 1); merged: the longer of the two branches per row and verify, an upper estimate. Machine: "
        f"{m.get('cpu_model')}. Written by eval/composed_ceiling.py from composed_ceiling.json.",
        "",
        "| suffix chain (strategy:spec factor) | running rows | verifies | tokens per verify: EAGLE / suffix / merged "
        "| merged / EAGLE, per round: median (min-max) | suffix branch longer | suffix nodes per verify |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in s["suffix"].split(","):
        keys = [batch_range(low) for low, _ in RANGES if any(batch_range(low) in r[name] for r in rounds)]
        for key in [*keys, "all"]:
            parts = [r[name] if key == "all" else {key: r[name][key]} for r in rounds if key == "all" or key in r[name]]
            ratios = [_ratio(p) for p in parts]
            t = _total({str(i): _total(p) for i, p in enumerate(parts)})
            v = max(t["verifies"], 1)
            lines.append(
                f"| {name} | {key} | {t['verifies']} | {t['eagle'] / v:.2f} / {t['suffix'] / v:.2f} / "
                f"{t['merged'] / v:.2f} | {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f}x) | "
                f"{t['suffix_longer'] / v:.1%} | {t['suffix_nodes'] / v:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "composed_ceiling.md")


if __name__ == "__main__":
    sys.exit(main())
