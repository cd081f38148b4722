"""One module per experiment (analysis/repro/spec.py says what each declares); the registry
(analysis/repro/registry.py) finds them."""
