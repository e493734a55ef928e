"""Lowering: the kernels the runtime's C runs instead of generated loops (the float microkernel, the direct depthwise
kernel, the int8 microkernel, the 8-bit pools and im2col), each found in a kernel's AST and turned into calls."""
