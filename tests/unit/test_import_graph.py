"""The import graph, function-level imports included (grimp's, as lint-imports reads it): the
engine never imports its own front door (the ``notebook_accel`` package) and no module sits on
an import cycle, but for the one door into the front end, by design."""

from __future__ import annotations

import grimp
import pytest

DOOR = "notebook_accel"
FRONT_END_DOOR = (DOOR, "magics")  # notebook_accel._front_end: %load_ext, and a launch's live view


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(DOOR, "magics", cache_dir=None)


def _cycle_edges(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Each direct import ``(importer, imported)`` that ``imported`` leads back from."""
    return sorted((importer, imported) for importer in graph.modules
                  for imported in graph.find_modules_directly_imported_by(importer)
                  if graph.chain_exists(importer=imported, imported=importer))


def test_no_engine_module_imports_the_package_door(graph):
    importers = {m for m in graph.find_modules_that_directly_import(DOOR) if m.startswith(DOOR + ".")}
    assert importers == set(), "import the module that defines the name, not the package door"


def test_no_import_cycle_but_the_front_end_door(graph):
    graph.remove_import(importer=FRONT_END_DOOR[0], imported=FRONT_END_DOOR[1])
    cycles = _cycle_edges(graph)
    assert cycles == [], [graph.find_shortest_chain(importer=b, imported=a) for a, b in cycles[:3]]


def test_the_check_sees_a_cycle_and_a_door_import():
    graph = grimp.ImportGraph()
    for module in (DOOR, f"{DOOR}.a", f"{DOOR}.b"):
        graph.add_module(module)
    graph.add_import(importer=f"{DOOR}.a", imported=f"{DOOR}.b")
    graph.add_import(importer=f"{DOOR}.b", imported=DOOR)
    graph.add_import(importer=DOOR, imported=f"{DOOR}.a")
    assert _cycle_edges(graph) == [(DOOR, f"{DOOR}.a"), (f"{DOOR}.a", f"{DOOR}.b"),
                                   (f"{DOOR}.b", DOOR)]
    assert graph.find_modules_that_directly_import(DOOR) == {f"{DOOR}.b"}
