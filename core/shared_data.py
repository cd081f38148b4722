"""Where the optional shared data lives (real dataset extracts and routing samples).

One place decides it, for the tests and for the commands that read the samples
(`moebench characterize --calibration`): the folder named by the environment variable
MOEBENCH_SHARED_DATA, else `../shared/data` beside the checkout. The data is never copied
into the project; a caller that needs a file gets None (tests skip with a reason) or an
error that names both places it looked.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.paths import PROJECT_ROOT

ENV_VAR = "MOEBENCH_SHARED_DATA"


def shared_data_dir() -> Path:
    """The shared data folder (it may not exist): $MOEBENCH_SHARED_DATA or ../shared/data."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else PROJECT_ROOT.parent / "shared" / "data"


def shared_file(*parts: str) -> Path | None:
    """Path of a file or folder under the shared data folder, or None when it is absent."""
    path = shared_data_dir().joinpath(*parts)
    return path if path.exists() else None


def require_shared_file(*parts: str) -> Path:
    """As shared_file, but a missing file is an error that says where it was looked for."""
    path = shared_file(*parts)
    if path is None:
        raise FileNotFoundError(
            f"{shared_data_dir().joinpath(*parts)}: shared data not present; set {ENV_VAR} to "
            "the folder that holds it (or pass the file's path)")
    return path
