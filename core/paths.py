"""The checkout's root: where conf/ and results/ live (everything else is relative to it)."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
