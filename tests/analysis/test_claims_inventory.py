"""The claims inventory (analysis/repro/inventory.py): the shipped files load, a malformed file
is an error naming the file, the claim and the field, and - where the shared reference folder
is present - every number paper_numbers.md reads in a source is a claim's or excluded.yaml's
(the rule: tests/reference_numbers.py)."""

from __future__ import annotations

import importlib
import textwrap

import pytest
from reference_numbers import (
    numbers_in,
    read_numbers,
    stale_exclusions,
    unknown_claim_numbers,
    unmapped,
)

from analysis.repro.inventory import (
    PAPER_SECTIONS,
    PAPERS,
    SECTIONS,
    InventoryError,
    load,
    load_excluded,
    present,
    sections_named,
)
from core.shared_data import shared_data_dir

EXPS = {"table1", "fmoe_overall"}
GOOD = {"id": "t.a", "source": "Table 1", "claim": "x", "kind": "ratio", "value": 2.0,
        "from": "paper_numbers.md A1, Table 1", "numbers": [737, 155],
        "experiment": "table1"}


def write(folder, name: str, claims: list[dict] | str, paper: str = "P") -> None:
    import yaml

    text = claims if isinstance(claims, str) else yaml.safe_dump(
        {"paper": paper, "claims": claims}, sort_keys=False)
    (folder / name).write_text(text)


def problems(folder) -> str:
    with pytest.raises(InventoryError) as err:
        load(folder, experiments=EXPS)
    return str(err.value)


def test_the_shipped_inventory_loads_and_names_registered_experiments():
    claims = load()
    assert len({c.id for c in claims}) == len(claims)
    assert [c.paper for c in claims] == sorted((c.paper for c in claims), key=PAPERS.index)
    for c in claims:
        if c.experiment is not None:  # the module loads and declares that experiment
            module = importlib.import_module(f"analysis.repro.experiments.{c.experiment}")
            assert module.EXPERIMENT.name == c.experiment, c.id
    excluded = load_excluded()
    assert len(excluded) > 20 and {e.section for e in excluded} == set(SECTIONS)


def test_a_good_file_loads_with_its_fields(tmp_path):
    write(tmp_path, "fmoe.yaml", [GOOD, {**GOOD, "id": "t.b", "kind": "pairs", "value": None,
                                         "rule": "F below each", "numbers": []},
                                  {**GOOD, "id": "t.c", "kind": "not_expressible",
                                   "experiment": None, "not_expressible": "8 GPUs"}])
    write(tmp_path, "moe_infinity.yaml", [{**GOOD, "id": "m.a", "kind": "ordering",
                                           "value": ["a", "b"]}], paper="M")
    claims = load(tmp_path, experiments=EXPS)
    assert [(c.paper, c.id) for c in claims] == [("moe_infinity", "m.a"), ("fmoe", "t.a"),
                                                 ("fmoe", "t.b"), ("fmoe", "t.c")]
    assert claims[1].numbers == (737.0, 155.0) and claims[1].sections == ("A1",)
    assert claims[3].not_expressible == "8 GPUs" and claims[0].title == "M"


@pytest.mark.parametrize("change, words", [
    ({"kind": "rat"}, ["claim 't.a'", "`kind` must be one of"]),
    ({"experiment": "nope"}, ["`experiment` 'nope' is not a registered experiment"]),
    ({"not_expressible": "why"}, ["exactly one of `experiment`"]),
    ({"experiment": None}, ["exactly one of `experiment`"]),
    ({"kind": "pairs", "value": None}, ["`rule` is required for a pairs"]),
    ({"value": [1, 2]}, ["`value`: a ratio claim's value is a positive number"]),
    ({"value": -2}, ["`value`: a ratio claim's value is a positive number"]),
    ({"kind": "ordering", "value": ["a"]}, ["`value`: an ordering's value is a list"]),
    ({"kind": "pairs", "value": 3, "rule": "r"}, ["`value`: a pairs claim is qualitative"]),
    ({"rules": "r"}, ["unknown field `rules`"]),
    ({"claim": ""}, ["`claim` is missing or empty"]),
    ({"id": "T A"}, ["`id` 'T A' must be lower case"]),
    ({"from": "the brief, paragraph 3"}, ["`from` must name the paper_numbers.md section"]),
    ({"numbers": ["737"]}, ["`numbers` is a list of numbers"]),
    ({"experiment": None, "not_expressible": "8 GPUs"},
     ["a claim no experiment can measure has kind not_expressible, not 'ratio'"]),
])
def test_a_bad_claim_is_an_error_naming_file_claim_and_field(tmp_path, change, words):
    write(tmp_path, "fmoe.yaml", [{**GOOD, **change}])
    text = problems(tmp_path)
    assert f"{tmp_path / 'fmoe.yaml'}: " in text
    for w in words:
        assert w in text


