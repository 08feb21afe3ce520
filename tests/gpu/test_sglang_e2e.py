"""Real SGLang 0.5.23 servers with the kdtree backend, end to end, on the GPU.

``kdtree-serve`` servers of a seeded DeepSeek-V3-architecture model (``bench/kdtree_bench/models``) run at once
on one GPU, each with speculative decoding and ``--enable-metrics``. ``KDTREE_E2E_CONFIG`` picks
the configuration family (``CONFIGS``; default ``eagle``): EAGLE's tree on the tiny model with a
bf16 cache (``eagle``) or an FP8 one (``eagle-fp8``), DFlash's block verify with its draft model
(``dflash``), or EAGLE on one TP8 rank of Kimi K2 (``kimi``). Every family has these servers
(``eagle`` adds the chain pair):

=================  ========  ===========  ===========================================
server             mode      CUDA graphs  what it proves
=================  ========  ===========  ===========================================
off                off       yes          the baseline; the parity gate's baseline
validate           validate  yes          served tokens and logprobs == off's
off_eager          off       no           (families with an eager pair)
validate_eager     validate  no           == off_eager's, eagerly
off_chain          off       yes          (eagle: EAGLE's chain, top-k 1)
validate_chain     validate  yes          == off_chain's
on                 on        yes          the parity gate's candidate: PASS
on_seed1           on        yes          other weights: the gate must FAIL
off_floor          off       yes          the A/A' floor: off with EAGLE's chain
=================  ========  ===========  ===========================================

Every family but ``ddtree-rank``, ``ddtree-rank-64``, ``ddtree-kimi-16`` and ``ddtree-kimi-64``
gates against an A/A' floor; ``eagle``'s floor is its ``off_chain`` server. A DFlash family's floor runs EAGLE's chain on
the same target: greedy tokens do not depend on the draft. Those four run no gate (no on,
on_seed1 or off_floor): they check validate == off on other presets and budgets.

Every request is greedy with logprobs. Each pair gets the same requests in the same order: one
at a time (batch 1: decode graph replays on graph servers), then one /generate call of 8
prompts (batch 8: beyond the graphs' batch sizes, so eager on the same servers). The radix cache
is off so that repeated prompts recompute exactly.

Skips without CUDA (tests/gpu/conftest.py) or without SGLang's GPU runtime (``sgl_kernel``).
Logs, metrics, parity reports and ``correctness.json`` go to ``KDTREE_E2E_OUT`` (default: a
pytest temporary directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

# sgl_kernel installs on a CPU machine but its import fails there (no libcuda): an ImportError.
pytest.importorskip(
    "sgl_kernel", reason="needs SGLang's GPU runtime (sgl_kernel)", exc_type=ImportError
)

ROOT = Path(__file__).resolve().parents[2]

from kdtree_bench.e2e.sglang_e2e import metric_sum, metric_values  # noqa: E402
from kdtree_bench.e2e.sglang_servers import (  # noqa: E402
    DDTREE,
    DRAFT_MODEL_SPECULATIONS,
    POOLS_WAIT_S,
    PRESET_MEM_FRACTION,
    ServerSpec,
    kv_pool_cap,
    kv_tokens_needed,
    start_all,
    stop_all,
)
from kdtree_bench.models import make_dflash_draft, make_model  # noqa: E402
from kdtree_inference.sglang.modes import BF16_POOL_ATOL, FP8_POOL_ATOL  # noqa: E402
from kdtree_parity.client import build_generate_request  # noqa: E402
from kdtree_parity.corpus import CorpusEntry, load_corpus  # noqa: E402
from kdtree_parity.generation import parse_generate_response  # noqa: E402
from kdtree_parity.policy import load_policy  # noqa: E402

MODELS = ROOT / "bench" / "kdtree_bench" / "models"


@dataclasses.dataclass(frozen=True)
class E2EConfig:
    """One configuration family: the target preset and what every server of it runs."""

    preset: str
    server: dict  # ServerSpec keywords common to every server (speculation, kv_dtype, ...)
    eager_pair: bool = True
    chain_pair: bool = False
    mem_fraction: float = 0.07
    # GPU memory the family's servers need together (0: any card this project runs on). SGLang
    # counts the weights against each server's fraction, so the fractions sized on an H200 leave
    # a smaller card's later starts no KV cache; such a family refuses the card up front.
    min_gpu_gib: float = 0
    # Cap every server's KV pool at what the family's requests hold (SGLang's --max-total-tokens,
    # as the speed harness's --kv-tokens auto): a capped server then holds its weights, its pool
    # and its graphs rather than its whole fraction of what it found free, so the later starts
    # keep room.
    kv_cap: bool = False
    # ServerSpec keywords of an A/A' floor server (off, the same weights, computed an equivalent
    # but not bit-identical way); the gate then judges its candidates by their excess over it.
    # Another draft shape is exact for greedy decoding (the target's tokens do not depend on the
    # draft) and moves the target's own numerics: other accept lengths put each token's keys at
    # other tile boundaries and in other prefix/draft splits of the verify attention. kv-splits
    # reach only the draft's decode; prefill chunking does not reach the short corpus's prompts
    # (under 16 tokens: a 16-token chunk left the floor bit-identical to off, e2e 15).
    floor: dict | None = None
    # The gate's policy, calibrated to the preset's logits (its header says how).
    policy: Path = MODELS / "parity_policy.yaml"
    # Prompt lengths of the one ragged batch every pair replays (its longest sets how far into
    # the context the batched verify reaches beside short rows).
    batch_lengths: tuple[int, ...] = (17, 40, 64, 96, 128, 200, 333, 512)
    # Whether the family runs the parity gate (an on server, one with other weights, the
    # floor). A family without it checks that validate serves what off serves, in four
    # servers: the gate's policy is calibrated per preset, and the tiny and kimi-rank families
    # run it.
    gate: bool = True
    # Per-layer bound on max |kernel - triton| (None: the pool's tolerance, ``atol``, which is
    # one to two bf16 steps for outputs of O(1)).
    validate_max_abs: float | None = None

    @property
    def floor_server(self) -> str | None:
        """The server the gate takes as its A/A' floor: the chain pair's ``off_chain`` where
        that is the floor's configuration, else a server of its own."""
        if self.floor is None or not self.gate:
            return None
        if self.chain_pair and self.floor == {"speculation": "chain"}:
            return "off_chain"
        return "off_floor"

    @property
    def draft_model(self) -> bool:
        """DFlash and DDTree run a separate DFlash draft model."""
        return self.server.get("speculation") in DRAFT_MODEL_SPECULATIONS

    @property
    def ddtree(self) -> bool:
        return self.server.get("speculation") == DDTREE

    def pairs(self) -> dict[str, tuple[str, str]]:
        pairs = {"graphs": ("off", "validate")}
        if self.eager_pair:
            pairs["eager"] = ("off_eager", "validate_eager")
        if self.chain_pair:
            pairs["chain graphs"] = ("off_chain", "validate_chain")
        return pairs


