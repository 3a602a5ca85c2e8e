"""Arms compared in interleaved rounds: the order of a round (`rotated`, for every benchmark that takes turns), the
two-pass round loop of eval/bench_composed.py and eval/bench_ragged.py, a first pass as a suffix drafter's history
and prompt-by-prompt decoding (eval/bench_suffix_b1.py, eval/bench_packed.py), the sums a pass reports from the
engine's step stats, and the entry point the eval/ scripts share (`measure`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tlt.backends.base import SamplingParams

if TYPE_CHECKING:
    from tlt.backends.native import NativeEngine

T = TypeVar("T")


def measure(args, run: Callable, render: Callable[[dict], str], report: str) -> int:
    """An eval/ script's main: one torch thread, `run(args)`'s raw report written as JSON and `render`ed as
    Markdown to `args.out`/`report` (tlt.files.write_report), the Markdown printed."""
    import torch

    from tlt.files import write_report

    torch.set_num_threads(1)
    print(write_report(Path(args.out) / report, run(args), render))
    return 0


def rotated(arms: Sequence[T], round_: int) -> list[T]:
    """The arms in round `round_`'s order: rotated by the round, so that over the rounds every arm runs in every
    position and the machine's drift during a round slows no arm more than another."""
    shift = round_ % len(arms)
    return [*arms[shift:], *arms[:shift]]


def two_pass_rounds(
    arms: Sequence[str],
    rounds: int,
    make_engine: Callable[[str], NativeEngine],
    run_pass: Callable[[NativeEngine, SamplingParams], dict],
    max_new_tokens: int,
    label: str,
    temperature: float = 1.0,
) -> list[dict[str, list[dict]]]:
    """`rounds` rounds; in round r every arm, in an order rotated by r, gets a fresh engine and runs two passes at
    `temperature` with seeds 2r + 1 and 2r + 2 (the round's own sample set; pass 2 finds what pass 1 left in the
    drafter).
    Returns per round {arm: [pass 1, pass 2]}; a line per pass goes to stderr (seconds and tokens)."""
    results = []
    for round_ in range(rounds):
        passes: dict[str, list[dict]] = {}
        for arm in rotated(arms, round_):
            engine = make_engine(arm)
            passes[arm] = []
            for seed in (2 * round_ + 1, 2 * round_ + 2):
                sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
                passes[arm].append(run_pass(engine, sampling))
                r = passes[arm][-1]
                print(
                    f"[{label}] round {round_ + 1}/{rounds} {arm} pass {len(passes[arm])}: {r['seconds']:.1f} s, "
                    f"{r['tokens']} tokens",
                    file=sys.stderr,
                )
        results.append(passes)
    return results


def sd_sums(step_stats) -> dict[str, float]:
    """Over the steps that decoded speculatively: row-verifies, accepted and drafted tokens, tokens generated,
    seconds."""
    sd = [s for s in step_stats if s.sd_on]
    return {
        "sd_verifies": sum(s.running_batch for s in sd),
        "accepted": sum(s.accepted_tokens for s in sd),
        "drafted": sum(s.drafted_tokens for s in sd),
        "sd_tokens": sum(s.generated_tokens for s in sd),
        "sd_seconds": sum(s.seconds for s in sd),
    }


