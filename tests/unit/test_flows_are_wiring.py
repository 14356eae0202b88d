"""`flows/` is wiring: every module there imports Prefect, Typer, FastAPI, Starlette or uvicorn,
or its docstring says why it is wiring without them.

A module in `flows/` that holds logic a test would want to call without Prefect, Typer or
FastAPI is in the wrong place (it belongs in `models/` or below). The check reads the source,
never imports it: an import anywhere in the module counts (the CLI imports Prefect inside its
commands, so `--help` stays fast), and the explanation is the phrase "Wiring without" in the
module's docstring, followed by the reason. An `__init__.py` that holds only a docstring and
re-exports needs neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WIRING_LIBRARIES = frozenset({"prefect", "typer", "fastapi", "starlette", "uvicorn"})
EXPLAINED = "Wiring without"


def imports_wiring(tree: ast.Module) -> bool:
    """Whether any import in `tree`, wherever it sits, names a wiring library at its top."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name.split(".")[0] in WIRING_LIBRARIES for name in names):
            return True
    return False


def only_reexports(tree: ast.Module) -> bool:
    """A docstring, imports and `__all__`: a package's front door, no code of its own."""
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if not (len(targets) == 1 and isinstance(targets[0], ast.Name)):
            return False
        if targets[0].id != "__all__":
            return False
    return True


def unexplained_modules(root: Path) -> list[str]:
    """Every module under `root/flows` that is neither wiring by its imports, nor says in its
    docstring why it is wiring without them, nor an `__init__.py` of re-exports only."""
    found = []
    for path in sorted((root / "flows").rglob("*.py")):
        tree = ast.parse(path.read_bytes(), str(path))
        if imports_wiring(tree) or EXPLAINED in (ast.get_docstring(tree) or ""):
            continue
        if path.name == "__init__.py" and only_reexports(tree):
            continue
        found.append(str(path.relative_to(root)))
    return found


def test_every_flows_module_is_wiring_or_says_why() -> None:
    assert unexplained_modules(ROOT) == []


def test_the_check_catches_a_module_of_plain_logic(tmp_path: Path) -> None:
    """What makes the test above mean something: plain logic is caught wherever it sits; a
    lazy import of a wiring library counts, a package that merely starts with the same letters
    (`prefect_dask`) or a mention in a string does not; the phrase counts only in the module's
    docstring; an `__init__.py` with code of its own is caught."""
    files = {
        "flows/lazy.py": "def run():\n    from prefect import flow\n",
        "flows/cli/app.py": "import typer.main\n",
        "flows/served.py": "from starlette.responses import Response\n",
        "flows/explained.py": '"""Wiring without a Prefect import of its own: it runs first."""\n',
        "flows/pkg/__init__.py": '"""A package."""\n\nfrom .lazy import run\n\n__all__ = ["run"]\n',
        "flows/empty/__init__.py": "",
        "flows/logic.py": '"""Hot keys."""\n\ndef hottest(counts):\n    return max(counts)\n',
        "flows/dask_only.py": "from prefect_dask import DaskTaskRunner\n",
        "flows/string_only.py": 'NOTE = "uses prefect"\n',
        "flows/late_phrase.py": 'X = 1\n"""Wiring without: not the docstring."""\n',
        "flows/code/__init__.py": '"""A package."""\n\nLIMIT = 3\n',
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert unexplained_modules(tmp_path) == [
        "flows/code/__init__.py",
        "flows/dask_only.py",
        "flows/late_phrase.py",
        "flows/logic.py",
        "flows/string_only.py",
    ]
