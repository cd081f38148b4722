"""Where the optional shared data lives (real dataset extracts and routing samples).

One place decides it, for the tests and for the commands that read the samples
(`moebench characterize --calibration`): the folder named by the environment variable
MOEBENCH_SHARED_DATA, else, when running from a checkout, `../shared/data` beside it. An
installed copy looks only at the variable: the folder beside its site-packages is nobody's
shared data. The data is never copied into the project; a caller that needs a file gets
None (tests skip with a reason) or an error that says where it looked.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.paths import PROJECT_ROOT, in_checkout

ENV_VAR = "MOEBENCH_SHARED_DATA"


def shared_data_dir() -> Path | None:
    """The shared data folder (it may not exist): $MOEBENCH_SHARED_DATA, else ../shared/data
    beside a checkout; None for an installed copy without the variable."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return PROJECT_ROOT.parent / "shared" / "data" if in_checkout() else None


def looked_for(*parts: str) -> str:
    """Where a shared file was looked for, for messages."""
    root = shared_data_dir()
    if root is None:
        return f"{'/'.join(parts)} under ${ENV_VAR} (unset; an installed copy looks nowhere else)"
    return str(root.joinpath(*parts))


def shared_file(*parts: str) -> Path | None:
    """Path of a file or folder under the shared data folder, or None when it is absent."""
    root = shared_data_dir()
    path = root.joinpath(*parts) if root is not None else None
    return path if path is not None and path.exists() else None


def require_shared_file(*parts: str) -> Path:
    """As shared_file, but a missing file is an error that says where it was looked for."""
    path = shared_file(*parts)
    if path is None:
        raise FileNotFoundError(
            f"{looked_for(*parts)}: shared data not present; set {ENV_VAR} to the folder that "
            "holds it (or pass the file's path)")
    return path
