#!/usr/bin/env bash
# Creates .venv with everything the tests and the demo need, on a CPU machine.
# torch 2.14.1 + torchvision 0.29.1 are what sglang 0.5.23's imports need; pip takes them from
# the local wheel cache where the machine has one. sglang itself goes in with --no-deps: its full
# dependency set is a GPU serving stack; requirements/sglang-cpu.txt lists the light packages its
# attention code imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
step() { printf '\n==> %s\n' "$*"; }
[ -x "$VENV/bin/python" ] || { step "creating $VENV with $PY"; "$PY" -m venv "$VENV"; }
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
step "torch 2.14.1 + torchvision 0.29.1"
"${pip[@]}" torch==2.14.1 torchvision==0.29.1
step "sglang 0.5.23 (--no-deps) and the light packages its attention code imports"
"${pip[@]}" --no-deps sglang==0.5.23
"${pip[@]}" -r requirements/sglang-cpu.txt
step "development tools"
"${pip[@]}" -r requirements/dev.txt
step "kdtree packages (editable)"
"${pip[@]}" --no-deps --no-build-isolation -e lib/settings -e kernel -e services/inference -e services/parity -e bench
step "chromium (the parity report's HTML is checked in headless Chromium by the tests)"
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "present: $(command -v chromium || command -v chromium-browser)"
elif command -v apt-get >/dev/null 2>&1; then
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends chromium
else
  echo "WARNING: no chromium and no apt-get: tests/integration/test_parity_engines.py will fail" >&2
fi
step "prometheus and promtool (the monitoring kit's tests run a real Prometheus)"
# Debian's package, unpacked into the venv rather than installed: its install would start a
# Prometheus daemon, and the tests start their own. Both binaries are static Go programs.
if [ -x "$VENV/bin/prometheus" ] && [ -x "$VENV/bin/promtool" ]; then
  echo "present: $("$VENV/bin/prometheus" --version 2>&1 | head -n 1)"
elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
  sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  unpack=$(mktemp -d)
  (cd "$unpack" && apt-get download -q prometheus && dpkg-deb -x prometheus_*.deb root)
  install -m 0755 "$unpack/root/usr/bin/prometheus" "$unpack/root/usr/bin/promtool" "$VENV/bin/"
  rm -rf "$unpack"
  echo "installed: $("$VENV/bin/prometheus" --version 2>&1 | head -n 1)"
else
  echo "WARNING: no apt-get: put prometheus and promtool on PATH, or tests/unit/test_monitoring.py and tests/integration/test_monitoring_prometheus.py fail" >&2
fi
touch "$VENV/.setup-done"
step "done: $("$VENV/bin/python" -c 'import torch, sglang; print("torch", torch.__version__, "sglang", sglang.__version__)')"
