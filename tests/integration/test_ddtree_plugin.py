"""``--speculative-algorithm DDTREE``, registered by the kdtree plugin with SGLang's real code:

- in a scheduler started with the *spawn* method, as SGLang starts them: the algorithm resolves,
  builds the DDTree worker on DFlash's, sizes the draft's graphs at the draft block and the
  target's at the verify width, and its captured verify carries the tree mask (DFlash's stays
  causal on the kdtree backend);
- SGLang's own server-argument resolution (``prepare_server_args`` + ``resolve_once``) keeps
  DFlash's defaults and refuses, naming the flag, what the worker cannot serve.
"""

import json
import textwrap
from pathlib import Path

import pytest
from spawned_python import run_for_result

from kdtree_bench.models import make_dflash_draft, make_model

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json
    import multiprocessing as mp
    import sys

    DRAFT = sys.argv[1]


    def scheduler(queue):
        from sglang.srt.plugins import load_plugins

        load_plugins()
        from sglang.srt.runtime_context import get_context
        from sglang.srt.speculative import dflash_utils
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from kdtree_inference.sglang.backend import KdtreeTritonAttnBackend

        algo = SpeculativeAlgorithm.from_string("ddtree")
        worker = algo.create_worker(type("Args", (), {"disable_overlap_schedule": True})())
        backend = object.__new__(KdtreeTritonAttnBackend)
        found = {
            "algo": type(algo).__name__,
            "name": algo.name,
            "is_dflash": algo.is_dflash(),
            "overlap": algo.supports_overlap,
            "worker": worker.__name__,
            "worker_is_dflash": issubclass(worker, DFlashWorkerV2),
        }
        for name, width in (("DDTREE", 17), ("DDTREE", 9), ("DFLASH", 16)):
            with get_context().override_server_args(
                speculative_algorithm=name,
                speculative_draft_model_path=DRAFT,
                speculative_num_draft_tokens=width,
            ):
                found[f"{name}-{width}"] = {
                    "mask": dflash_utils.resolve_dflash_verify_mask_policy(backend)[1],
                    "target_width": algo.get_num_tokens_per_req_for_target_verify(width, False),
                    "draft_width": algo.get_num_tokens_per_req_for_target_verify(width, True),
                }
        # What SGLang's scheduler calls on its algorithm at start, whatever the algorithm.
        import inspect

        import torch
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        future_map = algo.create_future_map(torch.device("cpu"), ReqToTokenPool(4, 32, "cpu", False))
        found["scheduler_calls"] = {
            "carries_draft_hidden_states": algo.carries_draft_hidden_states(),
            "need_topk": algo.need_topk(),
            "future_map": type(future_map).__name__,
            "future_map_algo": future_map.spec_algo is algo,
        }
        found["enum_methods_missing"] = sorted(
            name
            for name, value in vars(SpeculativeAlgorithm).items()
            if inspect.isfunction(value) and not name.startswith("_") and not hasattr(algo, name)
        )
        try:
            algo.create_worker(type("Args", (), {"disable_overlap_schedule": False})())
            found["overlap_refused"] = None
        except ValueError as error:
            found["overlap_refused"] = str(error)
        queue.put(found)


    if __name__ == "__main__":
        context = mp.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=scheduler, args=(queue,))
        child.start()
        found = queue.get(timeout=180)
        child.join(timeout=60)
        found["child_exit"] = child.exitcode
        found["parent_imported_sglang"] = "sglang" in sys.modules
        print("RESULT " + json.dumps(found))
    """
)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The tiny preset's config.json (all that SGLang's argument resolution reads of a model)."""
    out = tmp_path_factory.mktemp("tiny_target")
    (out / "config.json").write_text(json.dumps(make_model.model_config("tiny")))
    return out


@pytest.fixture(scope="module")
def draft(tmp_path_factory, target) -> Path:
    """A DFlash draft's config for the tiny target (block 16), as make_dflash_draft writes it."""
    out = tmp_path_factory.mktemp("dflash_draft")
    config = make_dflash_draft.draft_config(json.loads((target / "config.json").read_text()))
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_spawned_scheduler_registers_ddtree(tmp_path, draft):
    script = tmp_path / "spawn_scheduler.py"
    script.write_text(SCRIPT)
    found = run_for_result(script, str(draft))
    assert found["parent_imported_sglang"] is False and found["child_exit"] == 0
    assert (found["algo"], found["name"], found["is_dflash"]) == ("DDTreeAlgorithm", "DDTREE", True)
    assert (found["worker"], found["worker_is_dflash"]) == ("DDTreeWorker", True)
    assert found["overlap"] is False
    assert "does not support overlap scheduling" in found["overlap_refused"]
    # SGLang's scheduler calls these on any algorithm at start (CustomSpecAlgo lacks them).
    assert found["scheduler_calls"] == {
        "carries_draft_hidden_states": False,
        "need_topk": False,
        "future_map": "FutureMap",
        "future_map_algo": True,
    }
    # The enum's one other instance method: an out-of-tree platform's worker class, which only
    # the enum's own create_worker and adaptive speculation ask for.
    assert found["enum_methods_missing"] == ["get_platform_worker_cls"]
    # Budget 16: the target verifies 17 nodes, the draft runs its 16-token block.
    assert found["DDTREE-17"] == {"mask": True, "target_width": 17, "draft_width": 16}
    # Budget 8: a tree of 8 nodes is at most 8 deep, so the draft's block is capped at 9.
    assert found["DDTREE-9"] == {"mask": True, "target_width": 9, "draft_width": 9}
    # DFlash on the kdtree backend still verifies its block causally, without a mask buffer.
    assert found["DFLASH-16"]["mask"] is False


