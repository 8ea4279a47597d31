//! `kernels/cuda/lowrank.cu` on the CPU against gradwire's CPU code (being written).
