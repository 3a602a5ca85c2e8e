"""Drafter-training throughput with sequence packing vs padding, on long-tailed rollout lengths.

Both layouts train the same EAGLE head (`tlt.training.drafter.module.DrafterModule.batch_loss`, AdamW step)
on the same batches: each batch is one draw of about `--batch-tokens` real tokens from a `DrafterBuffer`
holding synthetic rollouts (a prompt plus a log-normal response length capped at `--max-len`: most samples
short, a few at the cap, as RL rollouts). "packed" lays a batch out in first-fit rows as long as its longest
sample with per-document attention; "padded" puts one sample per row, padded to the longest in the batch.
Throughput counts only real loss tokens (response pairs) per second of layout + forward + backward + step.
Runs alternate between the layouts; medians over `--repeats` runs, ratio packed / padded. TLT's reference
reports 2.2x from packing.

  OMP_NUM_THREADS=1 python -m tlt.eval.bench.packing --preset tiny --samples 256 --max-len 2048 \
      --median-response 128 --batch-tokens 8192 --repeats 5 --out runs/bench/drafter_packing.json
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tlt.config import DrafterConfig
from tlt.drafters.eagle import EagleDrafter
from tlt.files import atomic_write_json
from tlt.models.presets import build_model
from tlt.training.drafter.buffer import DrafterBuffer, DrafterSample
from tlt.training.drafter.module import DrafterModule
from tlt.training.drafter.packing import PackedBatch, pack, pad

LAYOUTS = {"packed": pack, "padded": pad}


@dataclass(frozen=True)
class PackingBenchSettings:
    preset: str = "test"  # target preset (tlt.models.presets); the head is shaped like one of its layers
    vocab_size: int = 1024
    samples: int = 256  # synthetic rollouts in the buffer
    prompt_tokens: int = 64
    max_len: int = 1024  # prompt + response cap (truncated rollouts sit here)
    median_response: int = 96  # median of the log-normal response length
    sigma: float = 1.2  # log-normal shape: larger = longer tail
    batch_tokens: int = 8192  # real tokens drawn per training step
    steps: int = 0  # batches per run (0: as many as the buffer's tokens fill)
    repeats: int = 5
    threads: int = 1
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.prompt_tokens < self.max_len:
            raise ValueError(f"--prompt-tokens must be in [2, --max-len); got {self.prompt_tokens}")
        for name in ("samples", "median_response", "batch_tokens", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")


def rollout_lengths(s: PackingBenchSettings) -> list[int]:
    """Prompt + log-normal response lengths, capped at max_len (seeded)."""
    g = torch.Generator().manual_seed(s.seed)
    response = torch.empty(s.samples).log_normal_(mean=math.log(s.median_response), std=s.sigma, generator=g)
    return [min(s.max_len, s.prompt_tokens + max(2, int(r))) for r in response.tolist()]


def make_buffer(s: PackingBenchSettings, hidden_size: int) -> DrafterBuffer:
    g = torch.Generator().manual_seed(s.seed + 1)
    samples = [
        DrafterSample(
            torch.randint(0, s.vocab_size, (T,), generator=g),
            torch.randn(T, hidden_size, generator=g),
            torch.arange(T) >= s.prompt_tokens,
            version=0,
        )
        for T in rollout_lengths(s)
    ]
    buffer = DrafterBuffer(max_bytes=sum(x.nbytes for x in samples), seed=s.seed)
    buffer.add(samples)
    return buffer


def draw_batches(buffer: DrafterBuffer, s: PackingBenchSettings) -> list[list[DrafterSample]]:
    """The batches every run trains on: `steps` draws, or draws until the buffer's token count is reached."""
    total = sum(x.num_tokens for x in buffer.samples)
    batches, drawn = [], 0
    while (len(batches) < s.steps) if s.steps else (drawn < total):
        batches.append(buffer.sample(s.batch_tokens))
        drawn += sum(x.num_tokens for x in batches[-1])
    return batches


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_run(module: DrafterModule, opt, batches, layout, device) -> tuple[float, int, int]:
    """Seconds, trained (loss) tokens and laid-out tokens (rows x L) of one pass over `batches`."""
    trained = laid_out = 0
    _sync(device)
    start = time.perf_counter()
    for samples in batches:
        batch: PackedBatch = layout(samples).to(device)
        loss = module.batch_loss(batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        trained += batch.num_loss_tokens
        laid_out += batch.tokens.numel()
    _sync(device)
    return time.perf_counter() - start, trained, laid_out


def run(s: PackingBenchSettings) -> dict:
    torch.set_num_threads(s.threads)
    device = torch.device(s.device)
    torch.manual_seed(s.seed)
    target = build_model(s.preset, vocab_size=s.vocab_size).to(device)
    head = EagleDrafter.from_target(target, seed=s.seed).head.train()
    module = DrafterModule(head, DrafterConfig(batch_tokens=s.batch_tokens), max_steps=1)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
    buffer = make_buffer(s, target.config.hidden_size)
    batches = draw_batches(buffer, s)
    for layout in LAYOUTS.values():  # warm-up: allocator, kernels
        timed_run(module, opt, batches[:1], layout, device)
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for _ in range(s.repeats):
        for name, layout in LAYOUTS.items():
            seconds, trained, laid_out = timed_run(module, opt, batches, layout, device)
            runs[name].append(
                {
                    "seconds": seconds,
                    "tokens_per_s": trained / seconds,
                    "trained_tokens": trained,
                    "laid_out_tokens": laid_out,
                }
            )
    median = {name: statistics.median(r["tokens_per_s"] for r in rs) for name, rs in runs.items()}
    lengths = sorted(x.num_tokens for x in buffer.samples)
    return {
        "settings": asdict(s),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_average": list(os.getloadavg()),
        },
        "lengths": {
            "median": lengths[len(lengths) // 2],
            "p90": lengths[int(0.9 * (len(lengths) - 1))],
            "max": lengths[-1],
            "at_cap": sum(n == s.max_len for n in lengths),
        },
        "batches": len(batches),
        "runs": runs,
        "median_tokens_per_s": median,
        "ratio": median["packed"] / median["padded"],
    }


def parse_args(argv=None) -> tuple[PackingBenchSettings, Path | None]:
    p = argparse.ArgumentParser(prog="tlt bench packing", description=__doc__.split("\n\n")[0])
    for name, value in asdict(PackingBenchSettings()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    return PackingBenchSettings(**args), out


def main(argv=None) -> dict:
    settings, out = parse_args(argv)
    result = run(settings)
    L = result["lengths"]
    print(
        f"lengths: median {L['median']}, p90 {L['p90']}, max {L['max']} ({L['at_cap']} at the cap); "
        f"{result['batches']} batches of ~{settings.batch_tokens} tokens"
    )
    for name, rs in result["runs"].items():
        fill = rs[0]["trained_tokens"] / rs[0]["laid_out_tokens"]
        print(
            f"{name:>7}: {result['median_tokens_per_s'][name]:9.0f} trained tokens/s (median of "
            f"{len(rs)}), {fill:.0%} of laid-out positions carry loss"
        )
    print(f"packed / padded throughput: {result['ratio']:.2f}x")
    if out is not None:
        atomic_write_json(out, result)
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
