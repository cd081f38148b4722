"""The inventory of published claims: what results/claims.md has one row for (docs/claims.md).

  inventory/<paper>.yaml   one file per paper (PAPERS): its claims in report order, each with
                           the experiment that measures it or the reason none can; a long
                           paper continues in inventory/<paper>.<part>.yaml files (parts in
                           name order after the main file), so no file grows past a read
  inventory/excluded.yaml  the numbers of ../shared/reference/paper_numbers.md that are not
                           claims (model configs, hardware, setup parameters), with the reason

The files ship with the package (pyproject.toml, package-data), so an installed copy reports
the same rows. `load` and `load_excluded` check everything that can be checked without the
results: a bad file is an InventoryError that names the file, the claim and the field, all
problems at once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.repro.verdict import KINDS

FOLDER = Path(__file__).with_name("inventory")
PAPERS = ("moe_infinity", "fmoe", "diff_moe", "mixtral_offloading")  # report order
EXCLUDED = "excluded"
# The sections of paper_numbers.md that hold each paper's numbers (A2-v1: the fMoE arXiv
# version as the brief reports it)
PAPER_SECTIONS = {"moe_infinity": ("A1",), "fmoe": ("A2", "A2-v1"), "diff_moe": ("A3",),
                  "mixtral_offloading": ("A4",)}
SECTIONS = tuple(s for p in PAPERS for s in PAPER_SECTIONS[p])
FIELDS = ("id", "source", "claim", "kind", "value", "rule", "from", "numbers", "experiment",
          "not_expressible")
REQUIRED = ("id", "source", "claim", "kind", "from")
ID = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_SECTION = re.compile(r"(?<![\w-])(A[1-4](?:-v1)?)(?![\w-])")


class InventoryError(ValueError):
    """An inventory file is malformed; the message names the file, the claim and the field."""


@dataclass(frozen=True)
class Claim:
    """One published claim (one row of an inventory file; docs/claims.md has the schema)."""

    paper: str  # the file's stem, one of PAPERS
    title: str  # the file's `paper`
    id: str  # the ClaimRow.claim_id its experiment emits
    source: str
    claim: str
    kind: str
    value: object  # a number, a list (an ordering, best first) or None (qualitative)
    rule: str | None
    origin: str  # `from`: where in paper_numbers.md or the brief
    numbers: tuple[float, ...]
    experiment: str | None
    not_expressible: str | None

    @property
    def sections(self) -> tuple[str, ...]:
        return sections_named(self.origin)


@dataclass(frozen=True)
class Exclusion:
    """Numbers of paper_numbers.md that are not claims: on the lines of `section` that the
    regular expression `line` finds, `numbers` (None: every number of those lines)."""

    section: str
    line: str
    numbers: tuple[float, ...] | None
    reason: str

    def covers(self, section: str, text: str, number: float) -> bool:
        if section != self.section or not re.search(self.line, text):
            return False
        return self.numbers is None or any(same_number(number, n) for n in self.numbers)


def sections_named(text: str) -> tuple[str, ...]:
    """The paper_numbers.md sections a `from` names ("paper_numbers.md A2-v1, Fig. 9")."""
    return tuple(dict.fromkeys(_SECTION.findall(text or "")))


def same_number(a: float, b: float) -> bool:
    """Numbers as paper_numbers.md writes them, the sign aside ("-46 %" may be listed as 46)."""
    return math.isclose(abs(a), abs(b), rel_tol=1e-9, abs_tol=1e-12)


class _StrictLoader(yaml.SafeLoader):
    """safe_load, but a key given twice in one mapping is an error: the second `rule:` of a
    claim would otherwise silently replace the first."""


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _read(path: Path):
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InventoryError(f"{path}: cannot be read as YAML: {exc}") from exc


def _is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _text(x) -> bool:
    return isinstance(x, str) and bool(x.strip())


def _value_problem(kind: str, value) -> str | None:
    """What is wrong with `value` for a claim of `kind` (None: nothing)."""
    if kind in ("ratio", "location"):
        if not _is_number(value) or value <= 0:
            return f"a {kind} claim's value is a positive number, got {value!r}"
    elif kind == "ordering":
        if (not isinstance(value, list) or len(value) < 2
                or not all(_text(v) for v in value) or len(set(value)) != len(value)):
            return ("an ordering's value is a list of two or more distinct names, best first, "
                    f"got {value!r}")
    elif kind == "pairs":
        if value is not None:
            return ("a pairs claim is qualitative (value null; its rule says what is "
                    f"compared), got {value!r}")
    elif value is not None and not _is_number(value) and not isinstance(value, list):
        return f"value is a number, a list or null, got {value!r}"
    return None


def _claim_problems(raw: dict, experiments) -> list[str]:
    """Everything wrong with one claim's fields, each a sentence naming the field."""
    out = [f"unknown field `{k}` (fields: {', '.join(FIELDS)})" for k in raw if k not in FIELDS]
    out += [f"`{k}` is missing or empty" for k in REQUIRED if not _text(raw.get(k))]
    if _text(raw.get("id")) and not ID.fullmatch(raw["id"]):
        out.append(f"`id` {raw['id']!r} must be lower case letters, digits, '_', '.', '-'")
    kind = raw.get("kind")
    if _text(kind) and kind not in KINDS:
        out.append(f"`kind` must be one of {', '.join(KINDS)}, got {kind!r}")
    elif kind in KINDS:
        problem = _value_problem(kind, raw.get("value"))
        out += [f"`value`: {problem}"] if problem else []
    rule = raw.get("rule")
    if kind == "pairs" and not _text(rule):
        out.append("`rule` is required for a pairs (qualitative) claim: how it is judged, "
                   "written before running")
    elif rule is not None and not _text(rule):
        out.append(f"`rule` is text or null, got {rule!r}")
    return out + _measure_problems(raw, kind, experiments) + _number_problems(raw)


