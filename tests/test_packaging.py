"""A non-editable wheel ships every file and reads its data from where it is installed.

`make install` is an editable install, which reads the repository directly, so it
cannot show a file that a wheel leaves out. This test builds the wheel from a clean
copy of the sources (an in-tree `build/` keeps stale files from older builds), checks
setuptools has no packaging warning, and imports the installed copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = ("gdpo_jax", "configs", "experiments")


def _source_files(src: str) -> set[str]:
    out = set()
    for top in SHIPPED:
        for d, _, files in os.walk(os.path.join(src, top)):
            out |= {os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/") for f in files}
    return out


def test_wheel_ships_every_file_and_its_data_loads(tmp_path):
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in SHIPPED:
        shutil.copytree(os.path.join(ROOT, top), src / top, ignore=ignore)
    for f in ("setup.py", "pyproject.toml"):
        shutil.copy(os.path.join(ROOT, f), src / f)

    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = built.stdout + built.stderr
    assert built.returncode == 0, log[-3000:]
    # setuptools' warning for a shipped directory that is not a listed package: a
    # future setuptools may drop such a directory from the wheel.
    assert "absent from the `packages` configuration" not in log, log[-3000:]

    (whl,) = (tmp_path / "dist").glob("gdpo_jax-*.whl")
    names = {n for n in zipfile.ZipFile(whl).namelist() if ".dist-info/" not in n}
    expected = _source_files(str(src))
    assert any(n.endswith(".txtpb") for n in expected)
    assert any(n.startswith("gdpo_jax/data/samples/") for n in expected)
    assert sorted(expected - names) == []
    assert sorted(names - expected) == []

    # Unpack the wheel as an installed copy, ahead of the editable install on sys.path,
    # and read the data through the package's own paths from outside the repository.
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    probe = (
        "import os, gdpo_jax\n"
        "from gdpo_jax.data.loaders import sample_path, samples_dir\n"
        "from gdpo_jax.scale import targets\n"
        "print(os.path.dirname(gdpo_jax.__file__))\n"
        "print(len(os.listdir(samples_dir())))\n"
        "assert os.path.getsize(sample_path('toolcall_verl.jsonl')) > 0\n"
        "for chip in targets.CHIPS.values():\n"
        "    if chip.platform == 'cuda':\n"
        "        assert 'device_memory_size' in targets.gpu_target_config(chip)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site), JAX_PLATFORMS="cpu")
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    package_dir, n_samples = ran.stdout.split()[-2:]
    assert os.path.realpath(package_dir) == os.path.realpath(site / "gdpo_jax")
    assert int(n_samples) == len(os.listdir(src / "gdpo_jax" / "data" / "samples"))


def _pins() -> dict[str, str]:
    """setup.py's exact pins, {distribution name: version}, from the install set and
    every extra (`jax[tpu]==0.10.2` pins jax)."""
    import ast
    import re

    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("INSTALL_REQUIRES", "EXTRAS"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    reqs = list(found["INSTALL_REQUIRES"]) + [r for v in found["EXTRAS"].values() for r in v]
    pins = {}
    for req in reqs:
        name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", req).groups()
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_environment_has_the_pinned_versions():
    """Every exact pin of setup.py (install set and extras: `make test` installs them
    all) is the version installed: a resolver that picked another version of a pinned
    dependency (ml_dtypes 0.7.0's import took 1 s, 0.6.0's a fraction of that) fails
    here, not as a slower suite. A local label (torch's `2.13.0+cpu`) matches its
    pin, as pip's `==` does."""
    import importlib.metadata

    pins = _pins()
    assert pins["ml-dtypes"] == "0.6.0" and pins["jax"] == "0.10.2" and len(pins) > 30
    have = {name: importlib.metadata.version(name) for name in pins}
    wrong = {n: (want, have[n]) for n, want in pins.items() if have[n].split("+")[0] != want}
    assert wrong == {}, wrong
