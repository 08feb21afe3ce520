"""The GPU-memory plan of the end-to-end speed table: for each row, the weights, the KV cache the
row's requests hold, and whether an `off` and an `on` server fit one GPU together.

Every row runs with `--kv-tokens auto`: each server's KV pool is capped (SGLang's
`--max-total-tokens`) at the row's need plus a tenth. SGLang 0.5.23 sizes a server's pool from
what is free when it starts (P), f being `--mem-fraction-static`: before graph capture the pool
is the smaller of the cap and P x f - W (W its weights, `_profile_available_bytes`); after
capture it is resized to what is free beyond P x (1 - f) plus the pool itself, so it never
shrinks (`kv_pool_runtime.compute_post_capture_kv_resize`). A capped server therefore holds its
weights, its pool K and its graphs, activations and CUDA context G, whatever f is; f only has to
give the pool its cap: P x f >= W + K for the smallest P a server of the row starts with, the
second of two once the first runs (P1 - W - K - G). The servers together must leave room for the
prefill's activations (`ACTIVATION_MARGIN_GIB`).

Weights are counted from the checkpoints the harness writes (`make_model`, `make_dflash_draft`),
KV from the pools' cell sizes (MLA: kv_lora + rope per layer; the DFlash draft's MHA: K and V of
hidden size per layer) for the capped pool. G is measured: 2.9 GiB per 61-layer DFlash-draft
server with graphs to batch 8 (e2e 55's logs); EAGLE's is bounded by the start that failed (the
room the second 61-layer server had at f 0.3 uncapped, where it found no KV room). The first run
of a row shows the real figure in its server log; G should then be replaced by it.

Usage: python -m kdtree_bench.e2e.memory_plan [--write]   (--write: refresh docs/development.md)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from kdtree_bench.e2e.sglang_servers import kv_pool_cap, kv_tokens_needed, verify_width
from kdtree_bench.models.make_dflash_draft import BLOCK_SIZE, draft_config
from kdtree_bench.models.make_model import model_config, model_weights

DOC = Path(__file__).resolve().parents[3] / "docs" / "development.md"
BEGIN, END = "<!-- memory-plan: begin -->", "<!-- memory-plan: end -->"

GIB = 1 << 30
FREE_AT_START_GIB = 138.07
"""An H200's free memory when the first server starts: SGLang's "avail mem" before loading
weights, in the logs of e2e 36 and 40 (bench/results/sglang_e2e/run36, run40)."""

FREE_AT_START_H100_GIB = 77.85
"""An H100's, in e2e 46's first server log (bench/results/sglang_e2e/run46)."""
STARTED_SERVER_OVERHEAD_GIB = 1.23
"""What a started 4-layer server holds beyond its static share (graphs, activations, CUDA's
context): in e2e 42's logs an H200 had 139.13 GiB free before the first server (f 0.12: a static
share of 16.70) and 121.20 before the second."""
GROUP_CARDS = {"H100": FREE_AT_START_H100_GIB, "H200": FREE_AT_START_GIB}
GROUP_SIZES = (2, 4, 6, 8)
"""Servers a speed run starts together: an off and an on per DDTree budget or algorithm."""

TOO_SMALL_FRACTION = 0.3
"""The fraction at which the second uncapped 61-layer EAGLE server found no KV room (H200)."""
DFLASH_DRAFT_GRAPHS_GIB = 2.9
"""Graphs (to batch 8), activations and CUDA context of a 61-layer server with the DFlash draft:
e2e 55's two DDTree servers held 43.41 GiB together (78.50 free before the first, 35.09 after
both; bench/results/sglang_e2e/run55, speed.tar.xz), 2.9 GiB each beyond the weights and pools
this plan counts (SGLang logged 0.45 GiB more weights than counted: the rest is G)."""
MARGIN = 0.02
"""Added to the smallest fraction that fits."""
ACTIVATION_MARGIN_GIB = 3.0
"""Free memory the running servers leave for a prefill chunk's activations (not measured)."""

NEW_TOKENS = 256
KV_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Row:
    preset: str
    layers: int
    spec: str  # eagle, dflash, ddtree
    kv_dtype: str
    batch: int
    prompt: int
    new_tokens: int = NEW_TOKENS

    @property
    def width(self) -> int:
        # EAGLE's rows run its tree; DDTree's the default budget.
        return verify_width("tree" if self.spec == "eagle" else self.spec, BLOCK_SIZE)

    @property
    def label(self) -> str:
        return (
            f"{self.preset}-{self.layers}, {self.spec} {self.kv_dtype}, "
            f"batch {self.batch}, {self.prompt // 1024}k"
        )


