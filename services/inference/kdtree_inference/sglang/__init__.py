"""kdtree's SGLang integration: the verify attention backend, its plugin and its launcher.

- ``modes``: the backend's settings (``kdtree_inference.settings`` read from the environment);
- ``extension``: is the CUDA kernel usable on this machine (the launcher's and backend's check);
- ``marshal``: SGLang's per-forward verify metadata -> the op's inputs, in static buffers;
- ``comparison``: on-device kernel-vs-Triton error statistics (graph-safe);
- ``telemetry``: Prometheus metrics and the structured publish log line;
- ``backend``: ``KdtreeTritonAttnBackend``, the ``TritonAttnBackend`` subclass;
- ``plugin``: the ``sglang.srt.plugins`` entry point that installs it as "triton";
- ``launcher``: ``kdtree-serve``.

Nothing here imports SGLang at package import time, so the launcher starts fast and the settings
can be parsed on machines without SGLang.
"""
