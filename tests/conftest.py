import sys
from pathlib import Path

# Test helpers (tests/helpers.py) import as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
