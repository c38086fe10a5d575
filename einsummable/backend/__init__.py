"""Plans out: lowering to one program per rank (lowering), message packing (coalesce), and
the executors (runtime: local, torch.distributed, and the simulator)."""
