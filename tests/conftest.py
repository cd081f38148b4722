import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# Test helpers (tests/helpers.py) import as a plain module.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Subprocesses (`python -m moebench.cli`, launcher workers) import this checkout from
# whatever folder they run in.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session", autouse=True)
def _own_working_dir(tmp_path_factory):
    """Each test process (each pytest-xdist worker) works in a folder of its own: what lands
    under the working directory by default (results/, .trace_cache/, Hydra's and Hypothesis'
    folders) stays out of the checkout and out of another worker's way."""
    work = tmp_path_factory.mktemp("cwd")
    before = os.getcwd()
    os.chdir(work)
    yield work
    os.chdir(before)

@pytest.fixture(scope="session")
def dsv2():
    """The ModelSpec of conf/model/deepseek_v2_lite.yaml (the Table 1 model)."""
    from helpers import conf_model

    return conf_model("deepseek_v2_lite")


# Property tests draw the same examples on every run and machine, so a result does not depend
# on chance; HYPOTHESIS_PROFILE=explore draws fresh ones to hunt for new counterexamples.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_terminal_summary(terminalreporter):
    """`fault matrix: N tried, M OK` when the session ran tests marked `fault` (the store's
    fault matrix and the bad-input cases; `make fault-matrix` runs them all)."""
    stats = terminalreporter.stats
    outcomes = {key: [r for r in stats.get(key, []) if getattr(r, "when", "call") == "call"
                      and "fault" in getattr(r, "keywords", {})]
                for key in ("passed", "failed", "error")}
    tried = sum(len(v) for v in outcomes.values())
    if tried:
        terminalreporter.write_line(f"fault matrix: {tried} tried, {len(outcomes['passed'])} OK")