def table_rows() -> list[Row]:
    """The rows of the 61-layer headline table, in the order the README shows them."""
    rows = [
        Row("rank", 61, "eagle", "bf16", batch, prompt)
        for batch in (1, 8, 32)
        for prompt in (1024, 8192, 32768)
    ]
    rows.append(Row("rank", 61, "eagle", "bf16", 1, 131072, new_tokens=64))
    rows += [
        Row("rank", 61, spec, kv, batch, prompt)
        for spec, kv in (("dflash", "bf16"), ("ddtree", "bf16"), ("eagle", "fp8"))
        for batch in (1, 8)
        for prompt in (1024, 32768)
    ]
    rows += [Row("kimi-rank", 61, "eagle", "bf16", 1, p) for p in (1024, 32768, 131072)]
    return rows


def weight_bytes(row: Row) -> int:
    """Bytes of the target's and the draft's weights as the servers load them."""
    config = model_config(row.preset, row.layers)
    tensors = model_weights(config, device="meta")
    nextn = f"model.layers.{config['num_hidden_layers']}."
    target = sum(
        t.numel() * t.element_size() for n, t in tensors.items() if not n.startswith(nextn)
    )
    # The NextN layer loads its own embedding and head before SGLang shares the target's: the load
    # needs them (e2e 25's log: 0.56 GiB for the 4-layer NextN, 0.43 without them).
    if row.spec == "eagle":
        shared = ("model.embed_tokens.weight", "lm_head.weight")
        return target + sum(
            t.numel() * t.element_size()
            for n, t in tensors.items()
            if n.startswith(nextn) or n in shared
        )
    draft = draft_config(config)  # the DFlash draft borrows the target's embedding and head
    hidden, inter = draft["hidden_size"], draft["intermediate_size"]
    features = len(draft["dflash_config"]["target_layer_ids"])
    # q, k, v, o; the MLP; fc over the captured features (bf16; norms are negligible)
    return target + 2 * (4 * hidden * hidden + 3 * hidden * inter + features * hidden * hidden)


def kv_bytes_per_token(row: Row) -> int:
    """One token's KV in the target's pool and the draft's."""
    config = model_config(row.preset, row.layers)
    cell = KV_BYTES[row.kv_dtype]
    target = config["num_hidden_layers"] * (config["kv_lora_rank"] + config["qk_rope_head_dim"])
    if row.spec == "eagle":
        draft = config["kv_lora_rank"] + config["qk_rope_head_dim"]  # the one NextN layer
    else:
        dc = draft_config(config)
        draft = dc["num_hidden_layers"] * 2 * dc["num_key_value_heads"] * dc["head_dim"]
    return (target + draft) * cell


def second_room_gib(weights_gib: float, fraction: float) -> float:
    """What the second of two uncapped servers at ``fraction`` had on an H200 for graphs,
    activations and KV (the first one's graphs and activations not subtracted)."""
    second = group_static_gib(FREE_AT_START_GIB, fraction, 2, overhead_gib=0.0)[-1]
    return second - weights_gib


def eagle_graphs_gib() -> float:
    """EAGLE's graphs, activations and smallest pool: more than the room that was too small."""
    too_small = Row("rank", 61, "eagle", "bf16", 8, 1024)
    return second_room_gib(weight_bytes(too_small) / GIB, TOO_SMALL_FRACTION)


def graphs_gib(row: Row) -> float:
    return eagle_graphs_gib() if row.spec == "eagle" else DFLASH_DRAFT_GRAPHS_GIB


