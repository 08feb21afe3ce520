#!/usr/bin/env bash
# bench/flashinfer_payload.sh [DIR] -- FlashInfer for the SGLang payload on the GPU machine.
#
# SGLang 0.5.23 pins flashinfer-python 0.7.2, whose wheel (62 MiB, mostly CUDA headers for its
# JIT) does not fit one device command beside the SGLang payload. Unpacked, without the sources
# of kernel families SGLang's attention never compiles, and packed again with xz it is about
# 14 MiB: DIR/flashinfer.tar.xz (default .sglsite), which bench/sglang_gpu.sh unpacks into the
# payload's site when SGLANG_GPU_FLASHINFER=1. A pure-Python wheel unpacked into a site is an
# installed one. What FlashInfer imports at start is on the GPU machine already
# (torch, cuda-bindings, tvm-ffi from the payload, ninja, einops, nvidia-ml-py, ...); its
# optional backends (cuDNN frontend, CUTLASS DSL, cuTile) stay out, as FlashInfer allows.
# Its kernels are compiled on first use there, by the machine's nvcc, into /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.sglsite}
pin=flashinfer-python==0.7.2  # SGLang 0.5.23's requirement (flashinfer_python[cu13]==0.7.2)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dir" "$work/site"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" "$pin"
python3 -m zipfile -e "$work"/flashinfer_python-*.whl "$work/site"
# Sources of kernel families no attention backend of SGLang's compiles (MoE, linear attention,
# DeepSeek-V4's sparse MLA, FP4 GEMMs; about 200 of the 450 MB): FlashInfer reads a family's
# sources only when it JIT-compiles that family, so importing it and its FA2/FA3 attention do
# not need them, and the archive leaves room for the tree beside the SGLang payload.
for unused in fused_moe kda gdn cake_dsv4 cake_bgmv_moe blackwell_bf16_fp4 blackwell_msa \
  experimental alphamoe_nvfp4_sm100.cu; do
  rm -rf "$work/site/flashinfer/data/csrc/$unused"
done
echo "packing $(du -sh "$work/site" | cut -f1) with xz (a few minutes)"
XZ_OPT=-9 tar -C "$work/site" -cJf "$dir/flashinfer.tar.xz" .
du -b "$dir/flashinfer.tar.xz"
# A device command carries 64 MiB in all: this tree's tracked files plus everything carried.
total=$(($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -sb "$dir" | cut -f1)))
echo "tracked tree + $dir: $((total / 1048576)) MiB of a command's 64"
[ "$total" -le $((64 * 1048576)) ] || { echo "over a device command's 64 MiB" >&2; exit 1; }