def _measure_problems(raw: dict, kind, experiments) -> list[str]:
    """Problems of `experiment` / `not_expressible`: exactly one, and each well formed."""
    out = []
    exp, why = raw.get("experiment"), raw.get("not_expressible")
    if (exp is None) == (why is None):
        out.append("exactly one of `experiment` (the experiment that measures it) and "
                   "`not_expressible` (the reason none can) must be set")
    if exp is not None and exp not in experiments:
        out.append(f"`experiment` {exp!r} is not a registered experiment "
                   f"(analysis/repro/registry.py: {', '.join(experiments)})")
    if why is not None and not _text(why):
        out.append("`not_expressible` must give the reason in words")
    if why is not None and kind in KINDS and kind != "not_expressible":
        out.append(f"a claim no experiment can measure has kind not_expressible, not {kind!r}")
    return out


def _number_problems(raw: dict) -> list[str]:
    """Problems of `numbers` and the paper_numbers.md section `from` they come from."""
    numbers = raw.get("numbers") or []
    if not isinstance(numbers, list) or not all(_is_number(n) for n in numbers):
        return [f"`numbers` is a list of numbers, got {numbers!r}"]
    if numbers and not sections_named(raw.get("from") or ""):
        return [f"`from` must name the paper_numbers.md section ({', '.join(SECTIONS)}) "
                "that `numbers` come from"]
    return []


