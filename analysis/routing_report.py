"""`moebench characterize`: routing statistics of one trace or recording, as markdown + PNG.

  moebench characterize TRACE.npz [--out DIR]
  moebench characterize ROUTING.jsonl[.gz]|.csv --model NAME [--duplicates first]
      [--prompts 1-400] [--decode-tokens 31]   # a split; the last 31 tokens as decode
  moebench characterize --calibration [--embed]   # synthetic vs the shared real samples

Definitions of every statistic: docs/routing.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.characterize import (
    CDF_DISTANCES,
    HEAVY_TOKEN_SHARE,
    LAGS,
    characterize,
    request_sequences,
)
from analysis.routing_structure import (
    decode_sequences,
    render_structure,
    structure,
    teacher_forced,
)
from core.atomic import atomic_path, write_json, write_text
from harness.sim.metrics import spec_recall

ROWS = [  # (key, label, format)
    ("requests", "requests", "{}"),
    ("requests_measured", "  measured within request (>= min tokens at a layer)", "{}"),
    ("reuse_lag1", "consecutive-token reuse (share of a token's k experts)", "{:.3f}"),
    ("random_reuse", "  reuse under random routing (k/E)", "{:.3f}"),
    ("entropy_bits", "per-layer expert entropy within a request (bits)", "{:.3f}"),
    ("max_entropy_bits", "  maximum (log2 E)", "{:.2f}"),
    ("top_share", "most used expert's share of a layer's routings, within a request", "{:.3f}"),
    ("uniform_share", "  uniform share (1/E)", "{:.4f}"),
    ("used", "share of a layer's experts used at least once in a request", "{:.3f}"),
    ("once", "share of experts used exactly once in a request", "{:.3f}"),
    ("repeated", "share of experts used two or more times in a request", "{:.3f}"),
    ("heavy", f"share reused heavily (serves >= {HEAVY_TOKEN_SHARE:.3g} of the tokens)",
     "{:.3f}"),
    ("agg_entropy_bits", "aggregate per-layer load entropy, all requests (bits)", "{:.3f}"),
    ("agg_top_share", "aggregate busiest expert's share", "{:.4f}"),
    ("agg_busiest_over_mean", "aggregate busiest / mean load", "{:.2f}"),
    ("cos_adjacent", "activation cosine, adjacent requests", "{:.3f}"),
    ("cos_random", "activation cosine, all request pairs", "{:.3f}"),
    ("groups", "request groups (K-means, best silhouette k in 2..50)", "{}"),
    ("silhouette", "  best silhouette", "{:.3f}"),
    ("transition_max", "largest group-to-group transition probability", "{:.3f}"),
    ("transition_rowmax_median", "  median over groups of the largest", "{:.3f}"),
    ("spec_hit", "next-layer guess accuracy (trace spec_topk)", "{:.3f}"),
    ("freq_guess_hit", "frequency guess accuracy (request's k most used experts so far)",
     "{:.3f}"),
    ("xl_precision", "cross-layer precision (next layer's experts from this layer's, same token)",
     "{:.3f}"),
    ("xl_popularity", "  popularity guess (next layer's k most used experts)", "{:.3f}"),
    ("xl_mi_bits", "cross-layer mutual information (bits)", "{:.3f}"),
    ("xl_mi_shuffled_bits", "  with tokens shuffled within a request", "{:.3f}"),
]


def fmt(value, pattern: str) -> str:
    return "n/a" if value is None else pattern.format(value)


def render(name: str, st: dict, note: str) -> str:
    lines = [f"# Routing characterisation: {name}", "", note, "",
             "| statistic | value |", "|---|---|"]
    lines += [f"| {label} | {fmt(st.get(key), f)} |" for key, label, f in ROWS]
    lines += ["", "Reuse at lag d (share of a token's experts also used d tokens earlier):",
              "", "| d | " + " | ".join(str(d) for d in LAGS) + " |",
              "|---|" + "---|" * len(LAGS),
              "| reuse | " + " | ".join(fmt(st.get(f"reuse_lag{d}"), "{:.3f}") for d in LAGS)
              + " |", "", "Reuse-distance CDF (share of routings whose expert was last used "
              "at the same layer at most d tokens earlier; the rest are first uses):", "",
              "| d | " + " | ".join(str(d) for d in CDF_DISTANCES) + " |",
              "|---|" + "---|" * len(CDF_DISTANCES)]
    cdf = st.get("reuse_distance_cdf") or {}
    lines.append("| CDF | " + " | ".join(fmt(cdf.get(d), "{:.3f}") for d in CDF_DISTANCES)
                 + " |")
    if st.get("coupling"):
        c = st["coupling"]
        lines += ["", f"Prompt-embedding vs activation similarity over request pairs "
                      f"({c['embedder']}): Pearson r {c['pearson_r']:.3f}, slope "
                      f"{c['slope']:.3f}; activation cosine of the 5% most similar prompt "
                      f"pairs {c['act_cos_top5pct_prompt_pairs']:.3f} vs all pairs "
                      f"{c['act_cos_all']:.3f}."]
    return "\n".join(lines) + "\n"


def write_png(path: Path, name: str, st: dict) -> bool:
    """Four panels; False (nothing written) when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    if "load" in st:
        im = ax[0, 0].imshow(st["load"] * st["num_experts"], aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=ax[0, 0], label="load / uniform")
        ax[0, 0].set(title="aggregate load per layer and expert", xlabel="expert",
                     ylabel="MoE layer")
    cdf = st.get("reuse_distance_cdf") or {}
    ax[0, 1].plot(list(cdf), list(cdf.values()), marker="o")
    ax[0, 1].set(xscale="log", title="reuse-distance CDF", xlabel="tokens since last use",
                 ylabel="share of routings", ylim=(0, 1))
    if "layer_entropy_bits" in st:
        ax[1, 0].plot(st["layer_entropy_bits"], marker=".", label="aggregate")
        ax[1, 0].axhline(st["entropy_bits"], color="k", ls="--", label="within request (mean)")
        ax[1, 0].axhline(st["max_entropy_bits"], color="grey", ls=":", label="log2 E")
        ax[1, 0].set(title="per-layer expert entropy", xlabel="MoE layer", ylabel="bits")
        ax[1, 0].legend()
    if st.get("scores"):
        ax[1, 1].plot(list(st["scores"]), list(st["scores"].values()), marker=".")
        ax[1, 1].set(title="K-means silhouette", xlabel="k", ylabel="mean silhouette")
    fig.suptitle(name)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=90, format="png")
    finally:
        plt.close(fig)
    return True


