# syntax=docker/dockerfile:1.7
# kdtree images. Targets (docker build --target NAME):
#   inference  SGLang 0.5.23 + its torch + kdtree-verify with its compiled kernel + kdtree_inference;
#              entrypoint kdtree-serve (SGLang's arguments pass through; KDTREE_VERIFY picks the path)
#   parity     the parity sidecar alone (no torch): entrypoint kdtree-parity
#   demo       the CPU reference engine (tiny MLA model, no GPU): entrypoint kdtree-engine
# The kernel is built by exactly the command CI and developers use: `make kernel`.
#
# CUDA 13.0: sglang 0.5.23 pins torch==2.14.1, whose PyPI wheels are cu130 builds (and
# flashinfer_python[cu13], cuda-python>=13). The kernel must be compiled by the same CUDA major as
# the torch it links against; 13.0 also knows sm_120 (needs >= 12.8).
ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
# Where nvcc, the CUDA headers and cudart come from (docs/operations.md, "Building without the
# public registries"):
#   image  NVIDIA's devel base image CUDA_BASE_IMAGE (the default)
#   pypi   NVIDIA's toolkit wheels (cuda-toolkit==CUDA_WHEELS_VERSION from pip's index) on the
#          Python base PYTHON_SLIM_IMAGE: for a site that cannot pull nvidia/cuda (CI builds so)
ARG CUDA_SOURCE=image
# The release torch 2.14.1's wheels pin (cuda-toolkit==13.0.3); nvcc 13.0.88 in both paths.
ARG CUDA_WHEELS_VERSION=13.0.3
# The base images and pip's indexes are build arguments, so that a site without Docker Hub, NVIDIA's
# registry, PyPI or PyTorch's index builds from its own mirrors (docs/operations.md, "Building
# without the public registries"). PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS are space-separated
# lists, read by pip from the environment in every RUN of the stages that declare them.
ARG CUDA_BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}
ARG PYTHON_SLIM_IMAGE=python:3.12-slim-bookworm
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_EXTRA_INDEX_URL=
ARG PIP_FIND_LINKS=
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SGLANG_VERSION=0.5.23
ARG TORCH_VERSION=2.14.1
# cuobjdump has no wheel of the 13.0 release; any 13.x reads 13.0's fatbins (the pypi path only:
# NVIDIA's devel image carries its own).
ARG CUOBJDUMP_VERSION=13.2.51

# ---------------------------------------------------------------------------------------------
# Python and a venv on NVIDIA's CUDA devel base.
FROM ${CUDA_BASE_IMAGE} AS cuda-from-image
ARG CUDA_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    KDTREE_CUDA_TOOLKIT=${CUDA_VERSION} \
    PATH=/opt/venv/bin:${PATH}
# Ubuntu's own security updates decide these versions; pinning them would break every rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential make git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "${VIRTUAL_ENV}"

# ---------------------------------------------------------------------------------------------
# The same on a plain Python base, with CUDA's compiler, headers and runtime from NVIDIA's wheels
# (they unpack into site-packages/nvidia/cu13). CUDA_HOME=/opt/cuda links there, with the two
# things torch.utils.cpp_extension and the linker expect of a toolkit and the wheels lack: lib64
# and the unversioned libcudart.so.
FROM ${PYTHON_SLIM_IMAGE} AS cuda-from-pypi
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG CUDA_WHEELS_VERSION
ARG CUOBJDUMP_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    CUDA_HOME=/opt/cuda \
    KDTREE_CUDA_TOOLKIT=${CUDA_WHEELS_VERSION} \
    PATH=/opt/venv/bin:/opt/cuda/bin:${PATH}
# Python's headers come with the official python image; Debian's python3 needs python3-dev.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential make git ca-certificates \
    && if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
        apt-get install -y --no-install-recommends python3-dev; fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "${VIRTUAL_ENV}"
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install "cuda-toolkit[nvcc,crt,cccl,cudart]==${CUDA_WHEELS_VERSION}" \
        "nvidia-cuda-cuobjdump==${CUOBJDUMP_VERSION}" \
    && wheels="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu${CUDA_WHEELS_VERSION%%.*}" \
    && ln -s "${wheels}" "${CUDA_HOME}" \
    && ln -s lib "${CUDA_HOME}/lib64" \
    && ln -s "libcudart.so.${CUDA_WHEELS_VERSION%%.*}" "${CUDA_HOME}/lib/libcudart.so" \
    && nvcc --version && cuobjdump --version

