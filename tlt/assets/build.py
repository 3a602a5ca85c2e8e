"""Write a tlt asset (see `tlt.assets`) from a bootstrapped policy and its distilled drafter.

    python -m tlt.assets.build runs/deep --name deep_v2 \\
        --command "tlt bootstrap --preset deep --output-dir runs/deep ..." \\
        --command "tlt train-drafter runs/deep/model --output runs/deep/drafter ..."

reads `<run>/card.json` (the bootstrap card), `<run>/model` and `<run>/drafter`, stores both in bfloat16
under `tlt/assets/<name>/`, then measures what the card states on the stored weights as tlt loads them
(float32): greedy held-out accuracy on `--heldout` problems and on the first-`--quick` set the asset test
re-scores, and the drafter's greedy acceptance length. The folder is written whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tlt.assets import CARD, ROOT, files, sha256
from tlt.files import atomic_folder, atomic_write_json

CHECK_STRATEGY = "4_1_5"  # the drafter check's SD strategy (as `tlt train-drafter`'s)


def heldout_report(policy_dir: Path, data: dict, n: int, max_new_tokens: int):
    """Greedy `tlt.eval.heldout` report of an HF folder on the first `n` held-out problems of the card's mix."""
    from tlt.config import DataConfig
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.eval.heldout import evaluate
    from tlt.models.io import load_hf_folder

    model, tokenizer = load_hf_folder(policy_dir)
    cfg = DataConfig(**data)
    return evaluate(model, tokenizer, heldout_problems(task_mix(cfg), n, cfg.seed), max_new_tokens, batch_size=64)


def drafter_acceptance(policy_dir: Path, drafter_dir: Path, data: dict, prompts: int, max_new_tokens: int) -> float:
    """Greedy tokens per verify of the drafter on `prompts` held-out prompts at CHECK_STRATEGY."""
    from tlt.config import DataConfig
    from tlt.data.prompts import format_prompt
    from tlt.data.splits import heldout_problems, task_mix
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder
    from tlt.training.drafter.distill import acceptance_length

    model, tokenizer = load_hf_folder(policy_dir)
    cfg = DataConfig(**data)
    problems = heldout_problems(task_mix(cfg), prompts, cfg.seed)
    encoded = [tokenizer.encode(format_prompt(p.question)) for p in problems]
    drafter = load_drafter(drafter_dir)
    return acceptance_length(model, drafter, encoded, CHECK_STRATEGY, max_new_tokens, tokenizer.eos_token_id)


def store(run: Path, folder: Path) -> None:
    """bfloat16 copies of <run>/model (with its tokenizer) and <run>/drafter in `folder`."""
    from tlt.drafters import load_drafter
    from tlt.models.io import load_hf_folder, save_hf_folder

    model, tokenizer = load_hf_folder(run / "model")
    save_hf_folder(model.to(torch.bfloat16), tokenizer, folder / "policy")
    drafter = load_drafter(run / "drafter")
    drafter.head.to(torch.bfloat16)
    drafter.save(folder / "drafter")


def build(
    run: Path, name: str, commands: list[str], heldout: int, quick: int, check_prompts: int, notes: list[str] = ()
) -> dict:
    """Write tlt/assets/<name> from `run`; returns the card (`notes`: free-text lines it keeps, e.g. lineage)."""
    from tlt.machine import describe_machine

    start = time.perf_counter()
    bootstrap = json_file(run / "card.json")
    data, max_new = bootstrap["data"], 768
    with atomic_folder(ROOT / name) as tmp:
        store(run, tmp)
        full = heldout_report(tmp / "policy", data, heldout, max_new)
        first = heldout_report(tmp / "policy", data, quick, max_new)
        accept = drafter_acceptance(tmp / "policy", tmp / "drafter", data, check_prompts, 256)
        card = {
            "name": name,
            "what": f"`{bootstrap['preset']}` base policy ({bootstrap['parameters']} parameters) SFT'd on generated "
            "step-by-step arithmetic, and its offline-distilled EAGLE drafter; weights in bfloat16",
            "commands": commands + [f"python -m tlt.assets.build {run} --name {name}"],
            "notes": list(notes),
            "seed": bootstrap["seed"],
            "preset": bootstrap["preset"],
            "parameters": bootstrap["parameters"],
            "data": data,
            "bootstrap": bootstrap["bootstrap"],
            "bootstrap_seconds": bootstrap["seconds"],
            "heldout": {"greedy_max_new_tokens": max_new, "all": full.to_dict(), "quick": first.to_dict()},
            "drafter_check": {"strategy": CHECK_STRATEGY, "prompts": check_prompts, "accept_length": accept},
            "machine": describe_machine(),
            "build_seconds": time.perf_counter() - start,
        }
        card["files"] = {rel: sha256(tmp / rel) for rel in files(tmp)}
        atomic_write_json(tmp / CARD, card)
    return card


def json_file(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build an asset from a `tlt bootstrap` run folder")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tlt.assets.build", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a `tlt bootstrap` folder with card.json, model/ and drafter/")
    p.add_argument("--name", required=True, help="the asset's name (a folder of tlt/assets)")
    p.add_argument("--command", action="append", default=[], help="a command that made the run (repeat, in order)")
    p.add_argument("--heldout", type=int, default=256, help="held-out problems of the card's accuracy")
    p.add_argument("--quick", type=int, default=48, help="held-out problems the asset test re-scores")
    p.add_argument("--check-prompts", type=int, default=16, help="held-out prompts of the drafter check")
    p.add_argument("--note", action="append", default=[], help="a line the card keeps, e.g. lineage (repeat)")
    args = p.parse_args(argv)
    card = build(args.run, args.name, args.command, args.heldout, args.quick, args.check_prompts, args.note)
    print(
        f"[tlt] asset {args.name}: held-out accuracy {card['heldout']['all']['accuracy']:.1%} "
        f"({args.heldout} problems), drafter {card['drafter_check']['accept_length']:.2f} tokens per verify"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
