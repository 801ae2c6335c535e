#!/usr/bin/env bash
# Install the Debian packages the Java and Go client tests need (tests/contract/java, tests/contract/go,
# tests/contract/test_xlang_clients.py). Called by `./run test`; safe to run by hand.
#
# - Everything installed already: returns at once (one dpkg-query, no apt).
# - Something missing, root, apt-get present: installs it (apt-get update first only when
#   the package lists are absent or the install fails on stale lists); a failure is fatal.
# - No apt-get or not root: prints why and returns 0, and the Java/Go tests skip with that
#   reason; but with CI set, a missing toolchain is an error (CI never skips silently).
set -euo pipefail

PACKAGES=(
  # protoc and the well-known .proto files
  protobuf-compiler libprotobuf-dev
  # Java: JDK, grpc-java 1.41 codegen plugin and runtime jars (netty-all.jar is empty, the
  # tests list the separate netty jars)
  openjdk-17-jdk-headless protobuf-compiler-grpc-java-plugin libprotobuf-java libgrpc-java
  libguava-java libperfmark-java libnetty-java libgeronimo-annotation-1.3-spec-java
  # JSON for the Java client (the stored AgentState, the service config file)
  libgoogle-gson-java
  # Go, GOPATH mode: sources under /usr/share/gocode. golang-github-golang-protobuf-1-5-dev
  # must be named: without it the older github.com/golang/protobuf is picked and the first
  # RPC panics.
  golang-go protoc-gen-go protoc-gen-go-grpc golang-google-protobuf-dev golang-google-grpc-dev
  golang-github-golang-protobuf-1-5-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

refuse() {
  if [ -n "${CI:-}" ]; then
    echo "install_xlang_toolchains: $1; CI must run the Java/Go client tests" >&2
    exit 1
  fi
  echo "install_xlang_toolchains: $1; the Java/Go client tests will be skipped" >&2
  exit 0
}
command -v apt-get >/dev/null 2>&1 || refuse "apt-get is not available (not Debian?): cannot install ${missing[*]}"
[ "$(id -u)" -eq 0 ] || refuse "not root: cannot apt-get install ${missing[*]}"

echo "== installing Debian packages for the Java/Go clients: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  apt-get install -y -qq -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" \
    >/tmp/agentstate-apt.log 2>&1
}
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  apt-get update -qq -o DPkg::Lock::Timeout=300
fi
if ! apt_install; then
  # Stale package lists make downloads 404: refresh once and try again.
  apt-get update -qq -o DPkg::Lock::Timeout=300
  if ! apt_install; then
    cat /tmp/agentstate-apt.log >&2
    echo "install_xlang_toolchains: apt-get install failed" >&2
    exit 1
  fi
fi
echo "   installed"
