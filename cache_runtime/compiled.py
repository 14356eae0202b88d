"""The eviction policies compiled with mypyc: the same source, run as C where a compiler is at hand.

Why: the pool replays every sampled access through ten shadow policies, and below 128 entries
it samples every key, so the policies' Python method calls bound the replay (issue 21's goal is
200,000 accesses/s with the shadows running; pure Python reached 53,000 on the cs trace).
Compiled by mypyc, the same modules (`MODULES`) replay the 44 cells of
`benchmarks/robustness.py` 2.3 to 2.9x faster with the same hits in every cell (2026-12-05).
mypyc rather than Cython or a C rewrite: it compiles the typed Python as it is, so the memory
tier and the simulator keep running one source (ADR 0002), and the plain modules stay the
reference where it is not built.

`make` runs this file after installing (`.venv/bin/python cache_runtime/compiled.py`, from the
repository root). It builds `MODULES` in place: an extension beside each source and the group's
shared library `compiled__mypyc`, all gitignored. Where the build fails (no C compiler), it
removes what it left and says so in one line; the policies then run as plain Python.

Python imports an extension in preference to the `.py` beside it, so an extension older than its
source would run old code without a sign: `check_fresh`, called when `cache_runtime` is
imported, refuses that with the command that rebuilds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MODULES = (
    "key_queue",
    "policies",
    "prefix_policies",
    "queue_policies",
    "tinylfu",
    "shadows",
    "handover",
    "selector",
    "following",
    "pool",
)  # the Makefile's POLICIES
GROUP = "cache_runtime.compiled"  # the shared library: cache_runtime/compiled__mypyc.*.so
PACKAGE = Path(__file__).resolve().parent
REBUILD = "run `make install` (or `.venv/bin/python cache_runtime/compiled.py`)"

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
modules, group, temp = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
setup(
    name="preheat-compiled-policies",
    ext_modules=mypycify(
        ["--ignore-missing-imports", "--follow-imports=silent", *modules],
        group_name=group, target_dir=temp,
    ),
    script_args=["build_ext", "--inplace", "--build-temp", temp, "--build-lib", temp],
)
"""


def extensions(directory: Path = PACKAGE) -> list[Path]:
    """Every compiled file of the group in `directory` (the modules' and the shared library)."""
    names = (*MODULES, GROUP.rsplit(".", 1)[1] + "__mypyc")
    return sorted(path for name in names for path in directory.glob(f"{name}.*.so"))


def stale_modules(directory: Path = PACKAGE) -> list[str]:
    """The modules whose extension in `directory` is older than their source."""
    return [
        name
        for name in MODULES
        for extension in directory.glob(f"{name}.*.so")
        if extension.stat().st_mtime < (directory / f"{name}.py").stat().st_mtime
    ]


def check_fresh(directory: Path = PACKAGE) -> None:
    """Refuse extensions older than their source (they would run the old code)."""
    if stale := stale_modules(directory):
        raise ImportError(
            f"cache_runtime: the compiled {', '.join(stale)} is older than its source; "
            f"{REBUILD}, or delete cache_runtime/*.so"
        )


def build(root: Path = PACKAGE.parent) -> bool:
    """Compile `MODULES` of `root`/cache_runtime in place; False (and nothing left behind, and
    one line said) where that fails."""
    # here, not at the top: `import cache_runtime` runs `check_fresh` in every process, and
    # these two took about 5 of its 8.7 ms there
    import subprocess
    import tempfile

    package = root / "cache_runtime"
    for path in extensions(package):
        path.unlink()
    sources = ",".join(f"cache_runtime/{name}.py" for name in MODULES)
    with tempfile.TemporaryDirectory() as temp:
        done = subprocess.run(
            [sys.executable, "-c", _SETUP, sources, GROUP, temp],
            cwd=root, capture_output=True, text=True, check=False,
        )  # fmt: skip
    built = extensions(package)
    if done.returncode == 0 and len(built) == len(MODULES) + 1:
        for path in built:  # setuptools keeps an older time on a module's unchanged shim
            os.utime(path)
        return True
    for path in extensions(package):
        path.unlink()
    reason = (done.stderr.strip().splitlines() or ["no extension was written"])[-1]
    print(
        f"cache_runtime: policies not compiled, they run as plain Python ({reason}); "
        "to try again, delete .venv/.preheat-compiled and run make"
    )
    return False


if __name__ == "__main__":
    if build():
        print(f"cache_runtime: compiled {', '.join(MODULES)} with mypyc")
