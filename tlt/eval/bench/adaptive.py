"""Adaptive rollout benchmark: long-tail rollout wall time with each SD tuner, side by side in one process.

Configurations (same target, drafter, prompts, seeds):
  sd-never        plain decoding throughout, no drafter attached (what an RL run with TLT off decodes)
  always-<s>      SD with strategy s on every step, whatever the batch size (one per strategy)
  reference       the reference code's scheme: SD only at <= 32 running sequences, one fixed strategy per
                  batch-size bucket [1], [2-4], [5-20], [21+] chosen greedily (BEG with epsilon 0)
  adaptive-<k>    a learning tuner (cost, beg, ucb1) over all strategies, no manual settings

Each configuration runs one untimed warm-up rollout (learning tuners keep what they learned, as they would
across RL steps), then `--repeats` timed rollouts; medians are reported. Rounds are interleaved (round r of
every configuration before round r + 1 of any), so slow drift of a shared machine does not favour one.
Also writes the adaptive tuner's decisions (SD on/off and strategy per running batch size) as a table over the
decode steps of all timed rounds and a PNG of the last rollout's steps, and the tuner's own cost per decode step.

  python -m tlt.eval.bench.adaptive --target runs/quickstart/model --drafter runs/quickstart/drafter \
      --prompts 16 --samples 8 --out runs/bench-adaptive
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from tlt.backends.base import SamplingParams
from tlt.backends.native import NativeEngine
from tlt.files import atomic_save_figure, subplots, write_report
from tlt.schedulers.tuners import FixedTuner, OffTuner, build_tuner

REFERENCE_BUCKETS = (1, 4, 20, 32)  # SD only at <= 32 running sequences, as the reference


class TimedTuner:
    """Wraps a tuner and accumulates the seconds spent in select() and update() (the tuner's overhead)."""

    def __init__(self, tuner):
        self.tuner, self.seconds, self.calls = tuner, 0.0, 0

    def select(self, batch_size):
        start = time.perf_counter()
        arm = self.tuner.select(batch_size)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return arm

    def update(self, strategy, batch_size, generated_tokens, seconds):
        start = time.perf_counter()
        self.tuner.update(strategy, batch_size, generated_tokens, seconds)
        self.seconds += time.perf_counter() - start


class ReferenceTuner:
    """The reference's scheme: a fixed strategy per batch-size bucket, SD off above the last bound (32).

    What the reference's BEG does with its default strategies (one per bucket, so it never explores).
    """

    def __init__(self, per_bucket: list[str], bounds: tuple[int, ...] = REFERENCE_BUCKETS):
        from tlt.speculative.strategy import SpecStrategy

        self.bounds, self.arms = bounds, [SpecStrategy.parse(s) for s in per_bucket]

    def select(self, batch_size):
        return next((arm for bound, arm in zip(self.bounds, self.arms, strict=True) if batch_size <= bound), None)

    def update(self, strategy, batch_size, generated_tokens, seconds):
        pass


def tuners(strategies: list[str], seed: int) -> dict[str, object]:
    """Fresh tuner per configuration name; the reference maps buckets, smallest first, to the strategies
    from the deepest to the shallowest (as its 8_4_48 .. 8_4_8 list)."""
    out: dict[str, object] = {"sd-never": OffTuner()}
    for s in strategies:
        out[f"always-{s}"] = FixedTuner(s, threshold=10**9)
    deep_first = sorted(strategies, key=lambda s: -int(s.split("_")[2]))
    out["reference"] = ReferenceTuner([deep_first[min(i, len(deep_first) - 1)] for i in range(len(REFERENCE_BUCKETS))])
    for kind in ("cost", "beg", "ucb1"):
        out[f"adaptive-{kind}"] = build_tuner(kind, strategies, seed=seed)
    return out


def run_round(engine: NativeEngine, prompts, params: SamplingParams, n: int, round_index: int) -> dict:
    """One rollout with the round's seed: wall seconds, tokens and acceptance stats."""
    seeded = SamplingParams(**{**params.__dict__, "seed": params.seed + round_index})
    start = time.perf_counter()
    rollouts = engine.generate(prompts, seeded, n=n)
    wall = time.perf_counter() - start
    sd_steps = [s for s in engine.step_stats if s.sd_on]
    all_tokens = sum(s.generated_tokens for s in engine.step_stats)
    return {
        "wall": wall,
        "tokens": sum(len(x.token_ids) for x in rollouts),
        "accepted": sum(s.accepted_tokens for s in sd_steps) / max(1, sum(s.running_batch for s in sd_steps)),
        "sd_share": sum(s.generated_tokens for s in sd_steps) / max(1, all_tokens),
        "decisions": [(s.running_batch, s.strategy) for s in engine.step_stats],
    }


def summarise(rounds: list[dict], engine: NativeEngine) -> dict:
    """Medians over the timed rounds, plus the tuner's overhead and its decisions (all timed rounds, and the
    last rollout's in step order)."""
    walls = [r["wall"] for r in rounds]
    return {
        "wall_s": statistics.median(walls),
        "walls": walls,
        "tokens": statistics.median(r["tokens"] for r in rounds),
        "tokens_per_s": statistics.median(r["tokens"] / r["wall"] for r in rounds),
        "accepted_per_verify": statistics.median(r["accepted"] for r in rounds),
        "sd_token_share": statistics.median(r["sd_share"] for r in rounds),
        "tuner_us_per_step": 1e6 * engine.tuner.seconds / max(1, engine.tuner.calls),
        "decisions": [d for r in rounds for d in r["decisions"]],
        "decisions_last": rounds[-1]["decisions"],
        "steps_last": len(engine.step_stats),
    }


def decision_table(decisions: list[tuple[int, str | None]]) -> dict[str, dict[str, float]]:
    """Share of decode steps per choice ("plain" or a strategy), per power-of-two batch-size range."""
    by_range: dict[str, Counter] = defaultdict(Counter)
    for batch, strategy in decisions:
        lo = 1 << (batch.bit_length() - 1)
        by_range[f"{lo}-{2 * lo - 1}"][strategy or "plain"] += 1
    order = sorted(by_range, key=lambda k: int(k.split("-")[0]))
    return {k: {arm: c / sum(by_range[k].values()) for arm, c in by_range[k].most_common()} for k in order}


def plot_decisions(decisions: list[tuple[int, str | None]], path: Path, title: str) -> None:
    arms = sorted({s or "plain" for _, s in decisions}, key=lambda a: (a != "plain", a))
    fig, ax = subplots(figsize=(9, 4))
    for arm in arms:
        xs = [i for i, (_, s) in enumerate(decisions) if (s or "plain") == arm]
        ax.scatter(xs, [decisions[i][0] for i in xs], s=6, label=arm)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("decode step")
    ax.set_ylabel("running batch size")
    ax.set_title(title)
    ax.legend(markerscale=3, fontsize=8)
    fig.tight_layout()
    atomic_save_figure(fig, path)


def paired_ratio(results: dict[str, dict], slow: str, fast: str) -> float:
    """Median over rounds of wall(slow) / wall(fast), each round's pair measured back to back."""
    return statistics.median(a / b for a, b in zip(results[slow]["walls"], results[fast]["walls"], strict=True))


def markdown(report: dict) -> str:
    results, table, best_fixed = report["results"], report["decisions"], report["best_fixed"]
    base = results["sd-never"]["wall_s"]
    lines = [
        f"# Adaptive rollout benchmark\n\n{report['machine']}\n",
        "| config | wall s (median) | speedup vs sd-never | paired speedup (median of rounds) | tokens/s "
        "| accepted/verify | SD token share | tuner us/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['wall_s']:.2f} | {base / r['wall_s']:.2f}x | "
            f"{paired_ratio(results, 'sd-never', name):.2f}x | {r['tokens_per_s']:.0f} | "
            f"{r['accepted_per_verify']:.2f} | {r['sd_token_share']:.0%} | {r['tuner_us_per_step']:.0f} |"
        )
    lines.append(f"\nBest fixed strategy in hindsight: {best_fixed}.")
    if best_fixed in results:
        for name in (k for k in results if k.startswith("adaptive-")):
            lines.append(
                f"- {name}: wall / {best_fixed}'s wall = {results[name]['wall_s'] / results[best_fixed]['wall_s']:.3f} "
                f"(medians), {1 / paired_ratio(results, best_fixed, name):.3f} (median of per-round ratios)"
            )
    lines += [
        "",
        "\n## Adaptive (cost) decisions by running batch size (decode steps of all timed rounds)\n",
    ]
    lines += ["| batch sizes | choices (share of decode steps) |", "|---|---|"]
    for rng, shares in table.items():
        lines.append(f"| {rng} | " + ", ".join(f"{a} {p:.0%}" for a, p in shares.items()) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tlt.config import load_config
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import task_mix, training_problems
    from tlt.drafters import load_drafter
    from tlt.drafters.ngram import NgramDrafter
    from tlt.machine import describe_machine
    from tlt.models.io import load_hf_folder

    p = argparse.ArgumentParser(
        prog="tlt bench adaptive", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", required=True, help="HF folder of the base policy")
    p.add_argument("--drafter", help="saved tlt drafter folder (default: the model-free ngram drafter)")
    p.add_argument("--strategies", default="2_1_3,3_1_4,4_1_5,3_2_6")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", help="comma-separated subset of configuration names")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-int8", action="store_true", help="EAGLE drafters draft in int8 (NativeEngine draft_int8)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the GPU regime: decoding flat in batch size)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    model, tokenizer = load_hf_folder(args.target)
    cfg = load_config(None, [])
    problems = training_problems(task_mix(cfg.data), args.prompts, seed=args.seed + 1)
    prompts = [tokenizer.encode(format_prompt(q.question)) for q in problems]
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    strategies = args.strategies.split(",")
    wanted = args.configs.split(",") if args.configs else None
    engines = {}
    for name, tuner in tuners(strategies, args.seed).items():
        if wanted and name not in wanted and name != "sd-never":
            continue
        drafter = None if name == "sd-never" else load_drafter(args.drafter) if args.drafter else NgramDrafter()
        engines[name] = NativeEngine(
            model,
            tokenizer.eos_token_id,
            max_seq_len=max(map(len, prompts)) + args.max_new_tokens,
            tuner=TimedTuner(tuner),
            drafter=drafter,
            device=args.device,
            draft_int8=args.draft_int8,
        )
    rounds: dict[str, list[dict]] = {name: [] for name in engines}
    for r in range(args.repeats + 1):  # round 0 warms up (learning tuners keep what they learn)
        for name, engine in engines.items():  # interleaved, so drift of the machine hits every config alike
            measured = run_round(engine, prompts, params, args.samples, r)
            print(
                f"[bench-adaptive] round {r}/{args.repeats} {name}: {measured['wall']:.2f} s, "
                f"accepted/verify {measured['accepted']:.2f}" + (" (warm-up)" if r == 0 else ""),
                file=sys.stderr,
                flush=True,
            )
            if r > 0:
                rounds[name].append(measured)
    results = {name: summarise(rounds[name], engine) for name, engine in engines.items()}
    fixed = {k: v["wall_s"] for k, v in results.items() if k.startswith("always-")}
    best_fixed = min(fixed, key=fixed.get) if fixed else "n/a"
    adaptive = next((k for k in results if k.startswith("adaptive-")), None)
    table = decision_table(results[adaptive]["decisions"]) if adaptive else {}
    machine = ", ".join(f"{k}: {v}" for k, v in describe_machine().items())
    summary = {k: {m: v for m, v in r.items() if not m.startswith("decisions")} for k, r in results.items()}
    report = {"machine": machine, "args": vars(args), "results": summary, "best_fixed": best_fixed, "decisions": table}
    text = write_report(Path(args.out) / "adaptive.md", report, markdown)
    if adaptive:
        plot_decisions(
            results[adaptive]["decisions_last"],
            Path(args.out) / "adaptive_decisions.png",
            f"{adaptive}: SD strategy per decode step (last rollout)",
        )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