def _paper_file(path: Path, experiments) -> tuple[list[Claim], list[str]]:
    data = _read(path)
    if not isinstance(data, dict) or set(data) != {"paper", "claims"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        return [], [f"{path}: the file holds a mapping with exactly `paper` and `claims`, got "
                    f"{keys}"]
    errors = [] if _text(data["paper"]) else [f"{path}: `paper` (the paper's name) is empty"]
    if not isinstance(data["claims"], list):
        return [], [*errors, f"{path}: `claims` is a list"]
    claims = []
    for i, raw in enumerate(data["claims"]):
        if not isinstance(raw, dict):
            errors.append(f"{path}: claims[{i}] is a mapping of {', '.join(FIELDS)}")
            continue
        where = f"claim {raw['id']!r}" if _text(raw.get("id")) else f"claims[{i}]"
        problems = _claim_problems(raw, experiments)
        errors += [f"{path}: {where}: {p}" for p in problems]
        if not problems:
            claims.append(Claim(
                paper=paper_of(path), title=data["paper"], id=raw["id"], source=raw["source"],
                claim=raw["claim"], kind=raw["kind"], value=raw.get("value"),
                rule=raw.get("rule"), origin=raw["from"],
                numbers=tuple(float(n) for n in raw.get("numbers") or []),
                experiment=raw.get("experiment"), not_expressible=raw.get("not_expressible")))
    return claims, errors


def _pattern(text) -> bool:
    if not _text(text):
        return False
    try:
        re.compile(text)
    except re.error:
        return False
    return True


def _raise(errors: list[str]) -> None:
    if errors:
        raise InventoryError(f"{len(errors)} problem(s) in the claims inventory "
                             "(docs/claims.md):\n  " + "\n  ".join(errors))


def paper_of(path: Path) -> str:
    """The paper a file belongs to: its stem up to the first dot (fmoe.v1.yaml -> fmoe)."""
    return Path(path).stem.split(".")[0]


def _files(folder: Path) -> tuple[list[Path], list[str]]:
    found = sorted(p for p in Path(folder).glob("*") if p.suffix in (".yaml", ".yml"))
    stray = [f"{p}: not an inventory file (<paper>.yaml or <paper>.<part>.yaml with <paper> "
             f"one of {', '.join(PAPERS)}, or {EXCLUDED}.yaml)" for p in found
             if p.suffix != ".yaml" or (paper_of(p) not in PAPERS and p.stem != EXCLUDED)]
    papers = [p for paper in PAPERS for p in sorted(
        (f for f in found if f.suffix == ".yaml" and paper_of(f) == paper),
        key=lambda f: (f.stem != paper, f.name))]
    return papers, stray


def load(folder: Path | None = None, experiments=None) -> list[Claim]:
    """Every claim of every paper file, papers in PAPERS order, claims in file order.
    `experiments`: the names an `experiment` may take (default: the registry's)."""
    if experiments is None:
        from analysis.repro.registry import EXPERIMENTS as experiments
    paths, errors = _files(FOLDER if folder is None else folder)
    claims, first = [], {}
    for path in paths:
        found, problems = _paper_file(path, experiments)
        errors += problems
        for c in found:
            if c.id in first:
                errors.append(f"{path}: claim {c.id!r}: `id` is also used in {first[c.id]}; "
                              "ids are unique over all inventory files")
            else:
                first[c.id] = path
                claims.append(c)
    _raise(errors)
    return claims


def load_excluded(folder: Path | None = None) -> list[Exclusion]:
    """The entries of excluded.yaml ([] when the file is absent)."""
    path = (FOLDER if folder is None else Path(folder)) / f"{EXCLUDED}.yaml"
    if not path.is_file():
        return []
    data = _read(path)
    if not isinstance(data, dict) or set(data) != {"excluded"} or not isinstance(
            data["excluded"], list):
        _raise([f"{path}: the file holds a mapping with one key, `excluded`, a list"])
    out, errors = [], []
    for i, raw in enumerate(data["excluded"]):
        where = f"{path}: excluded[{i}]"
        if not isinstance(raw, dict) or set(raw) != {"section", "line", "numbers", "reason"}:
            errors.append(f"{where}: a mapping with exactly section, line, numbers, reason")
            continue
        problems = []
        if raw["section"] not in SECTIONS:
            problems.append(f"`section` is one of {', '.join(SECTIONS)}, got {raw['section']!r}")
        if not _pattern(raw["line"]):
            problems.append(f"`line` is a regular expression that finds the line, got "
                            f"{raw['line']!r}")
        nums = raw["numbers"]
        if nums != "all" and (not isinstance(nums, list) or not nums
                              or not all(_is_number(n) for n in nums)):
            problems.append(f"`numbers` is `all` or a list of numbers, got {nums!r}")
        if not _text(raw["reason"]):
            problems.append("`reason` is missing: why these numbers are not claims")
        errors += [f"{where}: {p}" for p in problems]
        if not problems:
            out.append(Exclusion(raw["section"], raw["line"],
                                 None if nums == "all" else tuple(float(n) for n in nums),
                                 raw["reason"]))
    _raise(errors)
    return out


def present(folder: Path | None = None) -> list[str]:
    """The papers that have an inventory file, in PAPERS order."""
    root = FOLDER if folder is None else Path(folder)
    return [p for p in PAPERS if any(paper_of(f) == p for f in root.glob("*.yaml"))]


def titles(claims: list[Claim]) -> dict[str, str]:
    """{paper file stem: the paper's name}, in report order."""
    return {c.paper: c.title for c in claims}
