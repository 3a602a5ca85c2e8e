"""tlt's headline claims as one table, regenerated from the raw JSON committed under eval/results.

Each row names its results file, the command that produced it, the machine, the number of runs and, where there
are several, the median with the min-max spread. docs/claims.md is this script's output and nothing else
(tests/test_claims.py regenerates it and compares), so a number can change only with its data.

  python -m eval.claims            # rewrites docs/claims.md
  python -m eval.claims --check    # exit 1 if docs/claims.md differs from what the data gives
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from tlt.eval.bench.passes import tokens_per_second
from tlt.files import write_or_check
from tlt.machine import machine_name

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("eval/results")
OUTPUT = Path("docs/claims.md")
MAIN_JOB = [RESULTS / f"quickstart_packed/seed{s}/speedup.json" for s in range(3)]
MAIN_JOB_CMD = (
    "`tlt train configs/quickstart.yaml seed=N output_dir=runs/qs-N` for seeds 0-2 (`make quickstart` runs seed 0)"
)
SD_BENCH = RESULTS / "bench_sd_deep_v2/results.json"
SD_BENCH_CMD = (
    "`python -m tlt.eval.bench.sd.cli --target tlt/assets/deep_v2/policy --eagle tlt/assets/deep_v2/drafter --no-ngram "
    "--batch-sizes 1,4,16 --strategies 3_1_4,5_1_6,7_1_8 --temperatures 1.0 --hf-batch-sizes '' --max-new-tokens 64 "
    "--min-prompts 8 --repeats 5 --out DIR`"
)
DRIFT = RESULTS / "drift_deep_v2_online_lr_1e-4/drift.json"
DRIFT_CMD = (
    "`python -m eval.drift --steps 16 --temperature 1.0 --out DIR train.devices=1 scheduler.policy=between_steps "
    "scheduler.between_steps_budget=2 drafter.online_lr=1e-4`"
)
ABLATION = [RESULTS / f"ablation_deep_v2_packed/seed{s}" for s in range(5)]
ABLATION_CMD = "`tlt sweep configs/ablation.yaml --output-dir DIR seed=N` (N = 0-4)"
COMPOSED_BENCH_CMD = (
    "`python -m eval.bench_composed --target tlt/assets/deep_v2/policy --drafter tlt/assets/deep_v2/drafter {args} "
    "--out DIR`"
)
GREEDY_ARGS = "--prompts 32 --samples 1 --max-new-tokens 256 --temperature 0 --rounds 20"
# (results, what the claims call the setting, the bench's arguments)
COMPOSED_BENCH = [
    ("composed_deep_v2_trust_greedy", "greedy, cost tuner", GREEDY_ARGS),
    ("composed_deep_v2_trust_greedy_fixed", "greedy, 5_1_6", f"{GREEDY_ARGS} --tuner fixed --strategies 5_1_6"),
    ("composed_deep_v2_trust", "T = 1, cost tuner", "--prompts 16 --samples 8 --max-new-tokens 256 --rounds 5"),
]
COMPOSED_FRESH = [RESULTS / f"composed_fresh_deep_v2_trust/seed{s}" for s in range(3)]
COMPOSED_FRESH_CMD = (
    "`tlt sweep configs/composed_epochs.yaml --output-dir DIR data.train_size=20000 grpo.steps=24 seed=N`"
)
COMPOSED_EPOCHS = [RESULTS / f"composed_epochs_deep_v2_trust/seed{s}" for s in range(3)]
COMPOSED_EPOCHS_CMD = "`tlt sweep configs/composed_epochs.yaml --output-dir DIR seed=N`"
DRAFTERS = RESULTS / "drafter_deep_v2/acceptance.json"
DRAFTERS_CMD = (
    "`python -m eval.drafter_acceptance --policy tlt/assets/deep_v2/policy --drafter deep_v1=DIR "
    "--drafter deep_v2=tlt/assets/deep_v2/drafter --temperatures 1.0,0 --out eval/results/drafter_deep_v2` "
    "(DIR: deep_v1's drafter, from git history)"
)
SUFFIX_CMD = "`python -m eval.bench_suffix --target {target} --prompts 32 --samples 8 --seeds 1,2,3{extra}`"
TREE_256 = " --strategy 31_8_256 --spec-factor 16 --min-token-prob 0"
# (results, what the claims call the setting, its command)
SUFFIX_RUNS = [
    ("suffix_deep_v2", "", SUFFIX_CMD.format(target="tlt/assets/deep_v2/policy", extra="")),
    (
        "suffix_deep_v2_tree256",
        "31-deep tree of 256 nodes, ",
        SUFFIX_CMD.format(target="tlt/assets/deep_v2/policy", extra=TREE_256),
    ),
    (
        "suffix_tiny_tree256",
        "tiny policy, 31-deep tree of 256 nodes, ",
        SUFFIX_CMD.format(target="runs/tiny/model", extra=TREE_256),
    ),
]
RAGGED = RESULTS / "ragged_tiny/ragged.json"
RAGGED_CMD = "`python -m eval.bench_ragged --target runs/tiny/model --prompts 16 --rounds 5 --out DIR`"
PEER = RESULTS / "peer_trl_deep_v2/peer_trl.json"
PEER_CMD = "`python -m eval.peer_trl --config configs/quickstart.yaml --steps 4 --warmup 1 --rounds 3 --out DIR`"
GRAPHS = RESULTS / "graphs_cpu/graphs.json"
GRAPHS_CMD = (
    "`python -m eval.bench_graphs --target tlt/assets/deep_v2/policy --drafter tlt/assets/deep_v2/drafter "
    "--batches 1,4,16 --new-tokens 64 --rounds 3 --device cpu --out eval/results/graphs_cpu`"
)


@dataclass
class Row:
    claim: str
    values: list[float]
    unit: str  # "x", "%", "tokens" or ""
    machine: str
    command: str
    source: Path

    def cells(self, source_id: int) -> list[str]:
        value = _fmt(statistics.median(self.values), self.unit)
        spread = f"{_fmt(min(self.values), self.unit)} - {_fmt(max(self.values), self.unit)}"
        runs = len(self.values)
        return [self.claim, value, spread if runs > 1 else "-", str(runs), f"[{source_id}]"]


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1%}"
    return f"{value:.2f}{unit}"


def _load(path: Path) -> dict:
    return json.loads((ROOT / path).read_text())


def _machine(data: dict) -> str:
    return machine_name(data.get("machine") or {})


def main_job_rows() -> list[Row]:
    runs = [_load(p) for p in MAIN_JOB if (ROOT / p).exists()]
    if not runs:
        return []
    source = MAIN_JOB[0].parent.parent / "seed*/speedup.json"
    machine, cmd = _machine(runs[0]), MAIN_JOB_CMD

    def row(claim, unit, get):
        return Row(f"main job: {claim}", [get(r) for r in runs], unit, machine, cmd, source)

    return [
        row("whole run, TLT / TLT off", "x", lambda r: r["run_ratio"]),
        row("rollout speedup s", "x", lambda r: r["run_rollout_speedup"]),
        row("rollout share r of a baseline step", "%", lambda r: r["run_rollout_share"]),
        row("Amdahl bound 1 / ((1 - r) + r / s)", "x", lambda r: r["run_amdahl_bound"]),
        row("whole run / Amdahl bound", "", lambda r: r["run_ratio"] / r["run_amdahl_bound"]),
        row("median step, TLT / TLT off", "x", lambda r: r["speedup"]),
        row("tokens per verify (accepted + 1)", "", lambda r: r["tlt"]["accept_length"]),
        row("held-out accuracy, TLT", "%", lambda r: r["tlt"]["heldout_accuracy"]),
        row("held-out accuracy, TLT off", "%", lambda r: r["baseline"]["heldout_accuracy"]),
    ]


def sd_rows() -> list[Row]:
    if not (ROOT / SD_BENCH).exists():
        return []
    data = _load(SD_BENCH)
    return [
        Row(
            f"SD speedup per token at batch {b['batch_size']} ({b['drafter']} {b['strategy']}, T = {b['temperature']})",
            b["speedup_runs"],  # per timed run, one round of the cells each
            "x",
            _machine(data),
            SD_BENCH_CMD,
            SD_BENCH,
        )
        for b in data["best"]
    ]


def drift_rows() -> list[Row]:
    if not (ROOT / DRIFT).exists():
        return []
    data = _load(DRIFT)
    ratios = [r["adaptive"] / r["frozen"] for r in data["rows"] if r["frozen"]]
    claim = "online drafter (lr 1e-4) / frozen drafter, tokens per verify, over the steps"
    return [Row(claim, ratios, "x", _machine(data), DRIFT_CMD, DRIFT)]


def ablation_rows() -> list[Row]:
    """The ablation sweep per seed: each cell's speedups over the baseline cell."""
    return sweep_rows("ablation", ABLATION, ABLATION_CMD)


