"""Python side of csrc/: the CUDA extension built once and cached (build.py), the persistent decode kernels the
talker and code predictor step in (megakernel.py), and the fused kernels that run chains of eager ops in one launch
each in the prefill and the speech codec (fused.py)."""
