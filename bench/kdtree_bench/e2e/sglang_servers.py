"""Real SGLang servers started as a user starts them (``kdtree-serve ...``), on loopback.

Used by ``bench/kdtree_bench/e2e/sglang_e2e.py`` and ``tests/gpu/test_sglang_e2e.py``. A server is one
``kdtree-serve`` process (which becomes ``python -m sglang.launch_server``) in a session of its
own; SGLang's scheduler and detokenizer are its children. ``stop`` sends SIGTERM to that pid
(SGLang then ends its children), and kills the whole session only if it is still there after the
grace period, so nothing outlives a run.

The servers' flags are SGLang 0.5.23's: EAGLE with a draft tree (``topk`` > 1) or a chain
(``topk`` 1), or DFlash (``--speculative-algorithm DFLASH``: a separate draft model, one block of
``block_size`` tokens verified causally per step, its draft attending to the whole context or,
with ``draft_window``, to SGLang's compact draft cache of the last tokens); the KV cache in the
model's dtype or FP8 (``--kv-cache-dtype fp8_e4m3``); decode CUDA graphs up to
``--cuda-graph-max-bs-decode`` (larger batches run eagerly, which is how one server exercises both
paths), prefill graphs off (their capture of up to 8,192 tokens would cost minutes at start).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdtree_inference.engine.launch import LOOPBACK, free_port, health_status

READY_LINE = re.compile(r"^\[e2e\] (\S+) ready after ([0-9.]+) s", re.MULTILINE)
"""The line a server's start prints once it answers (``_ready``): name, seconds."""
POOLS_ALLOCATED = re.compile(r"Capture .*CUDA graph begin|max_total_num_tokens=")
"""SGLang 0.5.23's first log line once a server holds its memory pools: its first CUDA graph
capture, or (eager, or after the captures) the scheduler's summary. From then on it allocates
little, so another server's start-time memory profile no longer races it."""

