"""Graphs in: the join-agg IR and its einsum strings, scalar join expressions, fused kernels,
a PyTorch-like builder, capture from torch.export, kernel fusion, and the single-device
reference evaluator (the oracle every later stage is checked against)."""