# ---------------------------------------------------------------------------------------------
# The one picked by CUDA_SOURCE. (podman 4's buildah resolves this name only from a --build-arg,
# not from the default above: with podman, pass --build-arg CUDA_SOURCE=image|pypi.)
# DL3006 is about images from a registry; this names a stage of this file.
# hadolint ignore=DL3006
FROM cuda-from-${CUDA_SOURCE} AS cuda-python

# ---------------------------------------------------------------------------------------------
# What serving needs: SGLang with its dependencies and its torch (~11 GB). pip's cache is a build
# cache mount: it survives between builds on one machine and never lands in the image.
# One install of all of it would be one ~11 GB layer, and committing a layer needs about four
# times its size at once (the container's files, buildah's diff of them, its copy in the store's
# staging area, the layer unpacked): ~45 GB. So pip resolves once (the pins in
# /opt/kdtree/serving-pins.txt), and the pinned set is installed in slices of at most ~2.5 GB,
# one layer each, with no further resolving (docs/operations.md, "Disk").
FROM cuda-python AS serving
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG SGLANG_VERSION
ARG TORCH_VERSION
WORKDIR /opt/kdtree
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --dry-run --quiet --report /tmp/serving.json \
        "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" "ninja==1.13.2" \
        "setuptools==80.9.0" "wheel==0.45.1" \
    && python -c 'import json, sys; print("\n".join(sorted(i["metadata"]["name"] + "==" + i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"])))' \
        /tmp/serving.json >serving-pins.txt \
    && rm /tmp/serving.json && wc -l serving-pins.txt
# Each slice is a list of name==version lines of serving-pins.txt, one argument each: the word
# splitting is the point (SC2046), and the versions are pinned there (DL3013).
# hadolint ignore=SC2046,DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps $(grep -iE '^(nvidia-cudnn|nvidia-nccl|nvidia-cusparselt)' serving-pins.txt)
# hadolint ignore=SC2046,DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps $(grep -iE '^(nvidia-|cuda-)' serving-pins.txt)
# hadolint ignore=SC2046,DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps $(grep -iE '^(torch|triton)==' serving-pins.txt)
# hadolint ignore=SC2046,DL3013
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps $(grep -iE '^(sglang-kernel|sgl-|flashinfer)' serving-pins.txt)
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps -r serving-pins.txt

# ---------------------------------------------------------------------------------------------
# The CUDA extension, compiled ahead of time for KDTREE_CUDA_ARCHS (";"-separated sm numbers) by
# `make kernel` (torch.utils.cpp_extension into KDTREE_BUILD_DIR). No GPU is needed to compile.
# kdtree-verify is installed as a package (its wheel carries kdtree_verify/csrc), not as an
# editable checkout: the extension is built from the installed sources, in the environment that
# serves it, so the op's loader finds it up to date (same sources, headers and flags) and never
# recompiles at run time.
# The arch list comes from kernel/kdtree_verify/cuda_archs.txt: make passes it as this build
# argument (so the image's label names it); left empty, the build reads that file itself.
FROM serving AS kernel-build
ARG KDTREE_CUDA_ARCHS=
ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS} \
    KDTREE_BUILD_DIR=/opt/kdtree/kernel-build \
    VENV=/opt/venv
WORKDIR /opt/kdtree
# The Makefile and the files its `setup` prerequisite names; this venv stands in for .venv.
COPY Makefile pyproject.toml ./
COPY scripts/ scripts/
COPY requirements/ requirements/
COPY services/inference/pyproject.toml services/inference/pyproject.toml
COPY services/parity/pyproject.toml services/parity/pyproject.toml
COPY kernel/ kernel/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps --no-build-isolation ./kernel \
    && touch "${VENV}/.setup-done" \
    && KDTREE_BUILD_WITHOUT_GPU=1 MAX_JOBS=4 make kernel \
    && rm -rf kernel

