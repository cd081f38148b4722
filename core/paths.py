"""Where the project's files are, in a checkout and in an installed copy alike.

PROJECT_ROOT is the folder that holds the top-level packages: the checkout's root, or the
site-packages folder of an installed wheel, which ships conf/ beside the packages
(pyproject.toml, package data) so that CONF_DIR is the same path relative to them in both.
Results and caches are never written here: they go under the working directory
(conf/config.yaml: results_dir, trace_cache_dir), which an installed copy's site-packages is
not.
"""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = PROJECT_ROOT / "conf"


def in_checkout() -> bool:
    """True when running from a source checkout (pyproject.toml beside the packages), False
    for an installed copy."""
    return (PROJECT_ROOT / "pyproject.toml").is_file()
