"""The Belady family of bounds (conf/system/oracle.yaml, belady*.yaml): rule.py Belady's MIN
in plain python, the reference of the compiled plan; system.py the oracle (MIN's plan with
early prefetch); belady.py belady and belady_lookahead (MIN victims, demand fetches: the zoo's
systems/evictors/belady.py composed); bypass.py belady_bypass (MIN plus admission);
kernels/ the optional compiled plan."""
