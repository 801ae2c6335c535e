"""Generate the synchronous twins of the asyncio code from their async sources.

    python scripts/async_to_sync.py          # write the generated files
    python scripts/async_to_sync.py --check  # exit 1 if a committed twin is stale

The async file is the one that is written by hand; its twin is the same code with the
asyncio taken out, so the two cannot drift. The transform works on the syntax tree (libcst,
which keeps comments and layout): `async def/for/with` lose `async`, `await x` becomes `x`,
names are renamed by a table (AsyncStateClient -> StateClient, aget_tuple -> get_tuple,
grpc.aio.Channel -> grpc.Channel, ...), and docstrings and comments get the same renames.
The result is sorted and formatted by ruff with the project's settings and starts with a
header saying where it came from. Anything the transform does not handle fails loudly
rather than producing a twin that only looks right.

psycopg's tools/async_to_sync.py works the same way (on the stdlib ast); this script is our
own, smaller one for our few files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

REPO = Path(__file__).resolve().parent.parent
# ruff is installed beside this interpreter (pyproject's dev extra).
RUFF = Path(sys.executable).parent / "ruff"

# Renames every twin gets: the asyncio spelling of a thing -> its synchronous spelling.
COMMON_NAMES: dict[str, str] = {
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "StopAsyncIteration": "StopIteration",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "asynccontextmanager": "contextmanager",
    "AsyncExitStack": "ExitStack",
}
# Dotted prefixes: grpc.aio.Channel -> grpc.Channel, grpc.aio.AioRpcError -> grpc.RpcError.
COMMON_MODULES: dict[str, str] = {"grpc.aio": "grpc"}
# Words in docstrings and comments (after the renames).
COMMON_PHRASES: dict[str, str] = {"async with ": "with ", "async for ": "for ", "await ": ""}


@dataclass(frozen=True)
class Twin:
    """One async source and the sync file generated from it."""

    source: str  # relative to the repository
    target: str
    names: Mapping[str, str] = field(default_factory=dict)
    phrases: Mapping[str, str] = field(default_factory=dict)


CLIENT = "client/src/agentstate/client"
LANGGRAPH = "client/src/agentstate/integrations/langgraph"
TWINS = [
    Twin(
        source=f"{CLIENT}/aio.py",
        target=f"{CLIENT}/sync.py",
        names={
            "AsyncStateClient": "StateClient",
            "AsyncInterceptor": "Interceptor",
            "AsyncChannels": "Channels",
            "open_async_channel": "open_channel",
            "close_async_channel": "close_channel",
            "AioRpcError": "RpcError",
            "async_pause": "pause",
        },
        phrases={
            "asyncio code (grpc.aio)": "synchronous code (a grpc channel, no event loop)",
            "\n\nStateClient, sync.py, is generated from this file by "
            "scripts/async_to_sync.py.": "",
        },
    ),
    Twin(
        source=f"{LANGGRAPH}/saver_async.py",
        target=f"{LANGGRAPH}/saver_sync.py",
        names={
            "AsyncSaverMethods": "SyncSaverMethods",
            "AsyncStateClient": "StateClient",
            "aclient": "sync_client",
            "_aconversation": "_conversation",
            "_aindex_user": "_index_user",
            "_arun_lease": "_run_lease",
            "_arelease": "_release",
            "_aput_checkpoint": "_put_checkpoint",
            "_asend_writes": "_send_writes",
            "_asend_when_stored": "_send_when_stored",
            "_aflush": "_flush",
            "_aflush_thread": "_flush_thread",
            "_aschedule_flush": "_schedule_flush",
            "_await_flushes": "_wait_flushes",
            "aget_tuple": "get_tuple",
            "alist": "list",
            "aput": "put",
            "aput_writes": "put_writes",
            "adelete_thread": "delete_thread",
            "adelete_for_runs": "delete_for_runs",
            "acopy_thread": "copy_thread",
            "aprune": "prune",
            "async_pause": "pause",
        },
        phrases={
            "asyncio methods": "synchronous methods",
            "a* methods": "synchronous methods",
            "(grpc.aio)": "(a grpc channel, no event loop)",
            "\n\nThe synchronous ones, saver_sync.py, are generated from this file by "
            "scripts/async_to_sync.py.": "",
        },
    ),
]


class UnsupportedAsync(Exception):
    """The source uses an asyncio construct that has no mechanical sync twin here."""


def _dotted(node: cst.BaseExpression) -> str | None:
    """`grpc.aio` for the expression grpc.aio, None for anything but names and attributes."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _expression(dotted: str) -> cst.BaseExpression:
    return cst.parse_expression(dotted)


