"""Arms compared on two passes over the same prompts, in interleaved rounds (eval/bench_composed.py,
eval/bench_ragged.py): the round loop, and the sums a pass reports from the engine's step stats."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine


def two_pass_rounds(
    arms: Sequence[str],
    rounds: int,
    make_engine: Callable[[str], NativeEngine],
    run_pass: Callable[[NativeEngine, SamplingParams], dict],
    max_new_tokens: int,
    label: str,
) -> list[dict[str, list[dict]]]:
    """`rounds` rounds; in round r every arm, in an order rotated by r, gets a fresh engine and runs two passes at
    T = 1 with seeds 2r + 1 and 2r + 2 (the round's own sample set; pass 2 finds what pass 1 left in the drafter).
    Returns per round {arm: [pass 1, pass 2]}; a line per pass goes to stderr (seconds and tokens)."""
    results = []
    for round_ in range(rounds):
        shift = round_ % len(arms)
        passes: dict[str, list[dict]] = {}
        for arm in [*arms[shift:], *arms[:shift]]:
            engine = make_engine(arm)
            passes[arm] = []
            for seed in (2 * round_ + 1, 2 * round_ + 2):
                sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
                passes[arm].append(run_pass(engine, sampling))
                r = passes[arm][-1]
                print(
                    f"[{label}] round {round_ + 1}/{rounds} {arm} pass {len(passes[arm])}: {r['seconds']:.1f} s, "
                    f"{r['tokens']} tokens",
                    file=sys.stderr,
                )
        results.append(passes)
    return results


def sd_sums(step_stats) -> dict[str, int]:
    """Over the steps that decoded speculatively: row-verifies, accepted and drafted tokens, tokens generated."""
    sd = [s for s in step_stats if s.sd_on]
    return {
        "sd_verifies": sum(s.running_batch for s in sd),
        "accepted": sum(s.accepted_tokens for s in sd),
        "drafted": sum(s.drafted_tokens for s in sd),
        "sd_tokens": sum(s.generated_tokens for s in sd),
    }


def tokens_per_second(run: dict) -> float:
    return run["tokens"] / run["seconds"]
