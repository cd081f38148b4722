"""Every file and run folder the project writes goes through here: it is written to a hidden
temporary sibling, then renamed into place, so a reader sees the old complete version or the
new complete one, never a part.

Temporary siblings are named `.<name>.tmp-<host>-<pid>`. Readers skip every hidden name
(`is_hidden`), and each write first removes the leftovers of writers on this host that died
(their pid no longer runs): a killed write is never counted and never lingers past the next
write of the same file.

A run folder is replaced with Linux's renameat2(RENAME_EXCHANGE), which swaps the old and new
folder in one step; where that call is missing (other systems, some filesystems) the old folder
is renamed aside first and put back by the next writer if the process dies in between.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

_HOST = socket.gethostname().replace("-", "_") or "host"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def is_hidden(path: Path | str) -> bool:
    """True for names every reader skips: temporary siblings, set-aside folders, locks."""
    return Path(path).name.startswith(".")


def tmp_sibling(path: Path, tag: str = "tmp") -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.{tag}-{_HOST}-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # runs under another user: alive
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_leftovers(path: Path, tags: tuple[str, ...] = ("tmp",)) -> list[Path]:
    """Remove `.<name>.<tag>-<host>-<pid>` siblings left by dead writers of this host."""
    path, removed = Path(path), []
    if not path.parent.is_dir():
        return removed
    for tag in tags:
        prefix = f".{path.name}.{tag}-"
        for cand in path.parent.iterdir():
            if not cand.name.startswith(prefix):
                continue
            host, _, pid = cand.name[len(prefix):].rpartition("-")
            if host != _HOST or not pid.isdigit():
                continue  # another host's writer may still run: leave it
            if int(pid) == os.getpid() or not _pid_alive(int(pid)):
                _remove(cand)
                removed.append(cand)
    return removed


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling to write; on success it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(path)
    tmp = tmp_sibling(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            _remove(tmp)


@contextlib.contextmanager
def atomic_dir(path: Path | str) -> Iterator[Path]:
    """Yield an empty temporary sibling folder; on success it replaces the folder `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    restore_set_aside(path)  # before its leftovers go: it may be the only complete copy
    clean_leftovers(path)
    tmp = tmp_sibling(path)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            _remove(tmp)


def write_text(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: Path | str, obj) -> Path:
    """Sorted keys, one-space indent, ASCII, no NaN: the same object gives the same bytes."""
    return write_text(path, json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True,
                                       allow_nan=False) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


def restore_set_aside(final: Path) -> None:
    """A writer killed between its two renames (no renameat2) left the old folder aside."""
    final = Path(final)
    if not final.exists():
        olds = sorted(final.parent.glob(f".{final.name}.old-*"),
                      key=lambda p: p.stat().st_mtime)
        if olds:
            os.replace(olds[-1], final)
    clean_leftovers(final, ("old",))


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete folder `tmp` at `final`, replacing any old one in one step."""
    tmp, final = Path(tmp), Path(final)
    if not final.exists():
        os.replace(tmp, final)
        return
    if _exchange(tmp, final):
        _remove(tmp)  # now holds the old folder
        return
    old = tmp_sibling(final, "old")
    os.replace(final, old)
    os.replace(tmp, final)
    _remove(old)
