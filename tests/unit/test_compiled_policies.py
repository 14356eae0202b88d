"""The mypyc build of the eviction policies: a stale extension is refused, a failed build leaves
nothing behind and says so in one line."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from cache_runtime import compiled, pool

SUFFIX = ".cpython-311-x86_64-linux-gnu.so"


def _package(root: Path) -> Path:
    package = root / "cache_runtime"
    package.mkdir()
    for name in compiled.MODULES:
        (package / f"{name}.py").write_text("x = 1\n")
    return package


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    package = _package(tmp_path)
    extension = package / f"pool{SUFFIX}"
    extension.write_bytes(b"")
    os.utime(extension, (1_000, 1_000))  # built before the source was last edited
    assert compiled.stale_modules(package) == ["pool"]
    with pytest.raises(ImportError, match="compiled pool is older than its source; run `make"):
        compiled.check_fresh(package)
    os.utime(extension)  # rebuilt now
    compiled.check_fresh(package)


def test_a_failed_build_leaves_no_extension_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = _package(tmp_path)
    (package / "pool.py").write_text("def broken(:\n")  # mypy cannot parse it
    (package / f"compiled__mypyc{SUFFIX}").write_bytes(b"")  # a previous build's
    assert not compiled.build(tmp_path)
    assert compiled.extensions(package) == []
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "run as plain Python" in out[0]


def test_the_checkout_s_extensions_are_fresh_and_imported_where_built() -> None:
    compiled.check_fresh()  # what `import cache_runtime` already did
    if any(path.name.startswith("pool.") for path in compiled.extensions()):
        assert pool.__file__.endswith(".so")


def test_make_rebuilds_when_any_compiled_module_changes() -> None:
    """The Makefile's POLICIES (what a rebuild depends on) names the modules the build compiles."""
    makefile = (Path(compiled.PACKAGE).parent / "Makefile").read_text()
    line = re.search(r"^POLICIES := .*,(.*)\)$", makefile, re.MULTILINE)
    assert line is not None
    assert line.group(1).split() == [f"{name}.py" for name in compiled.MODULES]


@pytest.mark.slow
def test_a_build_replaces_every_extension_with_a_fresh_one(tmp_path: Path) -> None:
    """A real mypyc build of `compiled.MODULES` (skipped where no C compiler is at hand): every
    extension and the shared library come out newer than the sources, whatever was there."""
    package = tmp_path / "cache_runtime"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in compiled.MODULES:
        shutil.copy(compiled.PACKAGE / f"{name}.py", package)
        old = package / f"{name}{SUFFIX}"  # a previous build's, older than the sources
        old.write_bytes(b"")
        os.utime(old, (1_000, 1_000))
    if not compiled.build(tmp_path):
        pytest.skip("mypyc could not build here (no C compiler)")
    assert len(compiled.extensions(package)) == len(compiled.MODULES) + 1
    compiled.check_fresh(package)
    assert not (tmp_path / "build").exists()  # the C sources and objects went to a temp dir
