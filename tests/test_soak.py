"""A short soak (tests/gpu/soak.py) in the GPU suite: 2,000 mixed calls, no growth in device
or host memory, caches within their bounds. The 10,000-call run is docs/reliability.md's."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _soak_module():
    path = Path(__file__).parent / "gpu" / "soak.py"
    spec = importlib.util.spec_from_file_location("kaionb_soak", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_soak_grows_nothing(capsys):
    rc = _soak_module().main(["--calls", "2000", "--warmup", "500", "--every", "500"])
    out = capsys.readouterr().out
    assert rc == 0, out
