"""Scale planning: targets (TPU slices, GPU clusters), AOT memory plans, FLOPs."""
