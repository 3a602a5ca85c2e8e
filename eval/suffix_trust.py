"""How far the suffix drafter's drafts are followed, by the length of the match they come from, against their scores
and against EAGLE on the same rows: the evidence behind the composed drafter's trust per match class
(`tlt.drafters.composed`).

Per round r, EAGLE decodes `--prompts` held-out prompts x `--samples` at T = 1 (`--group` prompts per generate()
call, one RL rank's share; SD at `--strategy` on every step) twice: on prompts new to the suffix drafter (its
history only what the call itself writes: the row's own response, its siblings as they grow), and a pass later
(its history restored from a plain pass, seed 2r + 1, as a prompt's next RL epoch finds it). A suffix drafter
follows every row and drafts a chain at the same strategy each step; after the pass each chain is compared with
the tokens its row went on to emit. Those are target samples, so the tokens the chain is followed for are
distributed as what the target-only rule would accept of it. Reported per pass and match class: the verifies, the
chains' mean score (the history's own expectation of accepted tokens), the mean tokens followed, their ratio
(what the composed drafter learns as its trust; median and range over rounds) and EAGLE's accepted tokens per
verify on the same rows.

  OMP_NUM_THREADS=1 python -m eval.suffix_trust --target tlt/assets/deep_v2/policy \
      --drafter tlt/assets/deep_v2/drafter --out eval/results/suffix_trust_deep_v2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from eval.composed_ceiling import Observed, Replay
from tlt.drafters.composed import MATCH_CLASSES, match_class
from tlt.drafters.suffix import SuffixDrafter
from tlt.eval.bench.passes import measure
from tlt.machine import describe_machine
from tlt.speculative.strategy import SpecStrategy

PASSES = ("new prompts", "a pass later")
CLASS_NAMES = [f"{1 << c}-{(2 << c) - 1}" if c < MATCH_CLASSES - 1 else f">= {1 << c}" for c in range(MATCH_CLASSES)]
SUMS = ("verifies", "score", "followed", "eagle_accepted")


class ScoredObserver(Observed):
    """`Observed` keeping each row's whole suffix draft (`RowDraft`: tokens, score, match length)."""

    def _observe(self):
        self._pending = [s.propose_scored(strategy).rows for s, strategy in self.suffixes.values()]


def tally(records: list[tuple], responses: list[list[int]], out: dict[str, dict]) -> None:
    """Add the records (`Observed.records`, one suffix drafter's RowDrafts) to `out`: per match class the sums in
    SUMS over rows with a suffix draft."""
    for seq, position, _, emitted, (draft,) in records:
        if draft.real < 2:
            continue
        sums = out.setdefault(CLASS_NAMES[match_class(draft.match)], dict.fromkeys(SUMS, 0.0))
        sums["verifies"] += 1
        sums["score"] += draft.score
        sums["followed"] += draft.followed(responses[seq][position:])
        sums["eagle_accepted"] += emitted - 1


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--drafter", required=True, help="saved EAGLE drafter folder")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--group", type=int, default=2, help="prompts per generate() call")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--strategy", default="5_1_6", help="EAGLE's strategy on every step, and the suffix chain's")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    return parser.parse_args(argv)


def _pass(replay: Replay, history: list[dict], args, seed: int) -> dict:
    suffix = SuffixDrafter()
    suffix.restore(history)
    observed = ScoredObserver(replay.eagle.clone(), {args.strategy: (suffix, SpecStrategy.parse(args.strategy))})
    sums: dict[str, dict] = {}
    replay.observe(observed, args, seed, tally, sums)
    return sums


def run(args) -> dict:
    replay = Replay.load(args)
    rounds = []
    for round_ in range(args.rounds):
        passes = [_pass(replay, h, args, 2 * round_ + 2) for h in ([], replay.history(args, round_))]
        rounds.append(passes)
        trust = [{c: round(s["followed"] / s["score"], 2) for c, s in p.items()} for p in passes]
        print(f"[suffix_trust] round {round_ + 1}/{args.rounds}: followed / score per class {trust}", file=sys.stderr)
    return {"machine": describe_machine(), "settings": vars(args), "rounds": rounds}


def table(report: dict) -> str:
    s, m, rounds = report["settings"], report["machine"], report["rounds"]
    lines = [
        f"# Suffix drafts by match length: followed against their scores and EAGLE ({Path(s['target']).name})",
        "",
        f"{s['prompts']} held-out prompts x {s['samples']} samples, T = 1, up to {s['max_new_tokens']} tokens, "
        f"{s['group']} prompts per call, EAGLE at {s['strategy']} on every step with a suffix chain of the same "
        f"strategy drafted beside it; new prompts: the history only what the call writes; a pass later: the history "
        f"restored from a plain pass (seed 2r + 1). {len(rounds)} rounds (pass seed 2r + 2). Followed: the tokens "
        "the row went on to emit that the chain predicted (distributed as what the target-only rule accepts); "
        "score: the history's expectation of them; EAGLE accepted: on the same rows and verifies. Machine: "
        f"{m.get('cpu_model')}. Written by eval/suffix_trust.py from suffix_trust.json.",
        "",
        "| pass | match length | verifies | score | followed | followed / score: all rounds; per round median "
        "(min-max) | EAGLE accepted |",
        "|---|---|---|---|---|---|---|",
    ]
    for number, when in enumerate(PASSES):
        for name in CLASS_NAMES:
            parts = [r[number][name] for r in rounds if name in r[number]]
            if not parts:
                continue
            total = {k: sum(p[k] for p in parts) for k in SUMS}
            v = total["verifies"]
            ratios = [p["followed"] / p["score"] for p in parts if p["score"]]
            spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            lines.append(
                f"| {when} | {name} | {v:.0f} | {total['score'] / v:.2f} | {total['followed'] / v:.2f} | "
                f"{total['followed'] / max(total['score'], 1e-9):.2f}; {spread} | {total['eagle_accepted'] / v:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    return measure(_args(argv), run, table, "suffix_trust.md")


if __name__ == "__main__":
    sys.exit(main())