@dataclass(frozen=True)
class Plan:
    row: Row
    weights_gib: float
    kv_gib: float
    graphs_gib: float

    @property
    def server_gib(self) -> float:
        """What one capped server holds once it runs."""
        return self.weights_gib + self.kv_gib + self.graphs_gib

    def fraction(self, start_free_gib: float) -> float:
        """The smallest f at which a server that finds ``start_free_gib`` free gets its cap."""
        return (self.weights_gib + self.kv_gib) / start_free_gib

    def layout(self, free_gib: float) -> str:
        """Two servers in one command, one server per mode, or neither, on a card with
        ``free_gib`` free at the first start."""
        for label, servers in (("two servers", 2), ("one server per mode", 1)):
            if servers * self.server_gib + ACTIVATION_MARGIN_GIB > free_gib:
                continue
            last_start = free_gib - (servers - 1) * self.server_gib
            chosen = math.ceil((self.fraction(last_start) + MARGIN) * 100) / 100
            return f"{label}, f {chosen:.2f}"
        return "does not fit"


def plan(row: Row) -> Plan:
    needed = kv_tokens_needed(row.batch, row.prompt, row.new_tokens, row.width)
    kv = kv_pool_cap(needed) * kv_bytes_per_token(row) / GIB
    return Plan(row, weight_bytes(row) / GIB, kv, graphs_gib(row))


def group_static_gib(
    free_gib: float, fraction: float, count: int, overhead_gib: float = STARTED_SERVER_OVERHEAD_GIB
) -> list[float]:
    """The static share (weights and KV) of each of ``count`` servers started one after another,
    as the speed harness starts them (each once the one before holds its pools): each takes
    ``fraction`` of what is free, and leaves ``overhead_gib`` more taken once it runs."""
    shares = []
    for _ in range(count):
        shares.append(free_gib * fraction)
        free_gib -= free_gib * fraction + overhead_gib
    return shares


def group_fit(row: Row, count: int, free_gib: float) -> tuple[float, float]:
    """The fraction (in hundredths) that leaves the last of ``count`` servers of ``row`` the most
    KV room, and that room in GiB: the group fits where it is at least the row's KV."""
    weights = weight_bytes(row) / GIB
    rooms = {
        f / 100: group_static_gib(free_gib, f / 100, count)[-1] - weights for f in range(5, 51)
    }
    fraction = max(rooms, key=rooms.__getitem__)
    return fraction, rooms[fraction]


def render_groups() -> str:
    """Which groups of DDTree servers (the 4-layer rank model, batch 1, 128k) fit one card."""
    row = Row("rank", 4, "ddtree", "bf16", 1, 131072)
    kv = kv_tokens_needed(row.batch, row.prompt, row.new_tokens, row.width)
    kv = kv * kv_bytes_per_token(row) / GIB
    lines = [
        f"Servers started together ({row.label}: {weight_bytes(row) / GIB:.1f} GiB of weights "
        f"and {kv:.1f} of KV each; {STARTED_SERVER_OVERHEAD_GIB} GiB more per started server):",
        "",
        "| card | servers | best f | last server's KV room, GiB | fits |",
        "|---|---:|---:|---:|---|",
    ]
    for card, free in GROUP_CARDS.items():
        for count in GROUP_SIZES:
            fraction, room = group_fit(row, count, free)
            lines.append(
                f"| {card} | {count} | {fraction:.2f} | {room:.1f} | "
                f"{'yes' if room >= kv else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def render() -> str:
    lines = [
        "Every row with `--kv-tokens auto`; G: graphs, activations and CUDA context per server "
        f"({DFLASH_DRAFT_GRAPHS_GIB} GiB measured with the DFlash draft, {eagle_graphs_gib():.1f} "
        f"bounded for EAGLE); free at the first start: H100 {FREE_AT_START_H100_GIB} GiB, "
        f"H200 {FREE_AT_START_GIB} GiB.",
        "",
        "| row | weights GiB | capped KV GiB | G GiB | H100 | H200 |",
        "|---|---:|---:|---:|---|---|",
    ]
    for p in (plan(row) for row in table_rows()):
        lines.append(
            f"| {p.row.label} | {p.weights_gib:.1f} | {p.kv_gib:.1f} | {p.graphs_gib:.1f} | "
            f"{p.layout(FREE_AT_START_H100_GIB)} | {p.layout(FREE_AT_START_GIB)} |"
        )
    return "\n".join(lines) + "\n\n" + render_groups()


def with_table(document: str, table: str) -> str:
    """``document`` with the text between its plan markers replaced by ``table``."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC.name} lacks the markers {BEGIN} ... {END}")
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"refresh the table in {DOC.name}")
    args = parser.parse_args(argv)
    table = render()
    if args.write:
        DOC.write_text(with_table(DOC.read_text(), table))
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