class AsyncToSync(cst.CSTTransformer):
    def __init__(self, twin: Twin) -> None:
        super().__init__()
        self.names = {**COMMON_NAMES, **twin.names}
        self.phrases = {**COMMON_PHRASES, **twin.phrases}
        self.modules = COMMON_MODULES

    # -- the asyncio syntax

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        return updated_node.with_changes(asynchronous=None)

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return updated_node.with_changes(asynchronous=None)

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        return updated_node.with_changes(asynchronous=None)

    def leave_CompFor(self, original_node: cst.CompFor, updated_node: cst.CompFor) -> cst.CompFor:
        return updated_node.with_changes(asynchronous=None)

    def leave_Await(self, original_node: cst.Await, updated_node: cst.Await) -> cst.BaseExpression:
        inner = updated_node.expression
        # Parentheses around `(await x)` stay around x.
        return inner.with_changes(
            lpar=[*updated_node.lpar, *inner.lpar], rpar=[*inner.rpar, *updated_node.rpar]
        )

    def visit_Call(self, node: cst.Call) -> None:
        if _dotted(node.func) in {"asyncio.gather", "asyncio.create_task", "asyncio.sleep"}:
            raise UnsupportedAsync(f"{_dotted(node.func)}() has no sync twin: keep it out")

    # -- names

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(
            value=self.names.get(updated_node.value, updated_node.value)
        )

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        base = _dotted(updated_node.value)
        if base in self.modules:
            return updated_node.with_changes(value=_expression(self.modules[base]))
        return updated_node

    def leave_ImportFrom(
        self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom
    ) -> cst.ImportFrom:
        module = _dotted(updated_node.module) if updated_node.module is not None else None
        if module in self.modules:
            updated_node = updated_node.with_changes(module=_expression(self.modules[module]))
        if isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        # Two names that became one (AsyncIterator and Iterator): import it once.
        seen: set[str] = set()
        kept = []
        for alias in updated_node.names:
            key = cst.Module([]).code_for_node(alias.name) + (
                f" as {cst.Module([]).code_for_node(alias.asname.name)}" if alias.asname else ""
            )
            if key not in seen:
                seen.add(key)
                kept.append(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        return updated_node.with_changes(names=kept)

    # -- prose: docstrings and comments

    def _prose(self, text: str) -> str:
        for old, new in self.names.items():
            text = re.sub(rf"\b{re.escape(old)}\b", new, text)
        for old, new in self.phrases.items():
            text = text.replace(old, new)
        return text

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> cst.Expr:
        value = updated_node.value
        if isinstance(value, cst.SimpleString):  # a docstring
            return updated_node.with_changes(
                value=value.with_changes(value=self._prose(value.value))
            )
        return updated_node

    def leave_Comment(self, original_node: cst.Comment, updated_node: cst.Comment) -> cst.Comment:
        return updated_node.with_changes(value=self._prose(updated_node.value))


def header(twin: Twin) -> str:
    source = Path(twin.source).name
    return (
        f"# Generated by scripts/async_to_sync.py from {source} (beside it): do not edit.\n"
        f"# Change {source}, then regenerate with `./run gen`; `./run test` fails when stale.\n"
    )


def ruff(args: Sequence[str], code: str, filename: str) -> str:
    """`code` through ruff with the project's configuration, as if it were `filename`."""
    done = subprocess.run(
        [str(RUFF), *args, "--stdin-filename", filename, "-"],
        input=code,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on {filename}:\n{done.stderr}{done.stdout}")
    return done.stdout


def generate(twin: Twin, source: str | None = None) -> str:
    """The twin's file as it must be committed."""
    if source is None:
        source = (REPO / twin.source).read_text()
    module = cst.parse_module(source)
    converted = module.visit(AsyncToSync(twin)).code
    leftover = re.search(r"\b(async|await)\b", _code_only(converted))
    if leftover:
        raise UnsupportedAsync(f"{twin.source}: {leftover.group()!r} left after the transform")
    code = header(twin) + converted
    code = ruff(
        ["check", "--fix", "--select", "I,F401", "--quiet", "--exit-zero"], code, twin.target
    )
    return ruff(["format", "--quiet"], code, twin.target)


def _code_only(code: str) -> str:
    """The code without its strings and comments (where `async` may well be a word)."""
    module = cst.parse_module(code)

    class Blank(cst.CSTTransformer):
        def leave_SimpleString(
            self, original_node: cst.SimpleString, updated_node: cst.SimpleString
        ) -> cst.SimpleString:
            return updated_node.with_changes(value='""')

        def leave_Comment(
            self, original_node: cst.Comment, updated_node: cst.Comment
        ) -> cst.Comment:
            return updated_node.with_changes(value="#")

    return module.visit(Blank()).code


def committed(twin: Twin) -> str:
    path = REPO / twin.target
    return path.read_text() if path.exists() else ""


def stale_twins(twins: Sequence[Twin]) -> list[tuple[Twin, str]]:
    """The twins whose committed file differs from what their source generates, with the
    file they should be."""
    found = []
    for twin in twins:
        expected = generate(twin)
        if committed(twin) != expected:
            found.append((twin, expected))
    return found


def main(argv: Sequence[str] | None = None, twins: Sequence[Twin] = TWINS) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if a committed twin is stale")
    args = parser.parse_args(argv)
    stale = stale_twins(twins)
    if not args.check:
        for twin, expected in stale:
            (REPO / twin.target).write_text(expected)
            print(f"wrote {twin.target}")
        return 0
    for twin, expected in stale:
        diff = difflib.unified_diff(
            committed(twin).splitlines(keepends=True),
            expected.splitlines(keepends=True),
            f"{twin.target} (committed)",
            f"{twin.target} (generated from {twin.source})",
            n=1,
        )
        sys.stderr.writelines(list(diff)[:40])
    if stale:
        names = ", ".join(twin.target for twin, _ in stale)
        print(f"stale generated twins: {names}\nrun: ./run gen", file=sys.stderr)
        return 1
    print(f"sync twins are up to date ({len(twins)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