# A ragged batch whose longest row takes the batched verify 45k tokens deep.
LONG_BATCH = (17, 40, 64, 96, 128, 200, 333, 45000)
# Kimi K2's rank: 163,840-token embeddings and heads make its 4-layer servers 5.8 GiB of weights
# with the DFlash draft and 10.0 with EAGLE's NextN (which loads its own), so uncapped fractions
# sized for an H200 left an H100's later starts no room (e2e 43: "raise above 0.299"). Capped,
# SGLang sizes a pool before capture as min(cap, P x f - W) and never shrinks it after (the
# memory plan's reading, docs/development.md), so f only has to give the last server, starting
# with the least free (P), its cap: the gated DDTree family's fifth server, its EAGLE floor,
# finds about 77.85 - 4 x (5.8 + 1.6 + G) GiB free on an H100, and 0.5 x that covers its 10.3
# GiB for G (graphs, activations, context) up to 6.9; its five servers hold about
# 4 x (7.4 + G) + (10.3 + G) GiB, which an H100 holds for G up to 7 (at 3 they leave 23 GiB free).
# The EAGLE family (`kimi`) stays uncapped at the preset's fraction, on an H200.
KIMI_RANK_FAMILY_GIB = 79  # an 80 GB H100's 79.6 GiB
KIMI_RANK_CAPPED_FRACTION = 0.5
KIMI_RANK_UNCAPPED_GIB = 120


