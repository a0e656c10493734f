"""GPU tests are marked ``@pytest.mark.gpu`` and skip with a reason when no GPU is present.

Hypothesis profiles of the fuzz tests (tests/test_fuzz_*.py), chosen by KAIONB_FUZZ_PROFILE:
"ci" (the default) runs a fixed small number of examples, the same ones every run;
"gpu-long" thousands per op (tests/run_fuzz_long.sh). Failures print a reproduction blob.
"""

import os

import pytest
from hypothesis import settings

from kaionb._device import gpu_available

HAS_GPU = gpu_available()

settings.register_profile("ci", max_examples=50, derandomize=True, deadline=None,
                          print_blob=True)
settings.register_profile("gpu-long", max_examples=2000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("KAIONB_FUZZ_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine (GPU tests run on the H100)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def kernels_run(monkeypatch):
    """The names of the kernels every ``Plan.launch`` ran (the launches go ahead), so a
    GPU test can check that the path it means to test is the one taken."""
    from kaionb._device import STATE
    from kaionb.kernels.op import Plan

    names = []
    launch = Plan.launch

    def launch_and_note(plan, *args):
        names.append(plan.kernel.kdef.name)
        launch(plan, *args)

    monkeypatch.setattr(Plan, "launch", launch_and_note)
    saved, STATE.calls = STATE.calls, None  # no replays of earlier calls' plans
    yield names
    STATE.calls = saved
