"""gdpo_jax.lazy_exports: the packages whose names load on first use (models, sampling,
train) import neither flax nor optax until a name that needs them is read, and every
name they export is the object of the module it names."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from gdpo_jax.lazy_exports import lazy_exports
from tests._subprocess import run_python

LAZY_PACKAGES = ("gdpo_jax.models", "gdpo_jax.sampling", "gdpo_jax.train")


def test_the_packages_import_without_flax_until_a_name_needs_it():
    # Their __init__ had imported the transformer and the sampler (and with them flax and
    # optax, about 0.5 s) for a config check that reads the model's config.
    code = (
        "import sys\n"
        f"for name in {LAZY_PACKAGES!r}: __import__(name)\n"
        "from gdpo_jax.models import ModelConfig\n"
        "from gdpo_jax.sampling import SamplingParams\n"
        "from gdpo_jax.train import base_config\n"
        "assert not {'flax', 'optax', 'orbax'} & set(sys.modules), sorted(sys.modules)\n"
        "from gdpo_jax.models import Transformer\n"
        "assert 'flax' in sys.modules\n"
        "print('ok')\n"
    )
    out = run_python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_each_exported_name_is_its_modules_object(package):
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        assert name in dir(pkg)
        if name in pkg._LAZY:
            home = importlib.import_module(pkg._LAZY[name])
            assert value is getattr(home, name), f"{package}.{name}"
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'nope'"):
        pkg.nope  # noqa: B018


def test_a_name_is_imported_once_then_read_from_the_package(tmp_path, monkeypatch):
    """The hook imports the named module on the first read and sets the name on the
    package; an unknown name is an AttributeError, and `from pkg import unknown` an
    ImportError, as for any module."""
    (tmp_path / "lazy_home.py").write_text("CALLS = []\ndef f():\n    return 1\nCALLS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = types.ModuleType("lazy_pkg")
    monkeypatch.setitem(sys.modules, "lazy_pkg", pkg)
    monkeypatch.delitem(sys.modules, "lazy_home", raising=False)
    pkg.__getattr__, pkg.__dir__ = lazy_exports("lazy_pkg", {"f": "lazy_home"})
    assert "lazy_home" not in sys.modules and "f" in dir(pkg)
    assert pkg.f() == 1 and "f" in vars(pkg)  # set on the package: no second hook call
    assert sys.modules["lazy_home"].CALLS == [1]
    with pytest.raises(AttributeError, match="module 'lazy_pkg' has no attribute 'g'"):
        pkg.g  # noqa: B018
    with pytest.raises(ImportError):
        from lazy_pkg import g  # noqa: F401


@pytest.mark.parametrize("package", ("gdpo_jax.models", "gdpo_jax.sampling"))
def test_the_type_checkers_imports_are_the_lazy_table(package):
    """The `if TYPE_CHECKING:` imports (what IDEs and type checkers see) name the same
    modules and names as `_LAZY` (what runs): the two are written side by side, and
    nothing else keeps them equal."""
    import ast

    pkg = importlib.import_module(package)
    tree = ast.parse(open(pkg.__file__).read())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n)]
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == pkg._LAZY