def load_sequences(path: str, model: str | None, duplicates: str):
    """(name, sequences, E, k, trace or None, note, request ids or None) from a trace v1
    file or a recording (ids: the recording's request ids, in file order)."""
    from core.trace import read_trace

    if path.endswith(".npz"):
        tr = read_trace(path)
        kind = "SYNTHETIC routing" if tr.synthetic else f"routing {tr.routing_source}"
        return (Path(path).name, request_sequences(tr), tr.num_experts, tr.top_k, tr,
                f"{kind}; trace sha256 {tr.content_sha256()[:16]}.", None)
    from workloads.importers import model_shape, read_routing

    if not model:
        raise ValueError("--model is required for a raw routing file (it gives E and k)")
    shape = model_shape(model)
    reqs, sha = read_routing(path, "auto", duplicates)
    for r in reqs:
        if r.ids.shape[0] != shape["num_moe_layers"] or r.ids.shape[2] != shape["top_k"]:
            raise ValueError(f"{Path(path).name}: request {r.id!r} has {r.ids.shape[0]} layers "
                             f"of top-{r.ids.shape[2]}; {model} needs {shape['num_moe_layers']}"
                             f" of top-{shape['top_k']}")
    return (Path(path).name, [r.ids for r in reqs], shape["num_experts"], shape["top_k"], None,
            f"Recorded routing (raw file, gaps kept as missing); file sha256 {sha[:16]}.",
            [r.id for r in reqs])


