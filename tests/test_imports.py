"""The package's import graph: no cycles between modules (counting imports made only for type checking), the
leaf math in tlt/speculative imports nothing of tlt above it, and every module imports on its own."""

import ast
import subprocess
import sys
from pathlib import Path

import tlt

PACKAGE = Path(tlt.__file__).parent
OPTIONAL = ("vllm", "sglang", "trl", "lm_eval", "arctic_inference")  # extras a module may need at import


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_level_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """tlt modules imported outside function bodies (a function-local import runs on call, not on import)."""
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("tlt"):
                for alias in child.names:
                    full = f"{child.module}.{alias.name}"
                    found.add(full if full in known else child.module)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("tlt"))
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: module_level_imports(path, known) - {name} for name, path in known.items()}


def cycle_from(start: str, edges: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycles():
    edges = graph()
    cycles = [c for name in sorted(edges) if (c := cycle_from(name, edges))]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_leaf_math_imports_nothing_above_it():
    above = {name: sorted(d for d in deps if not d.startswith("tlt.speculative")) for name, deps in graph().items()}
    assert not {name: deps for name, deps in above.items() if name.startswith("tlt.speculative") and deps}


def test_the_cycle_check_finds_a_cycle():
    assert cycle_from("a", {"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_from("a", {"a": {"b"}, "b": set()}) is None


def test_every_module_imports_on_its_own():
    """Each module imported with no other tlt module loaded before it (one interpreter, tlt.* dropped from
    sys.modules between imports; the third-party libraries stay loaded, so it takes seconds)."""
    script = f"""
import importlib, sys
failed = []
for name in {sorted(modules())!r}:
    for loaded in [m for m in sys.modules if m == "tlt" or m.startswith("tlt.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ImportError as err:
        if not any(pkg in str(err) for pkg in {OPTIONAL!r}):
            failed.append(f"{{name}}: {{err!r}}")
    except Exception as err:
        failed.append(f"{{name}}: {{err!r}}")
print("\\n".join(failed))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.strip() == "", out.stdout
