#!/usr/bin/env python3
"""Create the operator's secret files that the kustomize manifests generate Secrets from.

    python3 scripts/k8s_secrets.py [K8S_DIR]      # or: ./run k8s-secrets

The manifests ship no password: `kubectl kustomize k8s/` fails, naming the missing file,
until this script (or the operator by hand) has written them. Each file is written only
when absent, never overwritten: PostgreSQL keeps the password it was first started with,
so a new one would lock the services out. Files are created mode 0600 and are ignored by
git (.gitignore). Values are random (secrets.token_urlsafe), URL-safe so they need no
escaping inside the database URLs.

Files (relative to K8S_DIR, default: the repository's k8s/):
  base/secrets/agentstate-db.env       POSTGRES_PASSWORD, DATABASE_URL      (Secret agentstate-db)
  base/secrets/agentstate-auth.env     AGENT_PROXY_SECRET                   (Secret agentstate-auth)
  overlays/demo/secrets/orders.env     ORDERS_DATABASE_URL (demo overlay, merged into agentstate-db)
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

DEFAULT_K8S = Path(__file__).resolve().parents[1] / "k8s"
DB_USER = "agentstate"
DB_NAME = "agentstate"
DB_HOST = "postgres:5432"  # the base's PostgreSQL Service (k8s/base/postgres.yaml)

DB_FILE = Path("base/secrets/agentstate-db.env")
AUTH_FILE = Path("base/secrets/agentstate-auth.env")
ORDERS_FILE = Path("overlays/demo/secrets/orders.env")


def read_env(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def write_new(path: Path, values: dict[str, str], why: str) -> bool:
    """Write `path` (0600) unless it exists; True when written."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    body = f"# {why}\n# Written by scripts/k8s_secrets.py; keep it out of git.\n"
    body += "".join(f"{key}={value}\n" for key, value in values.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(body)
    return True


def database_url(password: str) -> str:
    return f"postgresql://{DB_USER}:{password}@{DB_HOST}/{DB_NAME}"


def create(k8s: Path) -> list[Path]:
    """Write every missing file under `k8s`; return the ones written."""
    written = []
    db = k8s / DB_FILE
    password = secrets.token_urlsafe(32)
    if write_new(
        db,
        {"POSTGRES_PASSWORD": password, "DATABASE_URL": database_url(password)},
        "Secret agentstate-db: the base PostgreSQL's password and the state service's URL.",
    ):
        written.append(db)
    # The demo's order system uses the same server and role: reuse the stored password.
    password = read_env(db)["POSTGRES_PASSWORD"]
    if (k8s / ORDERS_FILE).parent.parent.is_dir() and write_new(
        k8s / ORDERS_FILE,
        {"ORDERS_DATABASE_URL": database_url(password)},
        "Merged into Secret agentstate-db by the order demo overlay.",
    ):
        written.append(k8s / ORDERS_FILE)
    if write_new(
        k8s / AUTH_FILE,
        {"AGENT_PROXY_SECRET": secrets.token_urlsafe(32)},
        "Secret agentstate-auth: the header value the authenticating proxy sends "
        "(AGENT_AUTH_MODE=proxy; give the proxy the same value).",
    ):
        written.append(k8s / AUTH_FILE)
    return written


def main(argv: list[str]) -> int:
    k8s = Path(argv[1]) if len(argv) > 1 else DEFAULT_K8S
    if not (k8s / "base" / "kustomization.yaml").is_file():
        print(f"k8s_secrets: {k8s} has no base/kustomization.yaml", file=sys.stderr)
        return 2
    written = create(k8s)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("every secret file already exists; nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