def composed_rows() -> list[Row]:
    """EAGLE + suffix against EAGLE alone in RL, per seed: prompts not repeated, and a fixed pool of 16 prompts
    over 3 epochs (the same AVX-512 VM)."""
    return sweep_rows("composed, new prompts", COMPOSED_FRESH, COMPOSED_FRESH_CMD) + sweep_rows(
        "composed, 16-prompt pool x 3 epochs (all 12 steps)", COMPOSED_EPOCHS, COMPOSED_EPOCHS_CMD
    )


def composed_bench_rows() -> list[Row]:
    """EAGLE + suffix against EAGLE alone through the engine (eval.bench_composed), deep_v2: EAGLE's seconds over
    the composition's per round, on prompts new to it and on the same prompts a pass later."""
    from eval.bench_composed import time_ratios

    rows = []
    for name, setting, args in COMPOSED_BENCH:
        path = RESULTS / name / "composed.json"
        if not (ROOT / path).exists():
            continue
        data = _load(path)
        for number, when in enumerate(("prompts new to it", "a pass later")):
            claim = f"composed / EAGLE alone through the engine, {setting}, {when} (EAGLE's seconds / its, per round)"
            ratios = time_ratios(data, "composed", number)
            rows.append(Row(claim, ratios, "x", _machine(data), COMPOSED_BENCH_CMD.format(args=args), path))
    return rows


