"""SGLang without FlashInfer: DFlash's sampling verify marked unavailable, as SGLang does on NPU.

The GPU machine's SGLang payload carries no FlashInfer. SGLang 0.5.23 builds DFlash's sampling
verify kernel (``tree_speculative_sampling_target_only``) against FlashInfer's headers and its
top-p renormalization calls ``flashinfer.sampling``, and the DFlash worker rehearses that path at
start-up, so no DFlash server starts there. SGLang already has the configuration for a platform
without that kernel: ``dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE = False``, under which the
rehearsal is skipped and requests verify greedily (``spec_sampling_mask.py``). Greedy decoding is
all the benchmarks and parity runs use, so this changes none of their numbers.

``bench/sglang_gpu.sh`` puts this directory first on ``PYTHONPATH``, so every server process (and
its spawned scheduler) runs this at start. It does so also when it carries FlashInfer for
attention (``SGLANG_GPU_FLASHINFER=1``), so that such a run differs from the others in the
attention backend alone. Never shipped: the inference image installs SGLang with FlashInfer.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_MODULE = "sglang.srt.speculative.dflash_utils"


class _MarkSamplingVerifyUnavailable(importlib.abc.MetaPathFinder):
    """Loads ``dflash_utils`` as usual, then clears its sampling-verify flag."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_mark(module):
            exec_module(module)
            module._DFLASH_SAMPLING_VERIFY_AVAILABLE = False

        spec.loader.exec_module = exec_then_mark
        return spec


def install() -> None:
    sys.meta_path.insert(0, _MarkSamplingVerifyUnavailable())


if importlib.util.find_spec("flashinfer") is None:
    install()
