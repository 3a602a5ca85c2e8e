"""Measured cells turned into comparisons: SD vs plain (speedup, bound, greedy identity), ours vs HF."""

from __future__ import annotations

from dataclasses import dataclass

from tlt.eval.bench.sd.costs import ForwardCost, speedup_bound
from tlt.eval.bench.sd.runs import CellResult
from tlt.eval.bench.sd.settings import HF, HF_ASSISTANT, HF_LOOKUP, NATIVE, Cell
from tlt.speculative.strategy import SpecStrategy


@dataclass
class SDRow:
    """One SD cell against plain native decoding of the same prompts, batch size and temperature."""

    drafter: str
    strategy: str
    batch_size: int
    temperature: float
    tokens_per_s: float
    plain_tokens_per_s: float
    speedup: float  # tokens/s ratio, SD over plain (median timed runs)
    speedup_runs: list[float]  # the same ratio per timed run, SD run i over plain run i (one round of the cells)
    accepted_per_verify: float | None  # mean accepted draft tokens per row and verify; A = this + 1
    t_plain: float  # t(b, 1) seconds
    t_verify: float  # t(b, N) seconds
    t_draft_step: float | None  # t_draft(b): drafter.propose seconds per SD iteration / steps
    bound: float | None  # A * t(b, 1) / (t(b, N) + K * t_draft(b))
    bound_fraction: float | None  # speedup / bound
    identical: bool | None  # greedy outputs equal plain outputs token for token (None when sampling)
    first_mismatch: str | None  # where they first differ
    mean_running_batch: float | None
    post_eos_share: float
    memory_delta_mib: float  # resident-memory growth over the cell (tlt.eval.memory.PeakMemory)
    peak_rss_mib: float  # the process's peak RSS during the cell


@dataclass
class PeerRow:
    """Ours against an HF peer on the same prompts, greedy."""

    comparison: str
    batch_size: int
    ours: str  # cell name
    peer: str  # cell name
    ours_tokens_per_s: float
    peer_tokens_per_s: float
    ratio: float  # ours / peer
    same_tokens: bool  # informational: HF runs its own forward, so float ties may break differently


def first_mismatch(outputs: list[list[int]], reference: list[list[int]]) -> str | None:
    """'prompt i, token t' of the first difference, None when equal."""
    for i, (a, b) in enumerate(zip(outputs, reference, strict=True)):
        if a != b:
            t = next((t for t, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"prompt {i}, token {t}"
    return None


def _cost(costs: list[ForwardCost], b: int, n: int) -> float:
    return next(c.seconds for c in costs if c.batch_size == b and c.new_tokens == n)


def sd_row(result: CellResult, plain: CellResult, costs: list[ForwardCost]) -> SDRow:
    cell = result.cell
    strategy = SpecStrategy.parse(cell.strategy)
    speedup = result.tokens_per_s / plain.tokens_per_s
    speedup_runs = [
        (result.generated_tokens / s) / (plain.generated_tokens / p)
        for s, p in zip(result.seconds, plain.seconds, strict=True)
    ]
    t_plain = _cost(costs, cell.batch_size, 1)
    t_verify = _cost(costs, cell.batch_size, strategy.verify_tokens)
    bound = None
    if result.accepted_per_verify is not None and result.propose_seconds is not None:
        bound = speedup_bound(result.accepted_per_verify + 1, t_plain, t_verify, result.propose_seconds)
    mismatch = first_mismatch(result.outputs, plain.outputs) if cell.temperature == 0 else None
    return SDRow(
        drafter=cell.drafter,
        strategy=cell.strategy,
        batch_size=cell.batch_size,
        temperature=cell.temperature,
        tokens_per_s=result.tokens_per_s,
        plain_tokens_per_s=plain.tokens_per_s,
        speedup=speedup,
        speedup_runs=speedup_runs,
        accepted_per_verify=result.accepted_per_verify,
        t_plain=t_plain,
        t_verify=t_verify,
        t_draft_step=None if result.propose_seconds is None else result.propose_seconds / strategy.steps,
        bound=bound,
        bound_fraction=None if bound is None else speedup / bound,
        identical=None if cell.temperature != 0 else mismatch is None,
        first_mismatch=mismatch,
        mean_running_batch=result.mean_running_batch,
        post_eos_share=result.post_eos_share,
        memory_delta_mib=result.memory["delta_mib"],
        peak_rss_mib=result.memory["peak_rss_mib"],
    )


def sd_rows(results: dict[Cell, CellResult], costs: list[ForwardCost]) -> list[SDRow]:
    return [sd_row(r, results[c.plain()], costs) for c, r in results.items() if c.is_sd]


def best_rows(rows: list[SDRow]) -> list[SDRow]:
    """The fastest strategy per (drafter, batch size, temperature), in first-seen order."""
    best: dict[tuple, SDRow] = {}
    for row in rows:
        key = (row.drafter, row.batch_size, row.temperature)
        if key not in best or row.speedup > best[key].speedup:
            best[key] = row
    return list(best.values())


def _peer(comparison: str, ours: CellResult | None, peer: CellResult | None) -> list[PeerRow]:
    if ours is None or peer is None:
        return []
    return [
        PeerRow(
            comparison=comparison,
            batch_size=peer.cell.batch_size,
            ours=ours.cell.name,
            peer=peer.cell.name,
            ours_tokens_per_s=ours.tokens_per_s,
            peer_tokens_per_s=peer.tokens_per_s,
            ratio=ours.tokens_per_s / peer.tokens_per_s,
            same_tokens=ours.outputs == peer.outputs,
        )
    ]


def _fastest_sd(results: dict[Cell, CellResult], drafter: str | None = None) -> CellResult | None:
    """Our fastest greedy SD cell at batch 1 (of one drafter kind, or of all)."""
    pool = [
        r
        for c, r in results.items()
        if c.is_sd and c.batch_size == 1 and c.temperature == 0 and drafter in (None, c.drafter)
    ]
    return max(pool, key=lambda r: r.tokens_per_s, default=None)


def peer_rows(results: dict[Cell, CellResult]) -> list[PeerRow]:
    rows = []
    for cell in results:
        if cell.engine == HF and cell.drafter is None:
            native = results.get(Cell(NATIVE, cell.batch_size))
            rows += _peer("plain native vs HF generate", native, results[cell])
    hf_plain = results.get(Cell(HF, 1))
    for kind, ours_kind in ((HF_ASSISTANT, "small_lm"), (HF_LOOKUP, "ngram")):
        peer = results.get(Cell(HF, 1, drafter=kind))
        rows += _peer(f"HF {kind} vs HF plain (HF's own speedup)", peer, hf_plain)
        rows += _peer(f"best native SD vs HF {kind}", _fastest_sd(results), peer)
        rows += _peer(f"best native {ours_kind} SD vs HF {kind}", _fastest_sd(results, ours_kind), peer)
    return rows