def test_every_problem_is_reported_at_once(tmp_path):
    write(tmp_path, "fmoe.yaml", [{**GOOD, "kind": "rat"}, {**GOOD, "id": "t.b",
                                                           "experiment": "nope"},
                                  {k: v for k, v in GOOD.items() if k != "id"}])
    text = problems(tmp_path)
    assert text.startswith("3 problem(s) in the claims inventory")
    assert "claim 't.b'" in text and "claims[2]: `id` is missing" in text


def test_ids_are_unique_over_all_files(tmp_path):
    write(tmp_path, "fmoe.yaml", [GOOD])
    write(tmp_path, "diff_moe.yaml", [GOOD])
    text = problems(tmp_path)
    assert f"{tmp_path / 'diff_moe.yaml'}: claim 't.a': `id` is also used in " \
           f"{tmp_path / 'fmoe.yaml'}" in text


def test_a_paper_continues_in_part_files_after_its_main_file(tmp_path):
    write(tmp_path, "fmoe.b.yaml", [{**GOOD, "id": "t.c"}])
    write(tmp_path, "fmoe.a.yaml", [{**GOOD, "id": "t.b"}])
    write(tmp_path, "fmoe.yaml", [GOOD])
    write(tmp_path, "moe_infinity.yaml", [{**GOOD, "id": "t.m"}])
    got = [(c.paper, c.id) for c in load(tmp_path, experiments=EXPS)]
    # PAPERS order (moe_infinity first), then the main file, then parts by name
    assert got == [("moe_infinity", "t.m"), ("fmoe", "t.a"), ("fmoe", "t.b"), ("fmoe", "t.c")]
    assert present(tmp_path) == ["moe_infinity", "fmoe"]


@pytest.mark.parametrize("name, text, words", [
    ("fmoe.yaml", "paper: P\nclaims:\n  - id: t.a\n    id: t.b\n", ["key 'id' given twice"]),
    ("fmoe.yaml", "claims: []\n", ["exactly `paper` and `claims`"]),
    ("fmoe.yaml", "paper: P\nclaims: {}\n", ["`claims` is a list"]),
    ("fmoe.yaml", "paper: P\nclaims: [\n", ["cannot be read as YAML"]),
    ("fmoe.yaml", "paper: P\nclaims: [3]\n", ["claims[0] is a mapping"]),
    ("other.yaml", "paper: P\nclaims: []\n", ["other.yaml: not an inventory file"]),
    ("fmoe.yml", "paper: P\nclaims: []\n", ["fmoe.yml: not an inventory file"]),
])
def test_a_malformed_file_is_an_error_naming_it(tmp_path, name, text, words):
    write(tmp_path, name, text)
    message = problems(tmp_path)
    assert name in message
    for w in words:
        assert w in message


@pytest.mark.parametrize("entry, words", [
    ({"section": "A9"}, ["excluded[0]", "`section` is one of"]),
    ({"line": "(unclosed"}, ["`line` is a regular expression"]),
    ({"numbers": "some"}, ["`numbers` is `all` or a list"]),
    ({"numbers": []}, ["`numbers` is `all` or a list"]),
    ({"reason": " "}, ["`reason` is missing"]),
    ({"why": "x"}, ["a mapping with exactly section, line, numbers, reason"]),
])
def test_a_bad_exclusion_is_an_error(tmp_path, entry, words):
    import yaml

    good = {"section": "A1", "line": "^Setup", "numbers": "all", "reason": "setting"}
    (tmp_path / "excluded.yaml").write_text(yaml.safe_dump({"excluded": [{**good, **entry}]}))
    with pytest.raises(InventoryError) as err:
        load_excluded(tmp_path)
    for w in [str(tmp_path / "excluded.yaml"), *words]:
        assert w in str(err.value)


