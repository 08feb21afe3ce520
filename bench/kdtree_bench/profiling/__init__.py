"""Profiling: Nsight Compute and SGLang profiler runs, host samples, clocks and timelines."""
