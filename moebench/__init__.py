"""moebench: the command-line tool (moebench/cli.py).

Settings of every moebench process, made here because this runs before moebench.cli's
imports load numpy:
- NUMPY_MADVISE_HUGEPAGE=0 unless the user set it: numpy otherwise asks the kernel for
  transparent huge pages on its large arrays, and where the kernel compacts memory at fault
  time for them (THP defrag "madvise", a common default) that is slow enough to break
  linear scaling: the oracle's plan and summarize()'s temporaries took 0.09-0.13 us of
  system CPU per access at 1,000 requests against 0.01-0.03 at 290, 0.03-0.06 at both
  without huge pages, with no loss in user time (docs/engine.md, "Cost model of the engine").
  Child processes (sweeps, bench-sim) inherit it.
"""

import os

os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