def _sweep_machine(folder: Path) -> str:
    """The machine a sweep ran on (its machine.json); sweeps from before `tlt sweep` wrote one ran on the AMD
    EPYC VM with AVX-512 BF16 (docs/results.md)."""
    if (ROOT / folder / "machine.json").exists():
        return machine_name(_load(folder / "machine.json"))
    return "AMD EPYC with AVX-512 BF16, 2 cores"


def sweep_rows(label: str, folders: list[Path], command: str) -> list[Row]:
    """Per seed of a sweep: each cell's speedups over its first cell (`tlt.eval.sweep.speedups`: rollout and
    whole-cell seconds, rollout throughput), in the sweep's order (sweep.csv)."""
    from tlt.eval.sweep import flatten_summary, speedups

    sweeps = [folder for folder in folders if (ROOT / folder / "sweep.csv").exists()]
    if not sweeps:
        return []
    machines = {_sweep_machine(folder) for folder in sweeps}
    if len(machines) > 1:
        raise ValueError(f"{label}: the seeds ran on different machines ({sorted(machines)}); one claim per machine")
    machine = machines.pop()
    order = [line.split(",")[0] for line in (ROOT / sweeps[0] / "sweep.csv").read_text().splitlines()[1:]]
    runs = [speedups([flatten_summary(_load(folder / name / "summary.json")) for name in order]) for folder in sweeps]
    source = folders[0].parent / "seed*/*/summary.json"
    claims = (
        ("rollout, {base} / {cell}", "rollout_speedup"),
        ("rollout tokens/s, {cell} / {base}", "rollout_tokens_per_s_speedup"),
        ("whole cell, {base} / {cell}", "total_speedup"),
    )
    return [
        Row(
            f"{label}: {claim.format(base=order[0], cell=name)}",
            [run[i][key] for run in runs],
            "x",
            machine,
            command,
            source,
        )
        for claim, key in claims
        for i, name in enumerate(order)
        if i > 0
    ]


def drafter_rows() -> list[Row]:
    """Tokens per verify of the shipped drafter over the one it replaced, per strategy and temperature."""
    if not (ROOT / DRAFTERS).exists():
        return []
    data = _load(DRAFTERS)
    cells = {(c["drafter"], c["strategy"], c["temperature"]): c["tokens_per_verify"] for c in data["cells"]}
    return [
        Row(
            f"drafter deep_v2 / deep_v1, tokens per verify, {strategy} at T = {temperature:g}",
            [value / cells["deep_v1", strategy, temperature]],
            "x",
            _machine(data),
            DRAFTERS_CMD,
            DRAFTERS,
        )
        for (name, strategy, temperature), value in cells.items()
        if name == "deep_v2"
    ]


