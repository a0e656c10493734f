"""The API reference (docs/api, Sphinx + numpydoc) documents every public name.

A name is documented when a page under docs/api has a directive for it (``autofunction``,
``autoclass``, ``automodule``, ``data``, ``function``, ...), spelled in full
(``kaionb.random.Generator``) or under the page's ``.. currentmodule::``. Building the
reference (``python -m sphinx -W --keep-going -b html docs/api docs/_build/api``, which
.ci/run does) checks the docstrings themselves; this test keeps a new op from being left
out of it. CPU only: nothing here launches or imports Sphinx.
"""

import inspect
import re
from pathlib import Path

import kaionb
import kaionb.grad
import kaionb.random
import kaionb.testing

API_DIR = Path(__file__).resolve().parent.parent / "docs" / "api"
DIRECTIVE = re.compile(r"^\.\. (?:auto)?(?:function|class|data|module|method|attribute|"
                       r"exception)::\s+(?:(\w[\w.]*)::)?([\w.]+)", re.M)
CURRENT = re.compile(r"^\.\. (?:currentmodule|module)::\s+([\w.]+)", re.M)


def documented_names() -> set:
    """Every fully qualified name a directive of a docs/api page documents."""
    names = set()
    for page in sorted(API_DIR.glob("*.rst")):
        text = page.read_text()
        # Each directive takes the module of the last currentmodule/module line before it.
        marks = [(m.start(), m.group(1)) for m in CURRENT.finditer(text)]
        for m in DIRECTIVE.finditer(text):
            explicit, name = m.group(1), m.group(2)
            if explicit:
                names.add(f"{explicit}.{name}")
                continue
            names.add(name)
            module = next((mod for pos, mod in reversed(marks) if pos < m.start()), None)
            if module and not name.startswith(module + "."):
                names.add(f"{module}.{name}")
    return names


def test_reference_pages_exist():
    assert (API_DIR / "conf.py").is_file() and (API_DIR / "index.rst").is_file()
    index = (API_DIR / "index.rst").read_text()
    for page in API_DIR.glob("*.rst"):
        if page.stem != "index":
            assert re.search(rf"^   {page.stem}$", index, re.M), f"{page.name} not in index"


def test_every_public_name_is_in_the_reference():
    names = documented_names()
    missing = [n for n in kaionb.__all__ if f"kaionb.{n}" not in names]
    assert not missing, f"kaionb.__all__ names no docs/api page documents: {missing}"


def test_every_submodule_name_is_in_the_reference():
    names = documented_names()
    public = [f"kaionb.random.{n}" for n in kaionb.random.__all__]
    public += [f"kaionb.grad.{n}" for n in kaionb.grad.__all__]
    public += [f"kaionb.testing.{n}" for n, v in vars(kaionb.testing).items()
               if not n.startswith("_") and (
                   (inspect.isfunction(v) and v.__module__ == "kaionb.testing")
                   or n.isupper())]
    missing = [n for n in public if n not in names]
    assert not missing, f"names no docs/api page documents: {missing}"


def test_device_array_members_have_docstrings():
    # autoclass :members: shows only members with a docstring: one without would vanish.
    missing = []
    for name, value in vars(kaionb.DeviceArray).items():
        if name.startswith("_") or type(value).__name__ == "member_descriptor":
            continue  # slots are listed in the class docstring's Attributes
        target = value.fget if isinstance(value, property) else value
        if not inspect.getdoc(target):
            missing.append(name)
    assert not missing, f"DeviceArray members without a docstring: {missing}"
