"""The shape of the code base: no import cycles, dependency directions, file sizes, variants chosen by
registry, and results kept out of the code tree."""

import ast
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("vagen", "envs_visual")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports anywhere in the file (top level or inside a function):
    `import a.b`, `from a.b import c` (a.b.c when that is a module), relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    files = [f for package in PACKAGES for f in python_files(package)]
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_dependency_directions():
    graph = import_graph()
    for module, imported in graph.items():
        if module.startswith("envs_visual"):
            assert not {m for m in imported if m.startswith("vagen")}, module
        if module.startswith("vagen.algo"):  # pure tensor math: torch and itself only
            assert {m for m in imported if not m.startswith("vagen.algo")} == set(), module
    assert graph["vagen.config"] == set()  # the schema imports no other part of vagen


def test_file_sizes():
    sizes = {f: len(f.read_text().splitlines()) for package in PACKAGES for f in python_files(package)}
    assert not {str(f.relative_to(REPO)): n for f, n in sizes.items() if n > 600}
    assert sizes[REPO / "vagen" / "trainer.py"] < 450
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_policy_update_names_are_compared_only_in_their_registry():
    from vagen.updates import POLICY_UPDATES

    offenders = []
    for package in PACKAGES:
        for path in python_files(package):
            if path.is_relative_to(REPO / "vagen" / "updates"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    strings = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                    if set(strings) & set(POLICY_UPDATES):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def tracked(pattern: str) -> list[str]:
    done = subprocess.run(["git", "ls-files", pattern], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return done.stdout.split()


def test_results_stay_out_of_the_code_tree():
    results = tracked("bench/results")
    assert len(results) <= 40 and not [f for f in results if f.endswith(".py")]
    readers = [f for f in python_files("tests") if "bench/results" in f.read_text().replace('" / "', "/")]
    assert readers == [REPO / "tests" / "test_structure.py"]  # only this test names it
