"""Sphinx configuration of kaionb's API reference (docs/api).

Build (no GPU needed: kaionb imports without one)::

    python -m sphinx -W --keep-going -b html docs/api docs/_build/api

Every page documents its names with autodoc (``autofunction``, ``autoclass``); numpydoc
parses the docstrings and validates them (``numpydoc_validation_checks``): with ``-W`` a
public function without Parameters, Returns or Examples fails the build. numpydoc has no
check for a Raises section, so :func:`_require_raises` adds one.
"""

import re

from numpydoc.docscrape import NumpyDocString
from sphinx.util import logging

import kaionb

project = "kaionb"
author = "kaionb developers"
copyright = "kaionb developers"  # noqa: A001  (Sphinx's name)
release = version = kaionb.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
]

root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = []
html_theme_options = {"nosidebar": False}

# -- autodoc -------------------------------------------------------------------------------
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # types are in the numpydoc Parameters sections
autodoc_preserve_defaults = True  # show `dtype=np.float16`, not `<class 'numpy.float16'>`
autosummary_generate = False  # tables only: every page writes its own autodoc entries

# -- numpydoc ------------------------------------------------------------------------------
numpydoc_show_class_members = False  # DeviceArray & co. list their members with :members:
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_use_plots = False

# Every check, less these:
#  ES01  extended summary: short functions say all in the summary and the sections.
#  SA01  See Also: added where it helps, not required on every function.
#  GL01  the project's docstrings start on the line of the opening quotes (PEP 257 style).
#  SS05  "summary must start with an infinitive verb": a heuristic (any first word ending
#        in "s") that flags noun summaries, which some are on purpose ("Gradients of
#        attention ...", "Sum of the elements ...", properties such as "Bytes per element").
numpydoc_validation_checks = {"all", "ES01", "SA01", "GL01", "SS05"}
# NumPy's own objects re-exported by kaionb (finfo, result_type, ...) are not autodoc'd;
# nothing here is excluded from validation.
numpydoc_validation_exclude = set()

# Public functions and methods that raise nothing of their own (no Raises section).
RAISES_NOTHING = {
    "kaionb.gpu_available",
    "kaionb.device_count",
    "kaionb.current_stream",
    "kaionb.empty_cache",
    "kaionb.grad.active_tape",
    "kaionb.DeviceArray.copy",
    "kaionb.DeviceArray.ravel",
    "kaionb.DeviceArray.flatten",
    "kaionb.Graph.keep",
    "kaionb.grad.Tape.reset",
}

_logger = logging.getLogger(__name__)


def _require_raises(app, what, name, obj, options, lines):
    """A public function or method without a Raises section is a warning (an error under
    ``-W``): which TypeError / ValueError for what is part of the contract."""
    if what not in ("function", "method") or name in RAISES_NOTHING:
        return
    if re.search(r"\.__\w+__$", name):
        return
    try:
        sections = NumpyDocString("\n".join(lines))
    except Exception:  # noqa: BLE001  (numpydoc reports what it cannot parse)
        return
    if not sections["Raises"]:
        _logger.warning("[kaionb] %s: no Raises section (add one, or list the name in "
                        "RAISES_NOTHING in docs/api/conf.py)", name)


def setup(app):
    # before numpydoc (priority 500) rewrites the docstring into reST
    app.connect("autodoc-process-docstring", _require_raises, priority=400)
