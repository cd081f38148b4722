"""`moebench list [systems|models|hardware|prompts|arrivals|experiments]`: what exists.

One line per option: the name as the command line writes it (`prompts=mmlu`,
`system/evictor=lfu`) and the first comment line of its yaml (a `# @package` line is not
a description), then `[LOSSY: ...]` for a model or experiment whose weights are below 16 bits
(core/precision.py). Without a kind every kind is listed. Options are sorted by name.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.paths import CONF_DIR
from core.precision import lossy_label

# kind -> the config groups it lists (folders under conf/)
KINDS = {
    "systems": ("system", "system/evictor", "system/prefetcher", "system/miss_handler",
                "host_evictor", "placement"),
    "models": ("model",),
    "hardware": ("hardware", "hardware/host", "hardware/nvme", "hardware/link", "hardware/peer"),
    "prompts": ("prompts",),
    "arrivals": ("arrivals",),
    "experiments": ("experiment",),
}


def description(path: Path) -> str:
    """The first comment line of a yaml that is not a Hydra `# @package` header."""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#") and not text.lstrip("# ").startswith("@"):
            return text.lstrip("#").strip()
        if text and not text.startswith("#"):
            break
    return "(no description)"


def lossy(path: Path) -> str:
    """` [LOSSY: ...]` when the yaml sets weights below 16 bits (a model's own expert_bits
    and dense_bits, or an experiment's `model:` node; a width it leaves out counts as 16);
    else ''."""
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    model = data["model"] if isinstance(data.get("model"), dict) else data
    label = lossy_label([(model.get("expert_bits", 16), model.get("dense_bits", 16))])
    return f" [{label}]" if label else ""


def options(group: str, conf: Path = CONF_DIR) -> list[tuple[str, str]]:
    """[(`group=name`, description)] of the group's yaml files, sorted by name. conf/workload
    is no kind: its only generator is synthetic, the rest are stubs naming their replacement."""
    marked = group in ("model", "experiment")
    return [(f"{group}={p.stem}", description(p) + (lossy(p) if marked else ""))
            for p in sorted((conf / group).glob("*.yaml"))]


def render(kinds: list[str], conf: Path = CONF_DIR) -> str:
    lines: list[str] = []
    for kind in kinds:
        rows = [row for group in KINDS[kind] for row in options(group, conf)]
        width = max(len(name) for name, _ in rows)
        lines.append(f"{kind}:")
        lines += [f"  {name.ljust(width)}  {text}" for name, text in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moebench list", description=__doc__.splitlines()[0])
    parser.add_argument("kind", nargs="?", choices=sorted(KINDS),
                        help="what to list (default: everything)")
    args = parser.parse_args(argv)
    print(render([args.kind] if args.kind else list(KINDS)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
