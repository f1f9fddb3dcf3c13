"""The import graph, function-level imports included (grimp's, as lint-imports reads it): the
engine never imports its own front door (the ``notebook_accel`` package) and no module sits on
an import cycle, but for the one door into the front end, by design."""

from __future__ import annotations

import re
from pathlib import Path

import grimp
import pytest
import tomllib

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


LAUNCH = Path(__file__).resolve().parents[2] / "notebook_accel" / "launch"
WORKER_SIDE = {"worker", "handoff"}  # what a worker process may import of launch/


def _launch_members() -> set[str]:
    """launch/'s packages and top-level modules, by name."""
    return {p.stem for p in LAUNCH.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}


def test_the_worker_contract_names_every_kernel_side_package_of_launch():
    contracts = tomllib.loads((LAUNCH.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in contracts if c["id"] == "worker-no-kernel")
    forbidden = {m.removeprefix("notebook_accel.launch.") for m in contract["forbidden_modules"]}
    assert forbidden == _launch_members() - WORKER_SIDE


def test_every_folder_of_launch_holds_at_most_twelve_modules():
    folders = [LAUNCH, *(p for p in LAUNCH.rglob("*") if p.is_dir() and (p / "__init__.py").exists())]
    crowded = {str(f.relative_to(LAUNCH)): n for f in folders
               if (n := len([m for m in f.glob("*.py") if m.stem != "__init__"])) > 12}
    assert crowded == {}


LONGEST = 450  # lines an engine module may have: what a reader takes in at once (issue 48)


def test_no_engine_module_is_over_450_lines():
    engine = LAUNCH.parent
    long = {str(p.relative_to(engine)): n for p in engine.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LONGEST}
    assert long == {}, "split it by job (docs/architecture.md names the parts)"


def test_the_backend_is_chosen_only_inside_the_backends():
    """What a backend can do is asked of it (``local``, ``where``, ``pool_workers``), never read
    from ``plan.cluster`` elsewhere; the cluster's own machinery (launch/cluster/) reads it."""
    inside = (LAUNCH / "backends", LAUNCH / "cluster")
    readers = [str(p.relative_to(LAUNCH.parents[1])) for root in (LAUNCH.parent, LAUNCH.parents[1] / "magics")
               for p in root.rglob("*.py")
               if not p.is_relative_to(inside[0]) and not p.is_relative_to(inside[1])
               and re.search(r"\bplan\.cluster\b", p.read_text())]
    assert readers == []
