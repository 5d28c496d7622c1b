# SPDX-License-Identifier: MIT
"""The GEMMs of a converted linear (paths.py: which path, the dequantize reference; triton.py: the
Triton kernels that read the quantized planes)."""
