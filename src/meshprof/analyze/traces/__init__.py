"""torch.profiler (Kineto) traces: loading, HTA's GPU breakdown, kernel-level stragglers."""
