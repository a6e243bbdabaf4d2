"""GPU truth: CUDA-event phase timing, allocator memory, MFU and profiler windows (docs/gpu.md).

Each source does nothing on a CPU run."""
