"""The CPU backend (:class:`CpuOps`): oneDNN products, dropout masks from 16-bit lanes of 64-bit random words, C++
kernels of a training step, the loss fused with the vocabulary projection, and a decoding step's attention spelled
out; each beside the plain form it falls back to.

Modules: which kernel computes each operation (``backend``); oneDNN's matmul and the Linear layers through it
(``onednn``); the dropout masks and the residual dropout-and-add (``dropout``); ScaleNorm's written-out backward in
torch and in C++ (``scale_norm``); the C++ attention's autograd forms and the decoding step's spelled-out attention
(``attention``); the chunked loss (``fused_loss``); the C++ sources (``csrc/``) and their build on first use
(``native``).

Private torch APIs, each where no public one does the work:

- ``torch.ops.mkldnn._linear_pointwise`` (``onednn``): the only call of oneDNN's matmul with a post-op (the FFN's
  ReLU) and without MKL; torch's public ``F.linear`` and ``mm`` send float32 to MKL. Absent from a torch build,
  the products keep ``F.linear``.
- ``Tensor._base`` (``attention.short_attention``): whether q, k and v are views of one fused projection's output, and
  that output itself, so that the C++ attention's backward writes one gradient for the projection instead of three
  that autograd would copy together. Where it is None or another tensor, the kernel takes the three views.
"""

from transformer_mt.model.ops.cpu import native
from transformer_mt.model.ops.cpu.backend import CpuOps

__all__ = ["CpuOps", "native"]
