"""The floor plan holds: no import circle between any two modules of kvcal (import-linter's contracts, run by
`make lint`, check the wings' direction and the pure core; they see circles between packages, this sees modules)."""

from collections.abc import Mapping, Set

import grimp


def circles(imports: Mapping[str, Set[str]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or around a loop (Tarjan's strongly connected
    components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in imports.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in imports.get(module, ()):
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def kvcal_imports() -> dict[str, set[str]]:
    graph = grimp.build_graph("kvcal")
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def test_the_circle_finder_finds_a_loop_through_three_modules_and_a_self_import() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(imports) == [["a", "b", "c"], ["e"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_of_kvcal_is_in_an_import_circle() -> None:
    imports = kvcal_imports()
    assert "kvcal.core.decide" in imports  # the graph is the package's, not an empty one
    assert circles(imports) == []


def test_the_core_keeps_its_top_level_small() -> None:
    """The core's top level holds decide, the phase table and the lifecycle's own small modules; a check, a builder
    or a guard goes in its wing (docs/architecture.md says which)."""
    top_level = {m for m in kvcal_imports() if m.count(".") == 2 and m.startswith("kvcal.core.")}
    wings = {"kvcal.core." + wing for wing in ("analysis", "artifact", "guard", "manifests", "rollout", "status")}
    assert wings <= top_level
    assert len(top_level - wings) <= 10, sorted(top_level - wings)