def select_prompts(ids: list, first: int, last: int) -> list[int]:
    """Indices (file order) of the requests numbered first..last: by request id where every
    id is an integer (the DeepSeek-V2-Lite sample's prompt_id: its prompt 317 is absent, so
    ids 1-400 are 399 records), else by 1-based file position."""
    try:
        nums = [int(i) for i in ids]
    except (TypeError, ValueError):
        nums = list(range(1, len(ids) + 1))
    return [i for i, n in enumerate(nums) if first <= n <= last]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moebench characterize", description=__doc__.split("\n")[0])
    ap.add_argument("input", nargs="?", help="trace v1 .npz, or a .jsonl[.gz]/.csv recording")
    ap.add_argument("--model", help="conf/model name (raw recordings only)")
    ap.add_argument("--duplicates", default="error", choices=("error", "first"))
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0, help="K-means seed")
    ap.add_argument("--out", help="output folder (default results/characterize/<name>)")
    ap.add_argument("--prompts", metavar="A-B",
                    help="raw recordings: only its requests numbered A..B (the request id "
                         "where ids are integers, else 1-based file order)")
    ap.add_argument("--decode-tokens", type=int, default=0, metavar="N",
                    help="raw recordings: each request's last N tokens are its (teacher-forced) "
                         "decode window for the decode statistics; requests of <= N tokens "
                         "are left out of them")
    ap.add_argument("--calibration", action="store_true",
                    help="synthetic generator vs the shared real samples (docs/routing.md)")
    ap.add_argument("--embed", action="store_true",
                    help="with --calibration: measure prompt/activation coupling (MiniLM)")
    ap.add_argument("--shared-data", metavar="DIR",
                    help="with --calibration: the shared data folder (default "
                         "$MOEBENCH_SHARED_DATA, else ../shared/data beside the checkout)")
    return ap


def main(argv: list[str]) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.calibration:
        from analysis.routing_calibration import main as calibration_main

        return calibration_main(args)
    if not args.input:
        ap.error("an input file (or --calibration) is required")
    t0 = time.perf_counter()
    try:
        name, seqs, E, k, tr, note, ids = load_sequences(args.input, args.model,
                                                         args.duplicates)
    except (OSError, ValueError) as exc:
        print(f"moebench characterize: error: {exc}", file=sys.stderr)
        return 2
    if args.prompts and tr is None:
        first, last = (int(x) for x in args.prompts.split("-"))
        seqs = [seqs[i] for i in select_prompts(ids, first, last)]
        name = f"{name} (requests {args.prompts})"
        note = f"{note} Requests numbered {args.prompts}: {len(seqs)} of the file's {len(ids)}."
    st = characterize(seqs, E, k, args.min_tokens, args.seed)
    st["spec_hit"] = spec_recall(tr) if tr is not None else None
    dec = decode_sequences(tr) if tr is not None else teacher_forced(seqs, args.decode_tokens)
    extra = structure(seqs, dec if args.decode_tokens or tr is not None else [], E, k,
                      tr.tasks if tr is not None else None,
                      tr.datasets if tr is not None else None, args.seed)
    out = Path(args.out or Path("results") / "characterize" / Path(name).stem)
    md, png = _write(out, name, st, extra, note, len(dec))
    print(md)
    print(f"wrote {out}/characterize.md, .json{', .png' if png else ''} in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0


def _write(out: Path, name: str, st: dict, extra: dict, note: str,
           n_decode: int) -> tuple[str, bool]:
    """characterize.md, .json and (with matplotlib) .png in `out`; (the markdown, whether
    the PNG was written)."""
    out.mkdir(parents=True, exist_ok=True)
    md = render(name, st, note) + render_structure(extra, n_decode)
    png = write_png(out / "characterize.png", name, st)
    if not png:
        md += "\n(no PNG: matplotlib is not installed; pip install 'moe-offload-bench[plots]')\n"
    write_text(out / "characterize.md", md)
    plain = {key: st.get(key) for key, _, _ in ROWS}
    plain.update({f"reuse_lag{d}": st.get(f"reuse_lag{d}") for d in LAGS})
    plain["reuse_distance_cdf"] = st.get("reuse_distance_cdf")
    plain["structure"] = extra
    write_json(out / "characterize.json", plain)
    return md, png
