import os
import sys
from pathlib import Path

from hypothesis import settings

# Test helpers (tests/helpers.py) import as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Property tests draw the same examples on every run and machine, so a result does not depend
# on chance; HYPOTHESIS_PROFILE=explore draws fresh ones to hunt for new counterexamples.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))
