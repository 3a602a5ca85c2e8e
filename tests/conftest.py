import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption(
        "--static-shapes",
        action="store_true",
        help="build every NativeEngine on its static-shape path (cuda_graphs=True; uncaptured on CPU), so the "
        "identity and exactness suites check that path",
    )


@pytest.fixture(scope="session", autouse=True)
def _static_shapes(request):
    """With --static-shapes, NativeEngine's cuda_graphs defaults to True for the whole session (set before any
    module-scoped fixture builds an engine)."""
    if not request.config.getoption("--static-shapes"):
        yield
        return
    from tlt.backends.native import NativeEngine

    original = NativeEngine.__init__

    def static_init(self, *args, **kwargs):
        kwargs.setdefault("cuda_graphs", True)
        original(self, *args, **kwargs)

    NativeEngine.__init__ = static_init
    yield
    NativeEngine.__init__ = original