RESOLVE = textwrap.dedent(
    """
    import json, os, sys
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import prepare_server_args

    results = []
    for flags, env in json.loads(sys.argv[1]):
        os.environ.pop("KDTREE_DDTREE_TOPK", None)
        os.environ.update(env)
        args = prepare_server_args(flags)
        try:
            args.resolve_once()
        except ValueError as error:
            results.append("REFUSED " + str(error))
            continue
        cfg = resolving_view(args)
        results.append({
            "width": cfg.speculative_num_draft_tokens,
            "steps": cfg.speculative_num_steps,
            "topk": cfg.speculative_eagle_topk,
            "max_running_requests": cfg.max_running_requests,
        })
    print("RESULT " + json.dumps(results))
    """
)
SERVABLE = ("--disable-overlap-schedule", "--grammar-backend", "none")
REFUSALS = {
    "overlap": (("--grammar-backend", "none"), {}, "--disable-overlap-schedule"),
    "grammar": (("--disable-overlap-schedule",), {}, "--grammar-backend none"),
    "tp": ((*SERVABLE, "--tp-size", "2"), {}, "--tp-size 1"),
    "page": ((*SERVABLE, "--page-size", "16"), {}, "--page-size 1"),
    "window": (
        (*SERVABLE, "--speculative-draft-window-size", "64"),
        {},
        "--speculative-draft-window-size",
    ),
    "block": (
        (*SERVABLE, "--speculative-dflash-block-size", "16"),
        {},
        "--speculative-dflash-block-size",
    ),
    "width": ((*SERVABLE, "--speculative-num-draft-tokens", "1"), {}, "at least 2"),
    # One candidate per depth: a 15-deep chain holds 15 nodes, not 16.
    "topk": (
        (*SERVABLE, "--speculative-num-draft-tokens", "17"),
        {"KDTREE_DDTREE_TOPK": "1"},
        "raise KDTREE_DDTREE_TOPK",
    ),
}


def resolve_all(tmp_path: Path, target: Path, cases: list[tuple[Path, tuple, dict]]) -> list:
    """SGLang's resolution of each ``(draft, flags, env)``, in one interpreter."""
    script = tmp_path / "resolve.py"
    script.write_text(RESOLVE)
    argv = [
        [
            "--model-path",
            str(target),
            "--attention-backend",
            "triton",
            "--device",
            "cuda",
            "--speculative-algorithm",
            "DDTREE",
            "--speculative-draft-model-path",
            str(draft),
            *flags,
        ]
        for draft, flags, _ in cases
    ]
    payload = json.dumps([[a, env] for a, (_, _, env) in zip(argv, cases, strict=True)])
    return run_for_result(script, payload)


def test_server_args_resolution(tmp_path, target, draft):
    """DFlash's defaults are kept; what the worker cannot serve is refused, naming the flag."""
    plain = tmp_path / "plain_draft"
    plain.mkdir()
    config = json.loads((draft / "config.json").read_text())
    del config["dflash_config"]
    (plain / "config.json").write_text(json.dumps(config))
    cases = [
        (draft, SERVABLE, {}),
        (draft, (*SERVABLE, "--speculative-num-draft-tokens", "65"), {}),
        (plain, SERVABLE, {}),
        *((draft, flags, env) for flags, env, _ in REFUSALS.values()),
    ]
    default, wide, no_dflash_config, *refused = resolve_all(tmp_path, target, cases)
    # The default tree: the draft's block (budget 15); DFlash's step, top-k and request cap.
    assert default == {"width": 16, "steps": 1, "topk": 1, "max_running_requests": 48}
    assert wide["width"] == 65
    assert no_dflash_config.startswith("REFUSED "), no_dflash_config
    assert "has no dflash_config" in no_dflash_config
    assert "--speculative-draft-model-path" in no_dflash_config
    for (name, (_, _, names)), line in zip(REFUSALS.items(), refused, strict=True):
        assert isinstance(line, str), (name, line)
        assert line.startswith("REFUSED --speculative-algorithm DDTREE: "), (name, line)
        assert names in line, (name, line)