def suffix_rows() -> list[Row]:
    """Tokens per verify per pass (eval.bench_suffix): the main job's policy with a chain, then the largest trees
    (where the suffix drafter's acceptance meets #25's 2.5 a pass later, on the tiny policy), with the bound."""
    rows = []
    labels = {"suffix": "suffix drafter", "ngram": "ngram drafter", "hindsight_2": "bound (hindsight, match >= 2)"}
    for name, setting, command in SUFFIX_RUNS:
        path = RESULTS / name / "suffix.json"
        if not (ROOT / path).exists():
            continue
        data = _load(path)
        for number, p in enumerate(data["passes"], 1):
            when = "prompts new to it" if number == 1 else f"the same prompts, {number - 1} pass(es) seen"
            for drafter, label in labels.items():
                if setting and drafter == "ngram":
                    continue
                claim = f"{label}, {setting}tokens per verify at T = 1, {when}"
                rows.append(Row(claim, [p[drafter]["tokens_per_verify"]], "", _machine(data), command, path))
    return rows


def ragged_rows() -> list[Row]:
    """The suffix drafter through the engine on the tiny policy: tokens/s per round, ragged against padded
    verification (SD on every step) and the cost tuner against plain decoding."""
    if not (ROOT / RAGGED).exists():
        return []
    data = _load(RAGGED)
    pairs = (("ragged", "padded", "ragged / padded verification"), ("ragged_cost", "plain", "cost tuner / plain"))
    rows = []
    for number, when in enumerate(("prompts new to it", "the same prompts a step later")):
        for arm, base, label in pairs:
            ratios = [tokens_per_second(r[arm][number]) / tokens_per_second(r[base][number]) for r in data["rounds"]]
            claim = f"suffix SD on the tiny policy, {label}, tokens/s per round, {when}"
            rows.append(Row(claim, ratios, "x", _machine(data), RAGGED_CMD, RAGGED))
    return rows


def peer_rows() -> list[Row]:
    """TRL's GRPOTrainer against tlt train (eval.peer_trl): the three ratios per process count and TRL path,
    one value per round."""
    if not (ROOT / PEER).exists():
        return []
    from eval.peer_trl import round_ratios

    data = _load(PEER)
    return [
        Row(f"peer, {p} process(es), {name} (seconds of the same steps)", values, "x", _machine(data), PEER_CMD, PEER)
        for p, rows in round_ratios(data).items()
        for name, values in rows.items()
    ]


def graphs_rows() -> list[Row]:
    if not (ROOT / GRAPHS).exists():
        return []
    data = _load(GRAPHS)
    cells = data["cells"]
    rows = []
    for batch in data["settings"]["batches"]:
        for mode in ("plain", "sd"):
            eager, static = cells.get(f"{batch}/{mode}/eager"), cells.get(f"{batch}/{mode}/static")
            if eager is not None:
                ratios = [s / e for s, e in zip(static["rates"], eager["rates"], strict=True)]
                claim = f"static-shape path / eager on CPU, batch {batch}, {mode} (tokens/s, per round)"
                rows.append(Row(claim, ratios, "x", _machine(data), GRAPHS_CMD, GRAPHS))
    return rows


def render() -> str:
    rows = main_job_rows() + drafter_rows() + sd_rows() + drift_rows() + ablation_rows() + suffix_rows()
    rows += ragged_rows() + composed_bench_rows() + composed_rows()
    rows += peer_rows() + graphs_rows()
    sources: dict[Path, int] = {}
    for row in rows:
        sources.setdefault(row.source, len(sources) + 1)
    lines = [
        "# Claims",
        "",
        "Written by `python -m eval.claims` from the JSON under `eval/results/` (do not edit by hand;",
        "`tests/test_claims.py` checks it). Value: the median over the runs (seeds, rounds or steps, as the claim",
        "says); spread: min - max. Numbers from different machines are not comparable. No GPU has run tlt yet, so",
        "every row is a CPU measurement.",
        "",
        "| claim | value | spread | runs | data |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row.cells(sources[row.source])) + " |" for row in rows]
    lines += ["", "Data, machine and command:", ""]
    first = {row.source: row for row in reversed(rows)}
    for path, number in sources.items():
        lines.append(f"{number}. `{path}`: {first[path].machine}; {first[path].command}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/claims.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    status = write_or_check(ROOT / OUTPUT, text, args.check, "python -m eval.claims")
    if not args.check:
        print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
