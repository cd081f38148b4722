"""The reference pages in docs/ are a contract: they must name what the code defines.

(a) Hooks. Every public attribute and method of `systems.base.System` (every name in the
    class body not starting with `_`: the class attributes with their defaults and the hook
    methods with their default bodies) is a row of the hook tables of HOOK_PAGE, the tables
    under the heading HOOK_HEADING (up to the next heading of the same or a higher level). A
    row names its hook in its first cell, in backticks: `name` or `name(args)`.

(b) Config keys. Every key of each yaml in CONFIG_PAGES appears on the page that documents
    its config group. Rule: for every key at any depth, the leaf name (the last component of
    the dotted path) must appear in a code span on the page, alone or as the last component
    of a dotted path or an override (`key`, `system.key`, `system.key=false`, `key: 1`);
    Hydra's own entries are skipped (`defaults`, `_target_`, and the `hydra` node of
    config.yaml, which configures Hydra rather than a run). Each yaml of conf/system/, and of
    its evictor/ and prefetcher/ parts (the zoo tables), maps to docs/systems.md.
    The host, NVMe and link profiles under conf/hardware/ map to docs/hardware.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

HOOK_PAGE = "docs/engine.md"
HOOK_HEADING = "## The System contract"

# config group (a yaml under conf/, or a glob of them) -> the page that documents its keys
CONFIG_PAGES = {
    "config.yaml": "docs/engine.md",
    "system/*.yaml": "docs/systems.md",
    "system/evictor/*.yaml": "docs/systems.md",
    "system/prefetcher/*.yaml": "docs/systems.md",
    "hardware/host/*.yaml": "docs/hardware.md",
    "hardware/nvme/*.yaml": "docs/hardware.md",
    "hardware/link/*.yaml": "docs/hardware.md",
    "hardware/peer/*.yaml": "docs/gpus.md",
    "placement/*.yaml": "docs/gpus.md",
}
SKIPPED_KEYS = {"defaults", "_target_"}
SKIPPED_NODES = {("config.yaml", "hydra")}


def _section(page: str, heading: str) -> str:
    lines = (ROOT / page).read_text().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    try:
        start = lines.index(heading)
    except ValueError:
        pytest.fail(f"{page}: no heading {heading!r}")
    out = []
    for line in lines[start + 1:]:
        m = re.match(r"(#+) ", line)
        if m and len(m.group(1)) <= level:
            break
        out.append(line)
    return "\n".join(out)


def _table_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        first = line.strip("|").split("|")[0]
        for span in re.findall(r"`([^`]+)`", first):
            m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)", span)
            if m:
                names.add(m.group(1))
    return names


def _system_hooks() -> list[str]:
    from systems.base import System

    return sorted(n for n in vars(System) if not n.startswith("_"))


def test_every_system_hook_is_in_the_hook_table():
    documented = _table_names(_section(HOOK_PAGE, HOOK_HEADING))
    missing = [n for n in _system_hooks() if n not in documented]
    assert not missing, (f"{HOOK_PAGE}, tables under {HOOK_HEADING!r}: no row for "
                         f"{', '.join(missing)} (defined on systems.base.System)")


def _leaf_keys(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            key = str(key)
            if key in SKIPPED_KEYS:
                continue
            yield (*path, key)
            yield from _leaf_keys(value, (*path, key))


def _config_cases():
    for pattern, page in CONFIG_PAGES.items():
        for path in sorted((ROOT / "conf").glob(pattern)):
            yield pytest.param(path.relative_to(ROOT / "conf").as_posix(), page,
                               id=path.relative_to(ROOT / "conf").as_posix())


def _code_spans(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    return re.findall(r"`([^`\n]+)`", text)


def _documented(leaf: str, spans: list[str]) -> bool:
    word = re.compile(rf"(?:^|[\s.+/(,])({re.escape(leaf)})(?=$|[\s=:,)\]])")
    return any(word.search(span) for span in spans)


@pytest.mark.parametrize(("yaml_file", "page"), list(_config_cases()))
def test_every_config_key_is_documented(yaml_file, page):
    data = yaml.safe_load((ROOT / "conf" / yaml_file).read_text()) or {}
    spans = _code_spans(page)
    missing = []
    for keys in _leaf_keys(data):
        if (yaml_file, keys[0]) in SKIPPED_NODES:
            continue
        if not _documented(keys[-1], spans):
            missing.append(".".join(keys))
    assert not missing, "".join(
        f"\nkey {k!r} of conf/{yaml_file} is not documented on {page}" for k in missing)


def test_the_map_covers_real_files():
    for pattern, page in CONFIG_PAGES.items():
        assert list((ROOT / "conf").glob(pattern)), f"no conf/{pattern}"
        assert (ROOT / page).is_file(), page