# The rank and kimi-rank models' attention outputs are larger than O(1): their largest
# |kernel - triton| is 2**-5 (e2e 50, 53 and 58, budgets 16 and 64, graphs and eager), one bf16
# step for |o| in [4, 8). Every element stays inside the backend's tolerance, whose atol scales
# with the values' size (on kimi-rank at budget 64 a fixed atol counted 651 of 569M, e2e 58;
# scaled, none, e2e 60).
RANK_VALIDATE_MAX_ABS = 2**-5


def _ddtree_validate_only(preset: str, budget: int, mem_fraction: float = 0.2, **more) -> E2EConfig:
    """DDTree at ``budget`` on ``preset``, checked for validate == off alone (four servers, no
    gate), graphs and eager, on the batch that reaches 45k tokens."""
    return E2EConfig(
        preset,
        {"speculation": "ddtree", "budget": budget},
        mem_fraction=mem_fraction,
        gate=False,
        batch_lengths=LONG_BATCH,
        **more,
    )


CONFIGS = {
    "eagle": E2EConfig("tiny", {}, chain_pair=True, floor={"speculation": "chain"}),
    "eagle-fp8": E2EConfig("tiny", {"kv_dtype": "fp8_e4m3"}, floor={"speculation": "chain"}),
    # The DFlash draft's weights count against the static fraction: 0.07 leaves no KV cache.
    "dflash": E2EConfig(
        "tiny", {"speculation": "dflash"}, mem_fraction=0.09, floor={"speculation": "chain"}
    ),
    # DDTree: DFlash's draft turned into a tree of `budget` nodes, verified with the tree mask.
    "ddtree": E2EConfig(
        "tiny",
        {"speculation": "ddtree", "budget": 16},
        mem_fraction=0.09,
        floor={"speculation": "chain"},
    ),
    "ddtree-64": E2EConfig(
        "tiny",
        {"speculation": "ddtree", "budget": 64},
        mem_fraction=0.09,
        floor={"speculation": "chain"},
    ),
    # DDTree on the rank model (DeepSeek-V3's attention) at budgets 16 and 64, and on Kimi K2's
    # rank at 16 (its gate runs at 64, below): validate == off on the 45k batch.
    "ddtree-rank": _ddtree_validate_only("rank", 16, validate_max_abs=RANK_VALIDATE_MAX_ABS),
    "ddtree-rank-64": _ddtree_validate_only("rank", 64, validate_max_abs=RANK_VALIDATE_MAX_ABS),
    "ddtree-kimi-16": _ddtree_validate_only(
        "kimi-rank",
        16,
        validate_max_abs=RANK_VALIDATE_MAX_ABS,
        mem_fraction=KIMI_RANK_CAPPED_FRACTION,
        min_gpu_gib=KIMI_RANK_FAMILY_GIB,
        kv_cap=True,
    ),
    # Its eager pair at 64 (the gated family below runs five servers and no eager pair).
    "ddtree-kimi-64": _ddtree_validate_only(
        "kimi-rank",
        64,
        validate_max_abs=RANK_VALIDATE_MAX_ABS,
        mem_fraction=KIMI_RANK_CAPPED_FRACTION,
        min_gpu_gib=KIMI_RANK_FAMILY_GIB,
        kv_cap=True,
    ),
    # DDTree on Kimi K2's rank at budget 64, one batch reaching 45k tokens beside short rows.
    "ddtree-kimi": E2EConfig(
        "kimi-rank",
        {"speculation": "ddtree", "budget": 64},
        eager_pair=False,
        validate_max_abs=RANK_VALIDATE_MAX_ABS,
        mem_fraction=KIMI_RANK_CAPPED_FRACTION,
        min_gpu_gib=KIMI_RANK_FAMILY_GIB,
        kv_cap=True,
        floor={"speculation": "chain"},
        policy=MODELS / "parity_policy_kimi_rank.yaml",
        batch_lengths=LONG_BATCH,
    ),
    "kimi": E2EConfig(
        "kimi-rank",
        {},
        eager_pair=False,
        mem_fraction=PRESET_MEM_FRACTION["kimi-rank"],
        min_gpu_gib=KIMI_RANK_UNCAPPED_GIB,
        floor={"speculation": "chain"},
        policy=MODELS / "parity_policy_kimi_rank.yaml",
    ),
}
CONFIG_NAME = os.environ.get("KDTREE_E2E_CONFIG", "eagle")
if CONFIG_NAME not in CONFIGS:
    raise pytest.UsageError(f"KDTREE_E2E_CONFIG={CONFIG_NAME!r}: choose from {sorted(CONFIGS)}")
