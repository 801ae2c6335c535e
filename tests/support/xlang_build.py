"""Building the Java and Go clients (tests/contract/{java,go}) from protos/ with Debian's
toolchains.

scripts/install_xlang_toolchains.sh installs the packages (`./run test` runs it). Where it
cannot (no apt-get, or not root) the tests skip with the reason; where it could, or in CI,
a missing toolchain is a failure: these tests never skip silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import google.rpc.status_pb2
import pytest

from tests.support import paths

ROOT = paths.REPO
PROTOS = ROOT / "protos"
CONTRACT = ["agentstate/state/v1/state_service.proto", "agentstate/agent/v1/agent_service.proto"]
SERVICE_CONFIG = ROOT / "client" / "src" / "agentstate" / "client" / "service_config.json"
INSTALL = "scripts/install_xlang_toolchains.sh"
JAVA_SHARE = Path("/usr/share/java")
GOCODE = Path("/usr/share/gocode")

# grpc-java 1.41 and its dependencies, each jar named: Debian's netty-all.jar is empty.
JARS = [
    "grpc-api",
    "grpc-core",
    "grpc-context",
    "grpc-stub",
    "grpc-protobuf",
    "grpc-protobuf-lite",
    "grpc-netty",
    "protobuf",
    "guava",
    "perfmark-api",
    "gson",
    "geronimo-annotation-1.3-spec",  # javax.annotation.Generated on the generated stubs
    "netty-buffer",
    "netty-codec",
    "netty-codec-http",
    "netty-codec-http2",
    "netty-common",
    "netty-handler",
    "netty-resolver",
    "netty-transport",
    "netty-transport-native-unix-common",
]
JAVA_SOURCES = paths.TESTS / "contract" / "java"
JAVA_PROGRAMS = ["AgentClient", "RetryCheck"]  # tests/contract/java/NAME.java
# tests/contract/go/NAME.go
GO_PROGRAMS = ["state_client", "retry_check", "checkpoint_reader", "session_items", "tls_check"]
JAVA_TOOLS = ["protoc", "grpc_java_plugin", "javac", "java"]
# Short-lived JVMs: the C1 compiler alone halves javac's time here (measured 8.5 s -> 4.7 s).
FAST_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
GO_TOOLS = ["protoc", "protoc-gen-go", "protoc-gen-go-grpc", "go"]
GO_SOURCES = ["google.golang.org/grpc", "google.golang.org/protobuf", "github.com/golang/protobuf"]


def _can_install() -> bool:
    return shutil.which("apt-get") is not None and os.geteuid() == 0


def require(what: str, missing: list[str]) -> None:
    """Skip (no way to install here) or fail (CI, or apt-get usable) when anything is missing."""
    if not missing:
        return
    message = f"{what} toolchain incomplete, missing: {', '.join(missing)}"
    if os.environ.get("CI") or _can_install():
        pytest.fail(f"{message}; run {INSTALL} (./run test does)", pytrace=False)
    pytest.skip(f"{message}; {INSTALL} needs apt-get and root, which this machine lacks")


def _run(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{args[0]} failed ({proc.returncode}):\n{output}"


@dataclass(frozen=True)
class Built:
    commands: dict[str, list[str]]  # program -> command; append the program's arguments
    env: dict[str, str]
    seconds: float  # generation and compilation time, reported by the tests


def build_java(out: Path) -> Built:
    require("Java", [t for t in JAVA_TOOLS if shutil.which(t) is None])
    jars = [JAVA_SHARE / f"{name}.jar" for name in JARS]
    require("Java", [str(j) for j in jars if not j.is_file()])
    started = time.perf_counter()
    src, classes = out / "src", out / "classes"
    src.mkdir(parents=True)
    # google/rpc/{status,error_details}.proto come from googleapis-common-protos (a
    # dependency of grpcio-status): Debian's Java common protos predate ErrorInfo.
    google_protos = Path(google.rpc.status_pb2.__file__).parents[2]
    _run(
        [
            "protoc",
            f"-I{PROTOS}",
            f"-I{google_protos}",
            "-I/usr/include",
            f"--java_out={src}",
            f"--plugin=protoc-gen-grpc-java={shutil.which('grpc_java_plugin')}",
            f"--grpc-java_out={src}",
            *CONTRACT,
            "google/rpc/status.proto",
            "google/rpc/error_details.proto",
        ]
    )
    classpath = os.pathsep.join(str(j) for j in jars)
    sources = [str(p) for p in sorted(src.rglob("*.java"))]
    _run(
        [
            "javac",
            *(f"-J{flag}" for flag in FAST_JVM),
            "-nowarn",
            "--release",
            "17",
            "-encoding",
            "UTF-8",
            "-cp",
            classpath,
            "-d",
            str(classes),
            *sources,
            *(
                str(paths.TESTS / "contract" / "java" / f"{program}.java")
                for program in JAVA_PROGRAMS
            ),
        ]
    )
    java = ["java", *FAST_JVM, "-cp", f"{classpath}{os.pathsep}{classes}"]
    return Built(
        {program: [*java, program] for program in JAVA_PROGRAMS},
        dict(os.environ),
        time.perf_counter() - started,
    )


def build_go(out: Path) -> Built:
    require("Go", [t for t in GO_TOOLS if shutil.which(t) is None])
    require(
        "Go", [str(GOCODE / "src" / s) for s in GO_SOURCES if not (GOCODE / "src" / s).is_dir()]
    )
    started = time.perf_counter()
    gopath = out / "gopath"
    (gopath / "src").mkdir(parents=True)
    # go_package puts the stubs at agentstate.io/gen/go/agentstate/{state,agent}/v1.
    _run(
        [
            "protoc",
            f"-I{PROTOS}",
            "-I/usr/include",
            f"--go_out={gopath / 'src'}",
            f"--go-grpc_out={gopath / 'src'}",
            *CONTRACT,
        ]
    )
    for program in GO_PROGRAMS:  # GOPATH mode: one directory per main package
        package = gopath / "src" / "agentstate.io" / "xlang" / program
        package.mkdir(parents=True)
        shutil.copyfile(paths.TESTS / "contract" / "go" / f"{program}.go", package / "main.go")
    env = {
        **os.environ,
        "GO111MODULE": "off",  # GOPATH mode: Debian's Go packages live in /usr/share/gocode
        "GOPATH": f"{gopath}{os.pathsep}{GOCODE}",
        "GOFLAGS": "",
        "GRPC_GO_RETRY": "on",  # grpc-go 1.33 applies a service config's retries only so
    }
    if "GOCACHE" not in env and not env.get("HOME") and not env.get("XDG_CACHE_HOME"):
        env["GOCACHE"] = str(out / "gocache")
    bin_dir = out / "bin"
    packages = [f"agentstate.io/xlang/{program}" for program in GO_PROGRAMS]
    _run(["go", "build", "-o", f"{bin_dir}{os.sep}", *packages], gopath, env)
    binaries = {program: [str(bin_dir / program)] for program in GO_PROGRAMS}
    return Built(binaries, env, time.perf_counter() - started)
