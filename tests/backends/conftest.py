import pytest
import torch

from tlt.models.presets import build_model


@pytest.fixture(scope="session")
def native_target():
    """A tiny random Qwen2 whose weights are scaled up so greedy continuations vary and ties are rare."""
    torch.set_num_threads(1)
    model = build_model("test", vocab_size=64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15, generator=g)
    return model
