"""The reproduction suite: one experiment per published table or figure of the seed papers,
each with a config (conf/experiment/<name>.yaml), a make target (`make reproduce-<name>`),
its runs, table and figure under results/<name>/, and the claims it tests with a verdict
(results/claims.md). docs/reproduction.md lists them; analysis/repro/verdict.py holds the rule.

  spec.py         Experiment and ClaimRow, what an experiment module declares
  frame.py        a results folder as a pandas table (one row per run)
  output.py       tables (markdown, LaTeX, CSV) and figures (PNG, PDF), byte-identical reruns
  verdict.py      reproduced / direction only / not reproduced / not expressible
  inventory.py    every published claim, per paper (inventory/*.yaml; docs/claims.md)
  claims.py       results/claims.{md,csv}: one row per inventory entry (claims_table.py)
  registry.py     every experiment, in docs order
  layout.py       where an experiment's runs go, its seeds, what its report expects there
  plan.py         the experiments' sweeps times their seeds, expanded into one list of jobs
  launch.py       that list handed to one Hydra launcher (joblib, Ray, SLURM) at once
  suite.py        `moebench reproduce|report|claims|figures`
  experiments/    one module per experiment
"""