CONFIG = CONFIGS[CONFIG_NAME]
PAIRS = CONFIG.pairs()
VALIDATE_SERVERS = [validate for _, validate in PAIRS.values()]
FP8 = CONFIG.server.get("kv_dtype") == "fp8_e4m3"
# Per-layer |kernel - triton| bound on the outputs the backend compares: the family's own, else
# the backend's tolerance for the pool's dtype (bf16 outputs of O(1); an fp8 pool's e4m3
# rounding steps).
VALIDATE_MAX_ABS = CONFIG.validate_max_abs or (FP8_POOL_ATOL if FP8 else BF16_POOL_ATOL)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    configured = os.environ.get("KDTREE_E2E_OUT")
    path = Path(configured) if configured else tmp_path_factory.mktemp("e2e")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[int, tuple[Path, Path | None]]:
    """Seed -> (target directory, its DFlash draft or None)."""
    # Before the models are written: a card too small for the family's servers fails here.
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if total_gib < CONFIG.min_gpu_gib:
        pytest.fail(
            f"KDTREE_E2E_CONFIG={CONFIG_NAME} needs {CONFIG.min_gpu_gib} GiB of GPU memory for its "
            f"servers at once; {torch.cuda.get_device_name()} has {total_gib:.0f} GiB",
            pytrace=False,
        )
    made = {}
    for seed in (0, 1) if CONFIG.gate else (0,):  # seed 1: the gate's candidate of other weights
        path = tmp_path_factory.mktemp(f"{CONFIG.preset}_seed{seed}")
        make_model.write_model(path, CONFIG.preset, seed=seed, device="cuda")
        draft = None
        if CONFIG.draft_model:
            draft = tmp_path_factory.mktemp(f"{CONFIG.preset}_seed{seed}_dflash")
            make_dflash_draft.write_draft(path, draft, seed=seed)
        made[seed] = (path, draft)
    # The servers size themselves from the free memory: give back the writer's cached blocks.
    torch.cuda.empty_cache()
    return made


# The most tokens a request of this file generates (the DDTree accept test's; the policies' 48).
MAX_NEW_TOKENS = 64


def family_kv_cap(verify_width: int) -> int:
    """A capped pool for a server verifying ``verify_width`` tokens a step: the ragged batch, the
    largest set of requests held at once (every other request runs alone and is shorter), with
    its generations and speculative slots, plus kv_pool_cap's slack."""
    lengths = CONFIG.batch_lengths
    return kv_pool_cap(sum(kv_tokens_needed(1, n, MAX_NEW_TOKENS, verify_width) for n in lengths))


def _specs(models: dict[int, tuple[Path, Path | None]]) -> list[ServerSpec]:
    def spec(name, mode, seed=0, **kw) -> ServerSpec:
        # Publish the comparison every 10 steps, so a short run publishes several windows.
        env = {"KDTREE_VALIDATE_EVERY": "10"}
        target, draft = models[seed]
        server = {**CONFIG.server, **kw}
        made = ServerSpec(
            name,
            mode,
            target,
            # An EAGLE server of a DFlash family (its floor) speculates with the target's own
            # draft layer, not the DFlash draft.
            draft=draft if server.get("speculation") in DRAFT_MODEL_SPECULATIONS else None,
            radix_cache=False,
            mem_fraction=CONFIG.mem_fraction,
            env=env,
            **server,
        )
        if not CONFIG.kv_cap:
            return made
        return dataclasses.replace(made, kv_tokens=family_kv_cap(made.verify_width))

    specs = [spec("off", "off")]
    if CONFIG.gate:  # the parity gate's three first, in the first wave of starts
        specs += [spec("on", "on"), spec("on_seed1", "on", seed=1)]
    specs.append(spec("validate", "validate"))
    if CONFIG.floor_server == "off_floor":
        specs.append(spec("off_floor", "off", **CONFIG.floor))
    if CONFIG.eager_pair:
        specs += [
            spec("off_eager", "off", cuda_graphs=False),
            spec("validate_eager", "validate", cuda_graphs=False),
        ]
    if CONFIG.chain_pair:
        specs += [
            spec("off_chain", "off", speculation="chain"),
            spec("validate_chain", "validate", speculation="chain"),
        ]
    return specs


