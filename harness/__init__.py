"""The shared offload engine, simulated backend, results and the `moebench` runner."""
