"""Print the layering figures of a checkout: import cycles among the engine's modules, upward
imports (engine -> magics/IPython/ipywidgets, runtime -> notebook_accel.launch) and top-level units.

Usage, from a checkout's root: ``PYTHONPATH=. python scripts/layering_counts.py`` (grimp comes with
import-linter, in the dev extra). Lazy (function-level) imports count too.
"""

from __future__ import annotations

import sys

import grimp

KERNEL_SIDE = ("notebook_accel.launch", "notebook_accel.cli")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(10000)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def main() -> None:
    graph = grimp.build_graph("notebook_accel", "magics", include_external_packages=True, cache_dir=None)
    modules = sorted(m for m in graph.modules if m.startswith("notebook_accel"))
    edges = {m: {b for b in graph.find_modules_directly_imported_by(m) if b.startswith("notebook_accel")}
             for m in modules}
    front = [(a, b) for a in modules for b in graph.find_modules_directly_imported_by(a)
             if b.split(".")[0] in ("magics", "IPython", "ipywidgets")]
    upward = [(a, b) for a in modules if not a.startswith(KERNEL_SIDE) and a != "notebook_accel"
              for b in edges[a] if b.startswith("notebook_accel.launch")]
    found = cycles(edges)
    print(f"import cycles: {len(found)}")
    for component in found:
        print("   ", " -> ".join(component))
    print(f"engine -> front end imports: {len(front)}")
    for a, b in front:
        print("   ", a, "->", b)
    print(f"runtime -> launch imports: {len(upward)}")
    for a, b in upward:
        print("   ", a, "->", b)
    print(f"top-level units in notebook_accel/: {len(graph.find_children('notebook_accel'))}")


if __name__ == "__main__":
    main()
