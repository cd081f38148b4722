"""`hydra/sweeper=job_file`: a sweep whose jobs are listed in a file (harness/runner/sweep_jobs.py).

Hydra finds it by scanning the `hydra_plugins` namespace package; `moebench reproduce`
uses it to hand every run of the suite to one launcher call."""