def first_pass_history(engine: NativeEngine, prompts, samples: int, max_new_tokens: int, seed: int = 1) -> list[dict]:
    """Each prompt's `samples` responses at T = 1 (`seed`), as `SuffixDrafter.restore` takes a history: what a
    suffix drafter would hold when the prompts come back for their next RL epoch."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)
    first = engine.generate(prompts, sampling, n=samples)
    return [
        {"prompt": p, "responses": [r.token_ids.tolist() for r in first[i * samples : (i + 1) * samples]]}
        for i, p in enumerate(prompts)
    ]


def add_sd_batch_args(parser, rounds: int) -> None:
    """The options of an eval/ script that decodes held-out prompts in groups of b rows (`batch_rounds`) with SD
    at one strategy: the policy, the SD arms' drafter (`bench_drafter`) and strategy, prompts, batches, tokens,
    rounds and the output folder."""
    parser.add_argument("--target", required=True, help="HF folder of the policy")
    parser.add_argument("--drafter", default="suffix", help="'suffix' or a saved drafter folder (EAGLE)")
    parser.add_argument("--strategy", default="5_1_6", help="the SD arms' strategy, steps_topk_verify")
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    parser.add_argument("--batches", type=ints, default=[1, 8], help="samples per prompt and call (rows)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", required=True)


def add_forward_cost_args(parser) -> None:
    """The options of target forward costs t(b, N) (`tlt.eval.bench.sd.costs.forward_seconds`)."""
    parser.add_argument("--cost-batches", type=ints, default=[1, 4, 16], help="b of the forward costs")
    parser.add_argument("--new-tokens", type=ints, default=[1, 2, 4, 6, 8], help="N of the forward costs")
    parser.add_argument("--cache-len", type=int, default=128, help="cached tokens per row in the forward costs")
    parser.add_argument("--reps", type=int, default=20, help="forwards per cost measurement")


def group_decoding(model, tokenizer, args, arms: Sequence[str], engine: Callable, label: str) -> list[dict]:
    """`batch_rounds` of `arms` over `args.prompts` held-out prompts, at the options of `add_sd_batch_args`.
    `engine(arm, eos, max_seq_len, history)` makes an arm's engine; history: `bench_history`'s."""
    from tlt.backends.native import NativeEngine
    from tlt.eval.heldout import heldout_prompt_ids
    from tlt.speculative.strategy import SpecStrategy

    prompts = heldout_prompt_ids(tokenizer, args.prompts)
    room = SpecStrategy.parse(args.strategy).verify_tokens
    eos, max_seq_len = tokenizer.eos_token_id, max(map(len, prompts)) + args.max_new_tokens + room
    history = bench_history(args.drafter, NativeEngine(model, eos, max_seq_len), prompts, args.max_new_tokens)

    def make_engine(arm: str) -> NativeEngine:
        return engine(arm, eos, max_seq_len, history)

    return batch_rounds(arms, args.batches, args.rounds, make_engine, prompts, args.max_new_tokens, label)


def packable_policy(target: str):
    """(model, tokenizer) of a policy whose weights the CPU engine packs (float32 / bfloat16); exits otherwise."""
    from tlt.models.io import load_hf_folder
    from tlt.models.lean import packable

    model, tokenizer = load_hf_folder(target)
    if not packable(model.get_input_embeddings().weight):
        raise SystemExit(f"{target}: its weights ({model.dtype}) are not packed here (CPU float32 / bfloat16)")
    return model, tokenizer


def ints(text: str) -> list[int]:
    """'1,8' -> [1, 8] (an argparse type)."""
    return [int(x) for x in text.split(",")]


def bench_history(spec: str, engine: NativeEngine, prompts, max_new_tokens: int) -> list[dict] | None:
    """What `bench_drafter` restores a suffix drafter from: 8 first-pass samples per prompt (`first_pass_history`,
    the prompts' next RL epoch); None for a saved drafter."""
    return first_pass_history(engine, prompts, 8, max_new_tokens) if spec == "suffix" else None


def bench_drafter(spec: str, history: list[dict] | None):
    """The SD arms' drafter of an eval/ script: `suffix`, restored from `history` (`first_pass_history`), or a
    saved drafter folder (`drafter_from_spec`)."""
    from tlt.drafters import drafter_from_spec
    from tlt.drafters.suffix import SuffixDrafter

    if spec != "suffix":
        return drafter_from_spec(spec)
    drafter = SuffixDrafter()
    drafter.restore(history)
    return drafter


def decode_each(engine: NativeEngine, prompts, max_new_tokens: int, seed: int, n: int = 1) -> dict:
    """Each prompt in its own generate() call with n samples at T = 1 (seed + its index); sums over the calls of
    seconds, response tokens, SD and plain decode steps and their seconds, and `sd_sums`."""
    keys = ("seconds", "tokens", "sd_steps", "plain_steps", "plain_seconds", *sd_sums([]))
    result = dict.fromkeys(keys, 0)
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed + i)
        start = time.perf_counter()
        rollouts = engine.generate([prompt], sampling, n=n)
        result["seconds"] += time.perf_counter() - start
        result["tokens"] += sum(r.token_ids.numel() for r in rollouts)
        result["sd_steps"] += sum(s.sd_on for s in engine.step_stats)
        result["plain_steps"] += sum(not s.sd_on for s in engine.step_stats)
        result["plain_seconds"] += sum(s.seconds for s in engine.step_stats if not s.sd_on)
        for key, value in sd_sums(engine.step_stats).items():
            result[key] += value
    return result


def batch_rounds(
    arms: Sequence[str],
    batches: Sequence[int],
    rounds: int,
    make_engine: Callable[[str], NativeEngine],
    prompts,
    max_new_tokens: int,
    label: str,
    warmup=None,
) -> list[dict[str, dict[str, dict]]]:
    """`rounds` rounds; in each, per batch size b, every arm (in an order rotated by the round) gets a fresh engine
    and decodes each prompt with b samples (`decode_each`, the round's seeds). `warmup`: a prompt each engine
    first decodes untimed. Returns per round {str(b): {arm: sums}}; a line per cell goes to stderr."""
    results = []
    for round_ in range(rounds):
        cells: dict[str, dict[str, dict]] = {}
        for rows in batches:
            cells[str(rows)] = {}
            for arm in rotated(arms, round_):
                engine = make_engine(arm)
                if warmup is not None:
                    engine.generate([warmup], SamplingParams(temperature=1.0, max_new_tokens=16, seed=0))
                r = decode_each(engine, prompts, max_new_tokens, seed=1000 * (round_ + 1), n=rows)
                cells[str(rows)][arm] = r
                print(f"[{label}] round {round_ + 1}/{rounds} batch {rows} {arm}: {r['tokens']} tokens in "
                      f"{r['seconds']:.1f} s", file=sys.stderr)  # fmt: skip
        results.append(cells)
    return results


def tokens_per_second(run: dict) -> float:
    return run["tokens"] / run["seconds"]
