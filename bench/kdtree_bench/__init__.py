"""kdtree's benchmarks, profiling tools, end-to-end server harness and results pipeline."""