# ---------------------------------------------------------------------------------------------
# The runtime: kernel-build as it stands (the compiler stays: SGLang compiles kernels with nvcc on
# first use on sm_90 and newer, docs/operations.md "What the inference image holds").
FROM kernel-build AS inference
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG SGLANG_VERSION
ARG TORCH_VERSION
ARG KDTREE_CUDA_ARCHS
ARG CUDA_SOURCE
COPY services/inference/ /opt/kdtree/services/inference/
# The op takes a lock in KDTREE_BUILD_DIR when it loads the extension: writable by the runtime user.
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install /opt/kdtree/services/inference \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree \
    && chown -R 10001 /opt/kdtree/kernel-build
# Labels last: VCS_REF changes with every revision, and an ARG declared above a RUN
# invalidates the cached layers of that RUN (the installs above are slow).
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
LABEL org.opencontainers.image.title="kdtree inference (SGLang ${SGLANG_VERSION} + kdtree-verify)" \
      org.opencontainers.image.description="SGLang with the kdtree MLA tree-verify attention kernel" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      io.kdtree.sglang.version="${SGLANG_VERSION}" \
      io.kdtree.torch.version="${TORCH_VERSION}" \
      io.kdtree.cuda.version="${KDTREE_CUDA_TOOLKIT}" \
      io.kdtree.cuda.source="${CUDA_SOURCE}" \
      io.kdtree.cuda.archs="${KDTREE_CUDA_ARCHS}"
USER 10001
WORKDIR /home/kdtree
# KDTREE_VERIFY: off (stock SGLang), validate (both, serve SGLang's), on (serve the kernel).
ENV KDTREE_VERIFY=on \
    KDTREE_HEALTH_PORT=30000
EXPOSE 30000
# Shell form (stored as CMD-SHELL): the form Docker, podman and Compose all run alike. DL3025
# is about CMD and ENTRYPOINT; a probe has no signals to receive.
# hadolint ignore=DL3025
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD python -c "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('KDTREE_HEALTH_PORT', '30000'), timeout=4)"
ENTRYPOINT ["kdtree-serve"]
CMD ["--model-path", "/models", "--host", "0.0.0.0", "--port", "30000", "--attention-backend", "triton"]

# ---------------------------------------------------------------------------------------------
# The parity sidecar: no torch, no CUDA. Reports and its SQLite store go to /reports.
FROM ${PYTHON_SLIM_IMAGE} AS parity
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
COPY services/parity/ /opt/kdtree/services/parity/
RUN pip install /opt/kdtree/services/parity \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree \
    && mkdir -p /reports && chown kdtree /reports
# Labels last, as in the inference stage.
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
LABEL org.opencontainers.image.title="kdtree parity sidecar" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}"
USER 10001
WORKDIR /reports
ENTRYPOINT ["kdtree-parity"]
CMD ["--help"]

# ---------------------------------------------------------------------------------------------
# The embedded reference engine on the CPU (docker compose --profile demo): torch's CPU build,
# the op's CPU implementation (no CUDA extension), kdtree_inference.
FROM ${PYTHON_SLIM_IMAGE} AS demo
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    KDTREE_HEALTH_PORT=30000
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY kernel/ /opt/kdtree/kernel/
COPY services/inference/ /opt/kdtree/services/inference/
RUN pip install /opt/kdtree/kernel /opt/kdtree/services/inference \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree
# Labels last, as in the inference stage.
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
LABEL org.opencontainers.image.title="kdtree reference engine (CPU demo)" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      io.kdtree.torch.version="${TORCH_VERSION}"
USER 10001
WORKDIR /home/kdtree
EXPOSE 30000
# Shell form, as in the inference stage.
# hadolint ignore=DL3025
HEALTHCHECK --interval=5s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('KDTREE_HEALTH_PORT', '30000'), timeout=4)"
ENTRYPOINT ["kdtree-engine"]
CMD ["--host", "0.0.0.0", "--port", "30000"]
