"""Miss handlers: whether a missed expert is fetched to the GPU or run on the host CPU."""
