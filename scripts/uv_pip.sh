#!/usr/bin/env bash
# `uv pip SUBCOMMAND ARGS...` as the images' builds use it (the Dockerfile's `uv` stage puts it
# at /opt/uv/bin/uv-pip beside uv, bind-mounted into the RUNs that install):
# - pip's index settings, which the builds take as build arguments (PIP_INDEX_URL, and the
#   space-separated PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS) and uv does not read; like pip, every
#   index is searched for the best match;
# - bytecode compiled, as pip compiles it (an image's user cannot write __pycache__ there);
# - files copied out of uv's cache, a build cache mount that a hard link cannot cross;
# - TLS trusted through the system's certificates, as Debian's and Ubuntu's pip do (a site whose
#   proxy re-signs TLS adds its CA there).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: uv_pip.sh SUBCOMMAND [ARG...]" >&2; exit 2; }
uv=$(dirname "$0")/uv
[ -x "$uv" ] || uv=uv
subcommand=$1
shift
args=(--index-strategy unsafe-best-match)
[ -n "${PIP_INDEX_URL:-}" ] && args+=(--index-url "$PIP_INDEX_URL")
for url in ${PIP_EXTRA_INDEX_URL:-}; do args+=(--extra-index-url "$url"); done
for link in ${PIP_FIND_LINKS:-}; do args+=(--find-links "$link"); done
export UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_SYSTEM_CERTS=1
exec "$uv" pip "$subcommand" "${args[@]}" "$@"
