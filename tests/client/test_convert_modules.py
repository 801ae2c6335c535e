"""agentstate.client.convert is one module per aggregate: each name defined in one module,
the modules importing one another by public names only and never in a circle, and the
package re-exporting every RPC's builder."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from agentstate.client import convert
from tests.support.paths import REPO

CONVERT = REPO / "client" / "src" / "agentstate" / "client" / "convert"
PACKAGE = "agentstate.client.convert"


def sources() -> dict[str, str]:
    """Each module of the package (not __init__) by its short name, with its source."""
    return {p.stem: p.read_text() for p in sorted(CONVERT.glob("*.py")) if p.stem != "__init__"}


def defined(source: str) -> set[str]:
    """The top-level functions, classes and assignments of a module."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def sibling_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) of each name imported from another module of the package."""
    return [
        (node.module.removeprefix(PACKAGE + "."), alias.name)
        for node in ast.parse(source).body
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith(PACKAGE + ".")
        for alias in node.names
    ]


def problems(modules: dict[str, str]) -> list[str]:
    """What breaks the package's rules: a name defined twice (a copied function), a private
    name imported from a sibling, an import of a module not in the package, a circle."""
    found: list[str] = []
    owner: dict[str, str] = {}
    for module, source in modules.items():
        for name in sorted(defined(source)):
            if name in owner:
                found.append(f"{name} is defined in {owner[name]} and {module}")
            owner.setdefault(name, module)
    graph: dict[str, set[str]] = {}
    for module, source in modules.items():
        graph[module] = set()
        for sibling, name in sibling_imports(source):
            if sibling not in modules:
                found.append(f"{module} imports {name} from {sibling}, not in the package")
            elif name.startswith("_"):
                found.append(f"{module} imports the private {name} from {sibling}")
            graph[module].add(sibling)
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append("circle: " + " -> ".join([*path[path.index(module) :], module]))
            return
        if module in done or module not in graph:
            return
        for sibling in sorted(graph[module]):
            visit(sibling, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def test_one_module_per_aggregate_without_copies_private_imports_or_circles() -> None:
    modules = sources()
    assert set(modules) == {
        "_common",
        "states",
        "conversations",
        "messages",
        "leases",
        "turns",
        "checkpoints",
        "items",
        "erasure",
    }
    assert problems(modules) == []
    # _common is the bottom: it imports nothing of the package.
    assert sibling_imports(modules["_common"]) == []


def test_the_check_sees_a_copy_a_private_import_and_a_circle() -> None:
    """The check can fail: each rule broken once, each named."""
    broken = {
        "_common": "def time_of(): ...\n",
        "states": (
            f"from {PACKAGE}.turns import begin_turn\n"
            f"from {PACKAGE}.messages import _status\n"
            "def time_of(): ...\n"
        ),
        "turns": f"from {PACKAGE}.states import get_state\ndef begin_turn(): ...\n",
        "messages": f"from {PACKAGE}.gone import x\ndef _status(): ...\n",
    }
    assert problems(broken) == [
        "time_of is defined in _common and states",
        "states imports the private _status from messages",
        "messages imports x from gone, not in the package",
        "circle: states -> turns -> states",
    ]


def test_the_package_re_exports_every_builder_as_its_module_defines_it() -> None:
    """Every function returning an Op is in convert.__all__, and each exported name is the
    very object its module defines (convert.get_state(...) keeps working)."""
    exported = set(convert.__all__)
    owners: dict[str, str] = {}
    for module, source in sources().items():
        for node in ast.parse(source).body:
            if (
                isinstance(node, ast.FunctionDef)
                and node.returns is not None
                and ast.unparse(node.returns).startswith("Op[")
            ):
                assert node.name in exported, f"{module}.{node.name} is not re-exported"
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                owners[node.name] = module
    for name in exported:
        if name in owners:
            defining = importlib.import_module(f"{PACKAGE}.{owners[name]}")
            assert getattr(convert, name) is getattr(defining, name), name
    assert not any(name.startswith("_") for name in exported)
    op = convert.get_state("u", "c", "k")
    assert isinstance(op, convert.Op) and op.method == "GetState"


def test_the_client_imports_the_package_by_its_name_only() -> None:
    """aio.py (and so its generated twin) sees convert's public face, not its modules."""
    client = REPO / "client" / "src" / "agentstate" / "client"
    for path in (client / "aio.py", client / "sync.py"):
        modules = {
            node.module
            for node in ast.walk(ast.parse(Path(path).read_text()))
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not {m for m in modules if m.startswith(PACKAGE + ".")}, path.name
