"""Generate the Python protobuf/gRPC code from protos/ into client/src/agentstate/<pkg>/v1/.

    python scripts/gen_protos.py          # write the generated files
    python scripts/gen_protos.py --check  # exit 1 if the committed files are stale

Generated code lives only under client/src/agentstate/*/v1/ (the agentstate-client
distribution) and is committed, so that `pip install` needs no code generator; CI runs
--check. DESCRIPTOR_SET holds the same files' descriptors with their comments (source info),
which the Python descriptors lack: the servers' reflection serves it, so `grpcurl describe`
shows the docs; it is the servers' package data (src/agentstate/common/).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
# Generated paths (agentstate/state/v1/…) are relative to a source root: the stubs are the
# client distribution's, the descriptor set the servers'.
CLIENT_ROOT = REPO / "client" / "src"
SERVER_ROOT = REPO / "src"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi", ".binpb")
DESCRIPTOR_SET = Path("agentstate/common/descriptors.binpb")
# mypy-protobuf's plugins sit beside this interpreter (pinned in pyproject's dev extra).
BIN_DIR = Path(sys.executable).parent


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _match_python_descriptors(path: Path) -> None:
    """Drop the json_name protoc adds to a descriptor set: reflection then serves exactly
    the Python descriptors plus comments (grpcurl keeps printing proto field names)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())

    def strip(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            for f in [*message.field, *message.extension]:
                f.ClearField("json_name")
            strip(message.nested_type)

    for file in files.file:
        strip(file.message_type)
        for f in file.extension:
            f.ClearField("json_name")
    path.write_bytes(files.SerializeToString())


def generate(out_dir: Path) -> list[Path]:
    """Run protoc for every .proto; return the generated paths relative to out_dir."""
    include = str(Path(protoc.__file__).parent / "_proto")
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    (out_dir / DESCRIPTOR_SET).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={BIN_DIR / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={BIN_DIR / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        f"--descriptor_set_out={out_dir / DESCRIPTOR_SET}",
        "--include_source_info",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    _match_python_descriptors(out_dir / DESCRIPTOR_SET)
    generated = [
        p.relative_to(out_dir) for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)
    ]
    # Every generated directory is a regular package.
    for rel in generated:
        for parent in rel.parents:
            if parent != Path("."):
                (out_dir / parent / "__init__.py").touch()
    return sorted(generated)


def root_of(rel: Path) -> Path:
    """The source root a generated file is committed under."""
    return SERVER_ROOT if rel == DESCRIPTOR_SET else CLIENT_ROOT


def committed_files() -> set[Path]:
    """Every generated file in the checkout, relative to its source root."""
    return {
        p.relative_to(root)
        for root in (CLIENT_ROOT, SERVER_ROOT)
        for p in (root / "agentstate").rglob("*")
        if p.name.endswith(GENERATED_SUFFIXES)
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generated = generate(out)
        stale = [
            rel
            for rel in generated
            if not (root_of(rel) / rel).exists()
            or not filecmp.cmp(out / rel, root_of(rel) / rel, shallow=False)
        ]
        orphans = sorted(committed_files() - set(generated))
        if args.check:
            for rel in stale:
                print(f"stale generated file: {rel}", file=sys.stderr)
            for rel in orphans:
                print(f"generated file without a .proto: {rel}", file=sys.stderr)
            if stale or orphans:
                print("run: python scripts/gen_protos.py", file=sys.stderr)
                return 1
            print(f"generated code is up to date ({len(generated)} files)")
            return 0
        for rel in generated:
            root = root_of(rel)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out / rel, root / rel)
            # Below the namespace package agentstate, every generated directory is a package.
            for parent in rel.parents:
                if parent not in (Path("."), Path("agentstate")) and not (
                    (root / parent / "__init__.py").exists()
                ):
                    (root / parent / "__init__.py").touch()
        for rel in orphans:
            (root_of(rel) / rel).unlink()
        print(f"wrote {len(generated)} files")
        return 0


if __name__ == "__main__":
    sys.exit(main())
