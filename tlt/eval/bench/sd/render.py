"""Markdown report and speedup plot of the SD benchmark, rendered from its results.json payload."""

from __future__ import annotations

from pathlib import Path

from tlt.files import atomic_save_figure, subplots

NOTES = [
    "Speedup = SD tokens/s over plain native tokens/s on the same prompts, batch size and temperature, "
    "measured side by side in one process with one torch thread; each value is the median of the timed "
    "runs.",
    "A = accepted draft tokens per row and verify + 1 (the bonus token). Bound = A * t(b,1) / (t(b,N) + "
    "K * t_draft(b)): t from timing the target's forward alone on a cache of `cache_len` tokens, t_draft "
    "from the drafter's propose time in the SD run. It leaves out per-step work both engines do besides "
    "the forward, so '% of bound' shows how much of the forward-cost ideal the engine reaches.",
    "mem = growth of resident memory during the cell (its peak RSS minus the RSS at its start; method in "
    "the JSON); peak RSS = the whole process's peak during the cell (Python, torch, every loaded model). "
    "Without --isolate all cells share one process (mem and peak RSS are then taken while the cell is built "
    "and warms up, before the cells take turns), so memory held from earlier cells is reused without "
    "showing: mem is then a lower bound of what the configuration adds, not its footprint. With --isolate "
    "each cell runs in a fresh process that loads the target and only the drafter the cell uses, so peak "
    "RSS is that configuration's footprint including the runtime.",
    "Running batch = mean rows decoding per step. Unless --stop-at-eos, rows ignore EOS and run to "
    "max_new_tokens, so the batch never shrinks; 'post-EOS' is the share of tokens generated after a "
    "row's first EOS (text the policy would not have produced, where drafters may do better or worse).",
    "HF rows are greedy `generate` (left-padded batches; assisted generation with transformers' default "
    "draft length, schedule and confidence threshold); 'same tokens' is informational: HF runs its own "
    "forward, so float ties may break differently. Only native SD vs plain native identity gates the exit "
    "code.",
]


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:{spec}}{suffix}"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _header(payload: dict) -> list[str]:
    m, s = payload["machine"], payload["settings"]
    drafters = ", ".join(f"{k} ({v})" for k, v in payload["drafters"].items()) or "none"
    verdict = "OK" if payload["identity"]["ok"] else "FAILED"
    return [
        "# Speculative decoding benchmark",
        "",
        f"- machine: {m['cpu_model']}, {m['usable_cores']} usable / {m['logical_cores']} logical cores, "
        f"load average at start {m['load_average']}; torch {m['torch']} ({m['torch_threads']} thread), "
        f"transformers {m['transformers']}, Python {m['python']}",
        f"- target: `{s['target']}`; drafters: {drafters}",
        f"- {payload['num_prompts']} held-out prompts (mean {payload['mean_prompt_tokens']:.0f} tokens), "
        f"max_new_tokens {s['max_new_tokens']}, stop at EOS: {s['stop_at_eos']}, at least {s['min_prompts']} "
        f"prompts per cell, {s['repeats']} timed runs (median) after {s['warmup']} warm-up"
        + (", each cell in a fresh process" if s.get("isolate") else ", the cells taking turns run by run"),
        f"- greedy identity (SD == plain, token for token): **{verdict}** "
        f"({payload['identity']['checked']} configurations checked)",
        "",
    ]


def _best_table(payload: dict) -> list[str]:
    sizes = sorted({r["batch_size"] for r in payload["best"]})
    keys = sorted({(r["drafter"], r["temperature"]) for r in payload["best"]}, key=str)
    cells = {(r["drafter"], r["temperature"], r["batch_size"]): r for r in payload["best"]}
    rows = []
    for drafter, temperature in keys:
        row = [drafter, f"{temperature:g}"]
        for b in sizes:
            r = cells.get((drafter, temperature, b))
            row.append("-" if r is None else f"{r['speedup']:.2f}x ({r['strategy']}{_spread(r, '; ')})")
        rows.append(row)
    title = [
        "## Best SD speedup over plain native decoding (strategy and, per timed run, min-max in brackets)",
        "",
    ]
    return title + table(["drafter", "T"] + [f"b={b}" for b in sizes], rows) + [""]


def _spread(r: dict, lead: str = "") -> str:
    """min-max of the per-run speedups (rounds of the cells), or nothing for reports written before they were
    kept."""
    runs = r.get("speedup_runs")
    return f"{lead}{min(runs):.2f}-{max(runs):.2f}x" if runs else ""


def _ms(seconds: float | None) -> str:
    return _f(None if seconds is None else seconds * 1e3)