@pytest.fixture(scope="module")
def servers(models, out_dir):
    # All at once behind start gates (the speed harness's start, e2e 49 and 51): the imports
    # overlap, and each server measures the GPU's free memory only once the one before holds its
    # pools, so no start sees another's allocation in flight.
    running, failed = start_all(_specs(models), out_dir, timeout_s=420, pools_wait_s=POOLS_WAIT_S)
    yield running, failed
    for name, server in running.items():
        with contextlib.suppress(OSError):
            (out_dir / f"metrics_{name}.txt").write_text(server.get("/metrics"))
    stop_all(running)


def _requests() -> tuple[list[CorpusEntry], list[CorpusEntry]]:
    """(one-at-a-time entries, the batch-8 entries).

    One at a time: 12 prompts of the short corpus and two long input_ids prompts. The batch: 8
    input_ids prompts of the family's ``batch_lengths``, because SGLang hands a batch of token ids to its scheduler in one message
    (a batch of texts goes one request at a time, so which of them share the first prefill, and
    so its numerics, would depend on timing).
    """
    corpus = list(load_corpus("short").entries)
    long_prompts = [
        CorpusEntry(id=f"ids-{n}", input_ids=tuple(2 + (i * 7 + n) % 4000 for i in range(n)))
        for n in (1024, 8192)
    ]
    batch = [
        CorpusEntry(
            id=f"batch-{b}", input_ids=tuple(2 + (i * 13 + 97 * b) % 4000 for i in range(n))
        )
        for b, n in enumerate(CONFIG.batch_lengths)
    ]
    return corpus[:12] + long_prompts, batch


def _replay(server, entries, batch_entries, replay) -> list[dict]:
    """Greedy generations of ``entries`` one by one, then of ``batch_entries`` in one call."""
    results = []
    for entry in entries:
        answer = server.post("/generate", build_generate_request(entry, replay))
        results.append({"id": entry.id, **parse_generate_response(answer).to_json()})
    body = build_generate_request(batch_entries[0], replay)
    body["input_ids"] = [list(e.input_ids) for e in batch_entries]
    answers = server.post("/generate", body)
    for entry, answer in zip(batch_entries, answers, strict=True):
        results.append({"id": entry.id, "batch": 8, **parse_generate_response(answer).to_json()})
    return results


def _replay_or_error(server, entries, batch_entries, replay) -> list[dict] | str:
    try:
        return _replay(server, entries, batch_entries, replay)
    except (RuntimeError, OSError, ValueError) as error:  # one server's failure is its own
        return f"{type(error).__name__}: {error}"


@pytest.fixture(scope="module")
def generations(servers, out_dir) -> dict[str, list[dict] | str]:
    """Each pair server's generations, or why its replay failed."""
    running, _ = servers
    replay = load_policy(CONFIG.policy).policy.replay
    entries, batch_entries = _requests()
    names = sorted({n for pair in PAIRS.values() for n in pair} & set(running))
    with ThreadPoolExecutor(len(names) or 1) as pool:
        futures = {
            n: pool.submit(_replay_or_error, running[n], entries, batch_entries, replay)
            for n in names
        }
        results = {n: f.result() for n, f in futures.items()}
    for name, got in results.items():
        (out_dir / f"generations_{name}.json").write_text(json.dumps(got) + "\n")
    return results


@pytest.fixture(scope="module")
def record(out_dir):
    """correctness.json: what each check found, written when the module ends."""
    found: dict = {"config": CONFIG_NAME, "family": dataclasses.asdict(CONFIG)}
    yield found
    (out_dir / "correctness.json").write_text(json.dumps(found, indent=2, default=str) + "\n")


def test_every_server_started(servers, record) -> None:
    running, failed = servers
    record["started"] = {n: s.ready_after_s for n, s in running.items()}
    record["failed_to_start"] = {n: why[-2000:] for n, why in failed.items()}
    assert not failed, f"servers that did not start: {sorted(failed)}"


