"""The dependency direction of DESIGN.md: flows -> models -> cache_runtime -> data_contracts.

The direction is read from the source: every import in every module (lazy ones inside functions
too) may name only its own package or a lower one. That replaced a fresh interpreter per module,
which cost twelve interpreter starts and saw only what was imported at import time. What an
import pulls in at run time, a third-party package importing torch, no parse can see: one
interpreter still imports the serving side and checks that no heavy package came with it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("data_contracts", "cache_runtime", "models", "flows")  # lowest first
HEAVY = ("prefect", "mlflow", "pytorch_lightning", "lightning", "torch", "transformers")
SERVING_SIDE = (
    "cache_runtime.settings",
    "cache_runtime.services",
    "cache_runtime.request_stream",
    "cache_runtime.prefix_hash",
    "cache_runtime.keys",
    "cache_runtime.tiers",
    "cache_runtime.hybrid",
    "cache_runtime.kv_pages",
    "data_contracts",
    "data_contracts.lake",
    "data_contracts.derived",
)


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute import in `tree`, wherever it sits, as (line, dotted name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def upward_imports(root: Path) -> list[str]:
    """`path:line: imports name` for every import of a higher layer than the module's own."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    violations = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            tree = ast.parse(path.read_bytes(), str(path))
            for line, name in imported_names(tree):
                target = name.split(".")[0]
                if rank.get(target, -1) > rank[layer]:
                    violations.append(f"{path.relative_to(root)}:{line}: imports {name}")
    return violations


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_imports(ROOT) == []


def test_a_higher_import_is_found_wherever_it_sits(tmp_path: Path) -> None:
    """What makes the test above mean something: an upward import inside a function is caught,
    a relative one and a third-party one are not violations."""
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "cache_runtime" / "ok.py").write_text(
        "from . import keys\nimport numpy\nfrom data_contracts.lake import Lake\n"
    )
    (tmp_path / "cache_runtime" / "bad.py").write_text(
        "def f():\n    from models.forecast import registry\n"
    )
    assert upward_imports(tmp_path) == ["cache_runtime/bad.py:2: imports models.forecast"]


def test_serving_side_imports_stay_light() -> None:
    """Each serving-side module in turn, in one fresh interpreter: the heavy packages that its
    import loaded (the first module to pull one in is named)."""
    probe = (
        "import importlib, json, sys\n"
        f"heavy, pulled = {HEAVY!r}, {{}}\n"
        f"for name in {SERVING_SIDE!r}:\n"
        "    importlib.import_module(name)\n"
        "    new = [m for m in heavy if m in sys.modules and m not in sum(pulled.values(), [])]\n"
        "    if new:\n"
        "        pulled[name] = new\n"
        "print(json.dumps(pulled))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert orjson.loads(done.stdout) == {}
