"""The repo's own modules a module imports, transitively, read from the source (nothing is imported)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks", "models", "flows")


def module_file(name: str) -> Path | None:
    base = REPO / name.replace(".", "/")
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imports(name: str, path: Path) -> set[str]:
    """Module names an import statement anywhere in the file names (functions' lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {n for n in found if n.split(".")[0] in PACKAGES and module_file(n) is not None}


def transitive_imports(*roots: str) -> dict[str, Path]:
    """{module: file} of ``roots`` and every module of this repo they import, directly or not."""
    seen: dict[str, Path] = {}
    pending = [parent for root in roots for parent in _with_parents(root)]
    while pending:
        name = pending.pop()
        if name in seen or (path := module_file(name)) is None:
            continue
        seen[name] = path
        pending += [parent for imported in _imports(name, path) for parent in _with_parents(imported)]
    return seen


def has_code(path: Path) -> bool:
    """Whether a module does anything when imported: a docstring-only ``__init__.py`` does not."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)