def served(generation: dict) -> dict:
    """A generation record without its timing: the tokens, logprobs, texts and finish reason."""
    return {k: v for k, v in generation.items() if k != "timing"}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_validate_serves_exactly_what_off_serves(pair, generations, record) -> None:
    off_name, validate_name = PAIRS[pair]
    missing = [n for n in (off_name, validate_name) if n not in generations]
    assert not missing, f"not running: {missing}"
    off, validate = generations[off_name], generations[validate_name]
    for name, got in ((off_name, off), (validate_name, validate)):
        assert not isinstance(got, str), f"{name}: {got}"
    assert len(off) == len(validate) > 0
    assert all(len(g["output_ids"]) > 0 for g in off), "off served an empty generation"
    # Everything served but the wall-clock timing, which no two servers share.
    differing = [a["id"] for a, b in zip(off, validate, strict=True) if served(a) != served(b)]
    record.setdefault("validate_identical_to_off", {})[pair] = {
        "requests": len(off),
        "differing": differing,
        "logs": [f"generations_{off_name}.json", f"generations_{validate_name}.json"],
    }
    assert not differing, f"validate differs from off for {differing}"


def _forward_metrics(values: dict, prefix: str) -> dict:
    """One served forward's figures (``prefix``: kdtree_verify or kdtree_draft_extend)."""
    replays = metric_sum(values, f"{prefix}_graph_replays_total")
    return {
        "steps_eager": metric_sum(values, f"{prefix}_steps_total") - replays,
        "steps_replay": replays,
        "kernel_calls": metric_sum(values, f"{prefix}_kernel_calls_total"),
        "fallbacks": {
            labels["reason"]: v for labels, v in values.get(f"{prefix}_fallbacks_total", []) if v
        },
        "max_abs_error": {
            labels["layer"]: v for labels, v in values.get(f"{prefix}_max_abs_error", [])
        },
        # fp8 pool under validate: each side's distance from the exact computation
        "max_abs_error_vs_exact": {
            f"{labels['side']}/{labels['layer']}": v
            for labels, v in values.get(f"{prefix}_max_abs_error_vs_exact", [])
        },
        "over_tolerance": metric_sum(values, f"{prefix}_over_tolerance_total"),
        "compared_elements": metric_sum(values, f"{prefix}_compared_elements_total"),
    }


# EAGLE's draft runs the draft extend over the MLA prefix (the kernel serves it too); DFlash's
# (and so DDTree's) draft is an MHA model with its own cache, which stays on SGLang's Triton kernel.
FORWARDS = ["kdtree_verify"] if CONFIG.draft_model else ["kdtree_verify", "kdtree_draft_extend"]


@pytest.mark.parametrize("name", VALIDATE_SERVERS)
@pytest.mark.parametrize("prefix", FORWARDS)
def test_validate_metrics(name, prefix, servers, generations, record) -> None:
    running, _ = servers
    found = _forward_metrics(metric_values(running[name].get("/metrics")), prefix)
    record.setdefault("validate_metrics", {}).setdefault(name, {})[prefix] = {
        **found,
        "log": f"metrics_{name}.txt",
    }
    assert found["steps_eager"] > 0, "no eager step was counted"
    if running[name].spec.cuda_graphs:
        assert found["steps_replay"] > 0, "no step was counted on a CUDA-graph replay"
    assert found["kernel_calls"] > 0 and found["compared_elements"] > 0
    assert not found["fallbacks"], f"fallbacks: {found['fallbacks']}"
    max_abs = found["max_abs_error"]
    assert max_abs and all(v <= VALIDATE_MAX_ABS for v in max_abs.values()), max_abs
    assert found["over_tolerance"] == 0
    if FP8:
        # The matching numerics: the kernel sits far closer to Triton than either is to exact.
        vs_exact = found["max_abs_error_vs_exact"]
        for layer, diff in max_abs.items():
            assert diff <= 0.5 * vs_exact[f"triton/{layer}"], (layer, diff, vs_exact)


if CONFIG.draft_model:  # (EAGLE's draft extend is checked by test_validate_metrics)

    def test_dflash_draft_attention_stays_stock(servers, generations, record) -> None:
        """The DFlash draft's attention is MHA over its own cache, not the MLA pool: our backend
        in its runner serves no forward."""
        running, _ = servers
        values = metric_values(running["validate"].get("/metrics"))
        found = _forward_metrics(values, "kdtree_draft_extend")
        record["dflash_draft"] = found
        assert found["steps_eager"] == 0 and found["steps_replay"] == 0, found
        assert found["kernel_calls"] == 0, found


