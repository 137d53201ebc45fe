"""The process: device, threads, seeding, autocast, torchrun collectives, FLOPs and the matmul peak."""
