"""Pushing new policy weights and the new drafter to a rollout engine together, all or nothing.

A stale drafter is the top complaint about SD in RL frameworks, and a drafter that writes its own embedding
over the target's would change the policy being trained (a bug of the TLT reference code). `push` therefore:

1. checks the policy state's names and shapes against the engine (nothing applied yet);
2. clones the drafter (the engine gets its own copy, so later training of the replica cannot touch it),
   checks its weights are finite, binds it to the target (shapes; EAGLE shares the target's embedding and
   LM head by reference and never writes them) and drafts once on a tiny input;
3. only then copies the policy weights, and tags engine and drafter with the same version.

Any failure raises `PushError` and leaves the engine's previous policy weights, drafter and version in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from tlt.drafters.base import Drafter, DrafterMismatchError
from tlt.speculative.strategy import SpecStrategy

if TYPE_CHECKING:
    from tlt.backends.native import NativeEngine

DRY_RUN_STRATEGY = SpecStrategy(steps=1, topk=1, verify_tokens=2)


class PushError(RuntimeError):
    """A weight push was rejected; the engine still runs the previous version."""


def push(engine: NativeEngine, policy_state: Mapping[str, torch.Tensor], drafter: Drafter, version: int) -> None:
    """Install `policy_state` (HF names) and a copy of `drafter` in `engine`, both at `version`.

    The engine holds its target as `engine.model` (the native backend). Raises PushError, changing nothing.
    """
    previous = engine.drafter
    try:
        engine.check_weights(policy_state)
        candidate = drafter.clone()
        _check_finite(candidate)
        engine.set_drafter(candidate)  # binds: raises before replacing the engine's drafter
        _dry_run(candidate, engine.model)
    except Exception as err:
        engine.set_drafter(previous)
        raise PushError(
            f"push of version {version} rejected, the engine keeps version {engine.weights_version}: {err}"
        ) from err
    try:
        engine.update_weights(policy_state, version)  # names and shapes checked above: only copies
    except Exception:
        engine.set_drafter(previous)
        raise
    candidate.version = version


def _check_finite(drafter: Drafter) -> None:
    """Every saved tensor of the drafter's modules is finite (a diverged or half-written update is not)."""
    for module_name, module in vars(drafter).items():
        if not isinstance(module, torch.nn.Module):
            continue
        for name, tensor in module.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"drafter tensor {module_name}.{name} has NaN or inf values")


@torch.inference_mode()
def _dry_run(drafter: Drafter, target: torch.nn.Module) -> None:
    """start + propose on one 2-token prompt (zero features): the drafter runs against this target."""
    weight = target.get_input_embeddings().weight
    device, D = weight.device, target.config.hidden_size
    tokens = torch.zeros(1, 2, dtype=torch.long, device=device)  # [B, T]
    hidden = torch.zeros(1, 2, D, dtype=weight.dtype, device=device) if drafter.uses_target_hidden else None
    drafter.start(tokens, hidden, torch.tensor([2], device=device))  # hidden: [B, T, D] or None
    tree = drafter.propose(DRY_RUN_STRATEGY)
    vocab, shape = target.config.vocab_size, tuple(tree.tokens.shape)
    in_vocab = bool(((tree.tokens >= 0) & (tree.tokens < vocab)).all())
    if shape != (1, DRY_RUN_STRATEGY.verify_tokens) or not in_vocab:
        raise DrafterMismatchError(
            f"drafter {type(drafter).__name__} drafted {tree.tokens.tolist()} (shape {shape}) on a dry run; "
            f"expected shape (1, {DRY_RUN_STRATEGY.verify_tokens}) with token ids in [0, {vocab})"
        )