def test_from_names_sections():
    assert sections_named("paper_numbers.md A2-v1, Fig. 9; A2 Results") == ("A2-v1", "A2")
    assert sections_named("the brief, paragraph 3 (A5000, BA1)") == ()


REFERENCE = textwrap.dedent("""\
    ## A1. Paper (arXiv 2401.14361)
    Source: repo at commit d617801, 7 files.
    Table 1 [R] A5000 setting, 1x GPU:
    | System | TPOT |
    | DeepSpeed | 737 |
    Also in the text: 934 ms.
    Derived [C]: 4.75x.
    Not labelled again: 11.
    Long [R, text]: 2^12..2^17, Mixtral-8x7B, top-1, bs16 at 18,874,368 B, .478, 1K maps, -46%.
    - a bullet: 6.53x (Fig. 14b)
    ## A2-v1. The brief [S]
    Overall TTFT -44 % in Table 3.
    ## B. Configs [R]
    | h | 2048 |
    """)


def test_the_parsing_rule_on_a_hand_made_reference():
    found = [(n.section, n.lineno, n.written) for n in read_numbers(REFERENCE)]
    assert found == [
        ("A1", 3, "1"), ("A1", 5, "737"), ("A1", 6, "934"),
        ("A1", 9, "2"), ("A1", 9, "12"), ("A1", 9, "2"), ("A1", 9, "17"),
        ("A1", 9, "18,874,368"), ("A1", 9, ".478"), ("A1", 9, "1K"),
        ("A1", 9, "46"), ("A1", 10, "6.53"), ("A2-v1", 12, "44")]
    assert numbers_in("1K and .478")[0][1] == (1.0, 1000.0)
    assert numbers_in(".478")[0][1] == (0.478,)


def reference_text() -> str:
    root = shared_data_dir()
    path = None if root is None else root.parent / "reference" / "paper_numbers.md"
    if path is None or not path.is_file():
        pytest.skip(f"the shared reference folder is absent ({path or 'no shared folder'})")
    return path.read_text(encoding="utf-8")


def test_every_read_number_of_paper_numbers_is_a_claim_or_excluded():
    """Each number paper_numbers.md marks [R] or [S] in sections A1-A4 and A2-v1 (the rule:
    tests/reference_numbers.py - a heading's label covers its section; a line's label runs
    over the table rows, bullets and prose below it up to the next label; names, figure
    references and identifiers are not numbers) is in some claim's `numbers` whose `from`
    names its section, or in an excluded.yaml entry that finds its line. Checked for the
    sections of the papers that have an inventory file (PAPER_SECTIONS)."""
    numbers = read_numbers(reference_text())
    assert len(numbers) > 300  # the rule finds the tables, not just a few lines
    papers = present()
    if not papers:
        pytest.skip("no per-paper inventory file yet (analysis/repro/inventory/<paper>.yaml)")
    sections = {s for p in papers for s in PAPER_SECTIONS[p]}
    claims, excluded = load(), load_excluded()
    missing = unmapped([n for n in numbers if n.section in sections], claims, excluded)
    assert not missing, (
        f"{len(missing)} read numbers of paper_numbers.md are in no inventory row's `numbers` "
        "and no excluded.yaml entry:\n" + "\n".join(
            f"  {n.section} line {n.lineno}: {n.written:>10}  | {n.line[:80]}" for n in missing))


def test_inventory_and_exclusions_name_numbers_the_reference_holds():
    numbers = read_numbers(reference_text())
    stale = stale_exclusions(numbers, load_excluded()) + unknown_claim_numbers(numbers, load())
    assert stale == [], "\n".join(stale)
