"""GPU tests are marked ``@pytest.mark.gpu`` and skip with a reason when no GPU is present."""

import pytest

from kaionb._device import gpu_available

HAS_GPU = gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (GPU tests run on the H100)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
