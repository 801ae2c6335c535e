"""Where things are in the checkout, for the tests and their helpers."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
