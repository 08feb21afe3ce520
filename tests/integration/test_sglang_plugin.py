"""The plugin is found through the installed entry point and installs our backend as "triton",
in a fresh interpreter, and in a child started with the *spawn* method the way SGLang starts
its schedulers (``run_scheduler_process`` calls ``load_plugins()`` first)."""

import textwrap

from spawned_python import run_for_result

SCRIPT = textwrap.dedent(
    """
    import json
    import multiprocessing as mp
    import sys


    def registry_entry():
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        factory = ATTENTION_BACKENDS["triton"]
        return f"{factory.__module__}.{factory.__name__}"


    def scheduler(queue):
        # What sglang.srt.managers.scheduler.run_scheduler_process does first.
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from types import SimpleNamespace

        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend

        try:  # SGLang's own guard of the "triton" factory still applies
            ATTENTION_BACKENDS["triton"](
                SimpleNamespace(model_config=SimpleNamespace(is_encoder_decoder=True))
            )
            guard = None
        except AssertionError as error:
            guard = str(error)
        # The registry entry builds a real backend for an MLA model runner (SGLang's test-kit
        # runner, CPU), reading KDTREE_VERIFY from this process's environment.
        from kdtree_inference.sglang import testing

        runner = testing.make_model_runner(num_heads=2, num_draft=3, num_layers=1)
        with runner._server_args_override, testing.sglang_cpu_context():
            backend = ATTENTION_BACKENDS["triton"](runner)
        # EAGLE's draft-extend backend, as DraftBackendFactory builds it for "triton".
        from sglang.srt.speculative.draft_utils import DraftBackendFactory

        draft_runner = testing.make_model_runner(
            num_heads=2, num_draft=3, num_layers=1, is_draft_worker=True
        )
        make_draft = DraftBackendFactory._create_triton_prefill_backend
        with draft_runner._server_args_override, testing.sglang_cpu_context():
            stamp, draft = make_draft(SimpleNamespace(draft_model_runner=draft_runner))
        # DFlash's decode graph runner: does a captured target verify of this backend get a
        # custom-mask buffer (one that DFlash's replays never fill)?
        from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

        _, dflash_mask_buffer = resolve_dflash_verify_mask_policy(backend)
        queue.put(
            {
                "entry": registry_entry(),
                "subclass": issubclass(KdtreeTritonAttnBackend, TritonAttnBackend),
                "guard": guard,
                "built": type(backend).__name__,
                "draft_factory": f"{make_draft.__module__}.{make_draft.__name__}",
                "draft_built": [stamp, type(draft).__name__],
                "draft_role": getattr(draft, "kdtree_role", None),
                "draft_active": getattr(draft, "kdtree_active", None),
                "dflash_mask_buffer": dflash_mask_buffer,
                "mode": (
                    backend.kdtree_settings.mode.value
                    if hasattr(backend, "kdtree_settings")
                    else None
                ),
            }
        )


    if __name__ == "__main__":
        # Two schedulers at once: one with the default environment, one whose SGLANG_PLUGINS
        # whitelist leaves us out. A spawned child takes the environment at start().
        context = mp.get_context("spawn")
        results = {}
        children = []
        import os

        os.environ["KDTREE_VERIFY"] = "validate"
        for name, whitelist in (("default", None), ("whitelist", "smg-zmq")):
            if whitelist is not None:
                os.environ["SGLANG_PLUGINS"] = whitelist
            queue = context.Queue()
            child = context.Process(target=scheduler, args=(queue,))
            child.start()
            children.append((name, child, queue))
        for name, child, queue in children:
            results[name] = queue.get(timeout=240)
            child.join(timeout=60)
            results[name]["child_exit"] = child.exitcode
        results["parent_imported_sglang"] = "sglang" in sys.modules
        print("RESULT " + json.dumps(results))
    """
)

OURS = "kdtree_inference.sglang.plugin.create_kdtree_triton_backend"
STOCK = "sglang.srt.layers.attention.attention_registry.create_triton_backend"
DRAFT_OURS = "kdtree_inference.sglang.plugin._create_kdtree_draft_extend_backend"


def test_spawned_schedulers_load_the_plugin_and_swap_triton(tmp_path):
    script = tmp_path / "spawn_scheduler.py"
    script.write_text(SCRIPT)
    results = run_for_result(script)
    # The launching process never touched SGLang: the children found the plugin themselves.
    assert results["parent_imported_sglang"] is False
    default = results["default"]
    assert default["entry"] == OURS
    assert default["subclass"] is True
    assert default["guard"] and "Cross attention is not supported" in default["guard"]
    assert default["child_exit"] == 0
    assert default["built"] == "KdtreeTritonAttnBackend" and default["mode"] == "validate"
    # EAGLE's draft extend: SGLang builds it by class, and the plugin replaces that factory too.
    assert default["draft_factory"] == DRAFT_OURS
    assert default["draft_built"] == ["triton", "KdtreeTritonAttnBackend"]
    assert (default["draft_role"], default["draft_active"]) == ("draft_extend", True)
    # DFlash verifies its block causally on our backend, as on SGLang's (no unfilled mask buffer).
    assert default["dflash_mask_buffer"] is False
    assert results["whitelist"]["dflash_mask_buffer"] is False
    # SGLANG_PLUGINS without "kdtree_verify": SGLang's own factory stays.
    assert results["whitelist"]["entry"] == STOCK
    assert results["whitelist"]["built"] == "TritonAttnBackend"
    assert results["whitelist"]["draft_built"] == ["triton", "TritonAttnBackend"]
    assert results["whitelist"]["child_exit"] == 0
