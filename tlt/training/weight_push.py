"""Pushing new policy weights and the new drafter to a rollout engine together, all or nothing.

A stale drafter is the top complaint about SD in RL frameworks, and a drafter that writes its own embedding
over the target's would change the policy being trained (a bug of the TLT reference code). `push` therefore:

1. checks the policy state's names and shapes against the engine (nothing applied yet);
2. clones the drafter (the engine gets its own copy, so later training of the replica cannot touch it),
   checks its weights are finite and lets the engine check it (`check_drafter`: the native engine binds it
   to the target, EAGLE sharing the target's embedding and LM head by reference and never writing them, and
   drafts once on a tiny input; vLLM checks it matches the running draft model's shape);
3. only then installs the drafter and the policy weights, and tags engine and drafter with the same version.

Any failure raises `PushError` and leaves the engine's previous policy weights, drafter and version in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from tlt.drafters.base import Drafter

if TYPE_CHECKING:
    from tlt.backends.base import RolloutEngine


class PushError(RuntimeError):
    """A weight push was rejected; the engine still runs the previous version."""


def push(engine: RolloutEngine, policy_state: Mapping[str, torch.Tensor], drafter: Drafter, version: int) -> None:
    """Install `policy_state` (HF names) and a copy of `drafter` in `engine`, both at `version`.

    Raises PushError, changing nothing, when a check fails; if installing fails after the checks passed, the
    previous drafter is put back and the error re-raised.
    """
    try:
        engine.check_weights(policy_state)
        candidate = drafter.for_engine()
        if candidate is not engine.drafter:
            _check_finite(candidate)
            engine.check_drafter(candidate.probe())  # binds and drafts once (native) or checks shapes (vLLM)
    except Exception as err:
        raise PushError(
            f"push of version {version} rejected, the engine keeps version {engine.weights_version}: {err}"
        ) from err
    previous = engine.drafter
    try:
        engine.set_drafter(candidate)
        engine.update_weights(policy_state, version)  # names and shapes checked above: only copies
    except Exception:
        engine.set_drafter(previous)
        raise
    candidate.version = version


def _check_finite(drafter: Drafter) -> None:
    """Every saved tensor of the drafter's modules (and its parts') is finite (a diverged or half-written update
    is not)."""
    for module_name, module in vars(drafter).items():
        if isinstance(module, Drafter):
            _check_finite(module)
        if not isinstance(module, torch.nn.Module):
            continue
        for name, tensor in module.state_dict().items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"drafter tensor {module_name}.{name} has NaN or inf values")
