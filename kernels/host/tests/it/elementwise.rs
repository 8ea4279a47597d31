//! `kernels/cuda/elementwise.cu` on the CPU against gradwire's CPU code (being written).