def test_plugin_runs_in_the_scheduler_process(servers, record) -> None:
    running, _ = servers
    server = running["validate"]
    lines = [
        line for line in server.log_text().splitlines() if "kdtree verify backend (target)" in line
    ]
    pids = {int(m.group(1)) for line in lines if (m := re.search(r"\bpid (\d+)\b", line))}
    record["plugin"] = {
        "lines": lines[:4],
        "launcher_pid": server.proc.pid,
        "backend_pids": sorted(pids),
    }
    assert lines, "the backend never logged from any process"
    assert pids and server.proc.pid not in pids, "the backend ran in the launcher, not a scheduler"


def _parity(
    candidate: str, servers, out_dir: Path, record, baseline: str = "off"
) -> tuple[int, dict]:
    running, _ = servers
    parity_out = out_dir / "parity"
    command = [
        shutil.which("kdtree-parity") or "kdtree-parity",
        "run",
        "--baseline",
        running[baseline].url,
        "--candidate",
        running[candidate].url,
        "--corpus",
        "short",
        "--policy",
        str(CONFIG.policy),
        "--out",
        str(parity_out),
        "--db",
        str(parity_out / "parity.sqlite3"),
        "--no-progress",
        *(
            ["--floor", running[CONFIG.floor_server].url]
            if CONFIG.floor_server and CONFIG.floor_server not in (baseline, candidate)
            else []
        ),
    ]
    parity_out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    log = parity_out / f"parity_{candidate}.log"
    log.write_text(f"$ {' '.join(command)}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}")
    reports = sorted(parity_out.glob("*/report.json"), key=lambda p: p.stat().st_mtime)
    report = json.loads(reports[-1].read_text()) if reports else {}
    record.setdefault("parity", {})[f"{candidate} vs {baseline}"] = {
        "exit": done.returncode,
        "verdict": report.get("verdict", {}).get("status"),
        "report": str(reports[-1].relative_to(out_dir)) if reports else None,
        "log": str(log.relative_to(out_dir)),
    }
    return done.returncode, report


if CONFIG.gate:

    def test_parity_gate_passes_the_kernel_candidate(servers, out_dir, record) -> None:
        code, report = _parity("on", servers, out_dir, record)
        assert report, "no report.json was written"
        assert (code, report["verdict"]["status"]) == (0, "pass"), report["verdict"]

    def test_parity_gate_fails_a_candidate_with_other_weights(servers, out_dir, record) -> None:
        code, report = _parity("on_seed1", servers, out_dir, record)
        assert report, "no report.json was written"
        assert (code, report["verdict"]["status"]) == (1, "fail"), report["verdict"]


if CONFIG.ddtree:

    def test_ddtree_accepts_draft_tokens(servers, record) -> None:
        """The tree verify commits more than one token per step: the draft's tree is used."""
        running, _ = servers
        prompt = [2 + (i * 7) % 4000 for i in range(256)]
        body = {
            "input_ids": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS},
        }
        found = {}
        for name in ("off", "on" if CONFIG.gate else "validate"):
            meta = running[name].post("/generate", body)["meta_info"]
            found[name] = {
                "completion_tokens": meta["completion_tokens"],
                "spec_verify_ct": meta.get("spec_verify_ct"),
            }
        record["ddtree_accept"] = found
        for name, got in found.items():
            assert got["spec_verify_ct"], (name, got)
            assert got["completion_tokens"] / got["spec_verify_ct"] > 1.0, (name, got)

    if CONFIG.floor_server is not None:

        def test_ddtree_is_lossless_against_eagles_chain(servers, out_dir, record) -> None:
            """Greedy tokens do not depend on the draft: DDTree's off against EAGLE's chain off (the
            floor server) diverges only at near-ties of the two verify numerics."""
            code, report = _parity("off", servers, out_dir, record, baseline=CONFIG.floor_server)
            assert report, "no report.json was written"
            candidate = report["summary"]["candidate"]
            record["ddtree_vs_eagle_chain"] = {
                "exit": code,
                "hard": candidate["hard"],
                "near_tie": candidate["near_tie"],
                "exact": candidate["exact"],
                "compared": candidate["compared"],
            }
            assert candidate["hard"] == 0, record["ddtree_vs_eagle_chain"]