SPECULATION = {
    # EAGLE's draft tree: 3 draft steps, top-4 per step, 8 tokens verified per step.
    "tree": (
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
        "--speculative-num-draft-tokens",
        "8",
    ),
    # A chain: one candidate per step, 3 steps, so 4 tokens verified.
    "chain": (
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ),
}
TP_ENV = {
    # NVLink multicast (NVLS) stays off for tensor parallelism on the lent multi-GPU machines.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
GRAPH_MAX_BS = 4
"""Decode graphs cover batches 1-4 by default; batch 8 then runs eagerly on the same server."""
DFLASH = "dflash"
DDTREE = "ddtree"
SPEC_FAMILY = {"tree": "eagle", "chain": "eagle", DFLASH: "dflash", DDTREE: "ddtree"}
"""Speculation -> the algorithm family a record names (``spec``)."""
DRAFT_MODEL_SPECULATIONS = (DFLASH, DDTREE)
"""Speculations that run a separate DFlash draft model."""
DRAFT_ATTENTION_BACKENDS = (
    "flashinfer",
    "fa3",
    "fa4",
    "triton",
    "ascend",
    "trtllm_mha",
    "intel_xpu",
)
"""SGLang 0.5.23's choices for ``--speculative-draft-attention-backend`` (the draft model's
attention; unset, SGLang picks it)."""
DDTREE_BUDGET = 16
# --mem-fraction-static for a preset whose weights ServerSpec's default fraction cannot hold:
# kimi-rank's target and its NextN draft carry 163,840-token embeddings and heads, which SGLang
# counts against the fraction; 0.16 of an H200 holds them with KV room (its correctness families).
PRESET_MEM_FRACTION = {"kimi-rank": 0.16}
POOLS_WAIT_S = 300.0
"""How long a start gate waits at most for the server before to hold its memory pools."""
KV_DTYPES = {"bfloat16": (), "fp8_e4m3": ("--kv-cache-dtype", "fp8_e4m3")}
"""KV cache dtype -> SGLang's flags (bfloat16 is the model's dtype, SGLang's default)."""
DFLASH_BLOCK_SIZE = 16


def sigint_interrupts() -> None:
    """Make SIGINT raise KeyboardInterrupt in this process even if it started with SIGINT ignored
    (a background job of a non-interactive shell inherits that, and Python then installs no
    handler): the device scripts stop a run with ``timeout -s INT`` so that its servers stop
    and what it measured is written. Call it once, from a command's entry point."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


class ServerFailed(RuntimeError):
    """A server exited, or did not become healthy, before it was ready."""


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration: what a user would put on the command line."""

    name: str
    mode: str  # KDTREE_VERIFY: off | validate | on
    model: Path
    speculation: str = "tree"  # tree | chain (EAGLE) | dflash | ddtree
    draft: Path | None = None  # the DFlash draft model directory (dflash and ddtree only)
    block_size: int = DFLASH_BLOCK_SIZE  # DFlash: tokens verified per step
    draft_window: int | None = None  # DFlash: the draft attends to this many last tokens
    budget: int = DDTREE_BUDGET  # DDTree: draft-tree nodes verified per step
    draft_attention: str | None = None  # dflash, ddtree: the draft's attention backend
    kv_dtype: str = "bfloat16"  # or fp8_e4m3
    cuda_graphs: bool = True
    radix_cache: bool = True
    mem_fraction: float = 0.08
    tp: int = 1
    graph_max_bs: int = GRAPH_MAX_BS  # decode graphs cover batches 1..graph_max_bs
    kv_tokens: int | None = None  # the KV pool's cap (--max-total-tokens); None: SGLang's sizing
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.speculation not in SPEC_FAMILY:
            raise ValueError(
                f"{self.name}: speculation {self.speculation!r}; choose from {sorted(SPEC_FAMILY)}"
            )
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(
                f"{self.name}: kv_dtype {self.kv_dtype!r}; choose from {sorted(KV_DTYPES)}"
            )
        if (self.speculation in DRAFT_MODEL_SPECULATIONS) != (self.draft is not None):
            raise ValueError(
                f"{self.name}: a draft model goes with dflash and ddtree, and only with them"
            )
        if self.draft_attention is not None:
            if self.speculation not in DRAFT_MODEL_SPECULATIONS:
                raise ValueError(
                    f"{self.name}: a draft attention backend is for a draft model (dflash, "
                    f"ddtree); {self.speculation} has none"
                )
            if self.draft_attention not in DRAFT_ATTENTION_BACKENDS:
                raise ValueError(
                    f"{self.name}: draft attention backend {self.draft_attention!r}; choose "
                    f"from {list(DRAFT_ATTENTION_BACKENDS)}"
                )
        if self.budget < 1:
            raise ValueError(f"{self.name}: budget must be at least 1, got {self.budget}")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(f"{self.name}: kv_tokens must be at least 1, got {self.kv_tokens}")
        if self.block_size < 2:
            raise ValueError(f"{self.name}: block_size must be at least 2, got {self.block_size}")
        if self.draft_window is not None:
            if self.speculation != DFLASH:
                raise ValueError(f"{self.name}: a draft window goes with dflash, and only with it")
            if self.draft_window < self.block_size:  # SGLang refuses it at start otherwise
                raise ValueError(
                    f"{self.name}: draft_window {self.draft_window} is smaller than the block "
                    f"({self.block_size})"
                )

    @property
    def spec(self) -> str:
        """The speculative algorithm's family: eagle or dflash."""
        return SPEC_FAMILY[self.speculation]

    @property
    def verify_width(self) -> int:
        """Tokens verified per request and step: SGLang's --speculative-num-draft-tokens."""
        return verify_width(self.speculation, self.block_size, self.budget)

    def draft_attention_flags(self) -> list[str]:
        """SGLang's flag for the draft model's attention backend, where one is set."""
        if self.draft_attention is None:
            return []
        return ["--speculative-draft-attention-backend", self.draft_attention]

    def speculative_flags(self) -> list[str]:
        if self.speculation == DDTREE:
            # The verify width is the tree's nodes and its root; the draft's block comes from
            # its config. DDTree runs without overlap scheduling.
            return [
                "--speculative-algorithm",
                "DDTREE",
                "--speculative-draft-model-path",
                str(self.draft),
                "--speculative-num-draft-tokens",
                str(self.verify_width),
                "--disable-overlap-schedule",
                *self.draft_attention_flags(),
            ]
        if self.speculation != DFLASH:
            return ["--speculative-algorithm", "EAGLE", *SPECULATION[self.speculation]]
        # DFLASH forces num_steps and eagle_topk to 1 itself; the block is the verify width.
        return [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            str(self.draft),
            "--speculative-num-draft-tokens",
            str(self.block_size),
            *(
                ["--speculative-draft-window-size", str(self.draft_window)]
                if self.draft_window is not None
                else []
            ),
            *self.draft_attention_flags(),
        ]

    def flags(self, port: int) -> list[str]:
        """SGLang's arguments for this configuration (kdtree-serve passes them through)."""
        graphs = (
            ["--cuda-graph-max-bs-decode", str(self.graph_max_bs)]
            if self.cuda_graphs
            else ["--cuda-graph-backend-decode", "disabled"]
        )
        return [
            "--model-path",
            str(self.model),
            "--dtype",
            "bfloat16",
            "--attention-backend",
            "triton",
            "--sampling-backend",
            "pytorch",
            "--grammar-backend",
            "none",
            "--moe-runner-backend",
            "triton",
            "--mem-fraction-static",
            str(self.mem_fraction),
            *self.speculative_flags(),
            *KV_DTYPES[self.kv_dtype],
            *graphs,
            "--cuda-graph-backend-prefill",
            "disabled",
            *([] if self.radix_cache else ["--disable-radix-cache"]),
            *(["--tp-size", str(self.tp)] if self.tp > 1 else []),
            *(["--max-total-tokens", str(self.kv_tokens)] if self.kv_tokens else []),
            "--enable-metrics",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            *self.extra,
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "model": self.model.name,
            "spec": self.spec,
            "speculation": self.speculation,
            **(
                {
                    "draft": self.draft.name,
                    "block_size": self.block_size,
                    "draft_window": self.draft_window,
                    "draft_attention": self.draft_attention,
                }
                if self.speculation == DFLASH
                else {}
            ),
            **(
                {
                    "draft": self.draft.name,
                    "budget": self.budget,
                    "draft_attention": self.draft_attention,
                }
                if self.speculation == DDTREE
                else {}
            ),
            "kv_dtype": self.kv_dtype,
            **({"extra_args": " ".join(self.extra)} if self.extra else {}),
            "cuda_graphs": self.cuda_graphs,
            "graph_max_bs": self.graph_max_bs if self.cuda_graphs else 0,
            "radix_cache": self.radix_cache,
            "tp": self.tp,
            **({"kv_tokens": self.kv_tokens} if self.kv_tokens else {}),
        }


def verify_width(
    speculation: str, block_size: int = DFLASH_BLOCK_SIZE, budget: int = DDTREE_BUDGET
) -> int:
    """Tokens a ``speculation`` (tree, chain, dflash, ddtree) verifies per request and step."""
    if speculation == DDTREE:
        return budget + 1
    if speculation == DFLASH:
        return block_size
    flags = SPECULATION[speculation]
    return int(flags[flags.index("--speculative-num-draft-tokens") + 1])


def kv_tokens_needed(batch: int, prompt: int, new_tokens: int, verify_width: int) -> int:
    """KV slots ``batch`` requests of ``prompt`` tokens hold while they generate ``new_tokens``:
    the prompt, the output, and the slots a speculative step reserves (twice the verify width:
    the step's draft and the one queued behind it)."""
    return batch * (prompt + new_tokens + 2 * verify_width)


def kv_pool_cap(needed: int) -> int:
    """A KV pool's cap for a run whose largest shape needs ``needed`` slots: a tenth more and at
    least 4,096 (page rounding, the chunked prefill's last chunk, SGLang's own reserve), so the
    pool holds what the run needs and leaves the rest of the card to the servers beside it."""
    return needed + max(4096, -(-needed // 10))


def kdtree_serve() -> str:
    """The ``kdtree-serve`` launcher on PATH (the kdtree-inference package's console script)."""
    found = shutil.which("kdtree-serve")
    if found is None:
        raise ServerFailed(
            "kdtree-serve is not on PATH: install services/inference (pip install "
            "./services/inference) and put its scripts directory on PATH"
        )
    return found


class SGLangServer:
    """A running ``kdtree-serve`` for one :class:`ServerSpec`; its log is ``log_path``. With a
    ``gate`` its scheduler waits for that file before it touches the GPU (``KDTREE_START_GATE``,
    ``kdtree_inference.sglang.start_gate``): ``open_gate`` lets it on."""

    def __init__(
        self, spec: ServerSpec, log_dir: Path, port: int | None = None, gate: Path | None = None
    ) -> None:
        self.spec = spec
        self.gate = gate
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_dir / f"server_{spec.name}.log"
        self.command = [kdtree_serve(), *spec.flags(self.port)]
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **(TP_ENV if spec.tp > 1 else {}),
            **spec.env,
            "KDTREE_VERIFY": spec.mode,
            **({"KDTREE_START_GATE": str(gate)} if gate else {}),
        }
        with self.log_path.open("wb") as log:
            log.write(f"$ KDTREE_VERIFY={spec.mode} {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.started = time.monotonic()
        self.ready_after_s: float | None = None

    def open_gate(self) -> None:
        """Let the scheduler on to its memory measurement (nothing without a gate)."""
        if self.gate is not None:
            self.gate.touch()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_pools(self, timeout_s: float) -> bool:
        """Until the log shows ``POOLS_ALLOCATED``, the server answers or it exits (True), or
        ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (
                self.proc.poll() is not None
                or POOLS_ALLOCATED.search(self.log_text())
                or health_status(self.url) == 200
            ):
                return True
            time.sleep(0.5)
        return False

    def wait_ready(self, timeout_s: float) -> float:
        """Until /health answers 200; returns the seconds it took. Raises ServerFailed."""
        while (took := self.check_ready(timeout_s)) is None:
            time.sleep(1.0)
        return took

    def check_ready(self, timeout_s: float) -> float | None:
        """One look: the seconds since the start if /health answers 200 (the first such look is
        kept as ``ready_after_s``), else None. Raises ServerFailed once the process has exited or
        ``timeout_s`` has passed since the start."""
        if self.proc.poll() is not None:
            raise ServerFailed(
                f"{self.spec.name}: exited with {self.proc.returncode} before ready; "
                f"last log lines:\n{self.log_text()[-3000:]}"
            )
        if health_status(self.url) == 200:
            if self.ready_after_s is None:
                self.ready_after_s = time.monotonic() - self.started
            return self.ready_after_s
        if time.monotonic() - self.started >= timeout_s:
            raise ServerFailed(f"{self.spec.name}: no healthy /health after {timeout_s:.0f} s")
        return None

    def get(self, path: str, timeout_s: float = 30.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:
            return resp.read().decode()

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
        return json.loads(self.post_text(path, body, timeout_s))

    def post_text(self, path: str, body: dict[str, Any], timeout_s: float = 600.0) -> str:
        """POST ``body`` as JSON; the answer's text (/start_profile answers in plain text)."""
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as error:
            raise RuntimeError(
                f"{self.spec.name} {path}: HTTP {error.code}: {error.read()[:500]!r}"
            ) from error

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the launcher's pid; SIGKILL to its whole session after ``grace_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # SGLang's children share the session; none may survive their launcher.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=grace_s)
        return self.proc.returncode


def start_all(
    specs: list[ServerSpec],
    log_dir: Path,
    timeout_s: float,
    retries: int = 1,
    stagger_s: float = 3.0,
    wave: int = 0,
    pools_wait_s: float = 0.0,
) -> tuple[dict[str, SGLangServer], dict[str, str]]:
    """Start the servers (they share the GPU) and wait for each.

    A starting SGLang server profiles the GPU's free memory and refuses to start when another
    process allocated in the meantime, so starts are ``stagger_s`` apart, at most ``wave``
    servers start together (0: all; the next wave starts once the previous one is ready), and a
    server that fails is started again (``retries`` times) once its wave has settled, one
    retried server at a time. With ``pools_wait_s`` the servers of a wave also take turns at
    that profile: each starts with a start gate (``SGLangServer``), so that its imports overlap
    the others' while its scheduler waits before touching the GPU, and each gate opens once the
    server before holds its memory pools (``SGLangServer.wait_pools``), or after ``pools_wait_s``
    at most. Returns the healthy servers and, by name, why each other one failed (that one is
    stopped).
    """
    servers: dict[str, SGLangServer] = {}
    failed: dict[str, str] = {}
    size = wave or len(specs)
    gates = log_dir / "gates"
    if pools_wait_s > 0:
        gates.mkdir(parents=True, exist_ok=True)
    try:
        for first in range(0, len(specs), size):
            group = specs[first : first + size]
            for spec in group:
                gate = None
                if pools_wait_s > 0:
                    gate = gates / spec.name
                    gate.unlink(missing_ok=True)  # an earlier run's, which would let it on at once
                servers[spec.name] = SGLangServer(spec, log_dir, gate=gate)
                time.sleep(stagger_s)
            if pools_wait_s > 0:
                _open_gates_in_turn([servers[spec.name] for spec in group], pools_wait_s)
            _wait_group(servers, [s.name for s in group], log_dir, timeout_s, retries, failed)
    except BaseException:
        stop_all(servers)
        raise
    return servers, failed


def _open_gates_in_turn(group: list[SGLangServer], pools_wait_s: float) -> None:
    """The first server's start gate at once; each next one's once the server before holds its
    memory pools, answers or exited, or after ``pools_wait_s``."""
    for index, server in enumerate(group):
        if index:
            before = group[index - 1]
            if not before.wait_pools(pools_wait_s):
                print(
                    f"[e2e] {before.spec.name}: no sign of its memory pools after "
                    f"{pools_wait_s:.0f} s; opening {server.spec.name}'s start gate anyway",
                    flush=True,
                )
        server.open_gate()


def _wait_group(
    servers: dict[str, SGLangServer],
    names: list[str],
    log_dir: Path,
    timeout_s: float,
    retries: int,
    failed: dict[str, str],
) -> None:
    """Wait for every server of the group; then start each one that failed again, one at a time:
    a retry that starts beside another start can fail the memory profile the same way."""
    pending = _await_ready([servers[name] for name in names], 1, timeout_s, failed)
    for attempt in range(2, retries + 2):
        again = []
        for name in pending:
            server = servers[name]
            server.log_path.rename(server.log_path.with_suffix(f".try{attempt - 1}.log"))
            servers[name] = SGLangServer(server.spec, log_dir)
            again += _await_ready([servers[name]], attempt, timeout_s, failed)
        pending = again
    for name in pending:
        del servers[name]


def _await_ready(
    group: list[SGLangServer], attempt: int, timeout_s: float, failed: dict[str, str]
) -> list[str]:
    """Look at every server of ``group`` in turn, once a second, until each answers or fails,
    so that each one's start time is its own, not when its turn to be waited for came. A failed
    one is stopped and why is kept in ``failed``; returns their names in the group's order (the
    order of the retries), whichever failed first."""
    waiting = list(group)
    while waiting:
        for server in list(waiting):
            name = server.spec.name
            try:
                took = server.check_ready(timeout_s)
            except ServerFailed as error:
                print(f"[e2e] {name} FAILED (try {attempt}): {str(error)[-1500:]}", flush=True)
                failed[name] = str(error)
                server.stop()
                waiting.remove(server)
                continue
            if took is not None:
                print(f"[e2e] {name} ready after {took:.0f} s at {server.url}", flush=True)
                failed.pop(name, None)
                waiting.remove(server)
        if waiting:
            time.sleep(1.0)
    # Each server of the group has now either answered (its name left ``failed``) or failed.
    return [server.spec.name for server in group if server.spec.name in failed]


def stop_all(servers: dict[str, SGLangServer]) -> None:
    for server in servers.values():
        server.stop()