def _sd_cells(r: dict) -> list[str]:
    accepted, fraction = r["accepted_per_verify"], r["bound_fraction"]
    return [
        r["drafter"],
        r["strategy"],
        str(r["batch_size"]),
        f"{r['temperature']:g}",
        _f(r["tokens_per_s"], ".0f"),
        _f(r["plain_tokens_per_s"], ".0f"),
        _f(r["speedup"], ".2f", "x"),
        _spread(r) or "-",
        _f(None if accepted is None else accepted + 1),
        _ms(r["t_plain"]),
        _ms(r["t_verify"]),
        _ms(r["t_draft_step"]),
        _f(r["bound"], ".2f", "x"),
        _f(None if fraction is None else 100 * fraction, ".0f", "%"),
        _f(r["identical"]),
        _f(r["mean_running_batch"], ".1f"),
        _f(r["post_eos_share"], ".0%"),
        _f(r["memory_delta_mib"], ".0f"),
        _f(r["peak_rss_mib"], ".0f"),
    ]


SD_HEADERS = [
    "drafter", "strategy", "b", "T", "tok/s", "plain tok/s", "speedup", "per run", "A", "t(b,1) ms", "t(b,N) ms",
    "t_draft ms", "bound", "% of bound", "identical", "running b", "post-EOS", "mem MiB", "peak RSS MiB",
]  # fmt: skip


def _sd_table(payload: dict) -> list[str]:
    rows = [_sd_cells(r) for r in payload["sd"]]
    return ["## All SD configurations", ""] + table(SD_HEADERS, rows) + [""]


def _peer_cells(r: dict) -> list[str]:
    return [
        r["comparison"],
        str(r["batch_size"]),
        f"`{r['ours']}`",
        _f(r["ours_tokens_per_s"], ".0f"),
        f"`{r['peer']}`",
        _f(r["peer_tokens_per_s"], ".0f"),
        _f(r["ratio"], ".2f", "x"),
        _f(r["same_tokens"]),
    ]


def _peer_table(payload: dict) -> list[str]:
    if not payload["peers"]:
        return []
    headers = ["comparison", "b", "ours", "tok/s", "peer", "tok/s", "ratio", "same tokens"]
    rows = [_peer_cells(r) for r in payload["peers"]]
    return ["## Against Hugging Face transformers (greedy)", ""] + table(headers, rows) + [""]


def _cost_table(payload: dict) -> list[str]:
    sizes = sorted({c["batch_size"] for c in payload["costs"]})
    widths = sorted({c["new_tokens"] for c in payload["costs"]})
    seconds = {(c["batch_size"], c["new_tokens"]): c["seconds"] for c in payload["costs"]}
    rows = [[str(b)] + [_ms(seconds.get((b, n))) for n in widths] for b in sizes]
    title = [f"## Target forward t(b, N) in ms (cache of {payload['cache_len']} tokens)", ""]
    return title + table(["b"] + [f"N={n}" for n in widths], rows) + [""]


def markdown(payload: dict) -> str:
    failed = payload["identity"]["failed"]
    lines = _header(payload)
    if failed:
        lines += ["**Greedy identity failures:** " + "; ".join(failed), ""]
    lines += _best_table(payload) + _peer_table(payload) + _sd_table(payload) + _cost_table(payload)
    lines += ["## Notes", ""] + [f"- {note}" for note in NOTES]
    return "\n".join(lines) + "\n"


def plot_speedup(payload: dict, path: str | Path) -> None:
    """Best SD speedup (solid) and its bound (dotted) vs batch size, one line per drafter, a panel per T."""
    best = payload["best"]
    temperatures = sorted({r["temperature"] for r in best}) or [0.0]
    panels = len(temperatures)
    sizes_all = sorted({r["batch_size"] for r in best})
    fig, axes = subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    for ax, temperature in zip(axes[0], temperatures, strict=True):
        for drafter in sorted({r["drafter"] for r in best}):
            rows = [r for r in best if (r["drafter"], r["temperature"]) == (drafter, temperature)]
            rows.sort(key=lambda r: r["batch_size"])
            sizes = [r["batch_size"] for r in rows]
            line = ax.plot(sizes, [r["speedup"] for r in rows], marker="o", label=drafter)[0]
            bounds = [r["bound"] if r["bound"] is not None else float("nan") for r in rows]
            ax.plot(sizes, bounds, linestyle=":", color=line.get_color())
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes_all, [str(b) for b in sizes_all])
        ax.set(
            title=f"best SD strategy, T = {temperature:g} (dotted: bound)",
            xlabel="batch size",
            ylabel="speedup vs plain",
        )
        ax.legend()
    fig.tight_layout()
    atomic_save_figure(fig, path)
