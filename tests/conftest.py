"""Suite-wide settings: one torch thread per process.

The CI machine has two cores shared with tritonserver and its stage processes; the tiny
models' matmuls lose far more to thread hand-off than they gain (10-20x slower steps were
measured with the default pool under load).
"""
import torch

torch.set_num_threads(1)
