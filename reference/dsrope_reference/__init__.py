"""The oracle: FP64/mpmath models of the dsrope kernels. It never imports dsrope."""
