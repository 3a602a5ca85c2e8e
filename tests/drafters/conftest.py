import pytest
import torch

from tlt.models.presets import build_model


def _random_target(std: float, unit_norms: bool) -> torch.nn.Module:
    torch.set_num_threads(1)
    model = build_model("test", vocab_size=64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if unit_norms and "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0, std, generator=g)
    return model


@pytest.fixture(scope="session")
def native_target():
    """A tiny random Qwen2 with varied greedy continuations (unit norm weights) and no near ties."""
    return _random_target(0.15, unit_norms=True)


@pytest.fixture(scope="session")
def looping_target():
    """The backends' test target: its greedy continuations fall into loops (38 38 38 ..., 17 17 ...)."""
    return _random_target(0.15, unit_norms=False)
