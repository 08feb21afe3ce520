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

# ---------------------------------------------------------------------------------------------
# Python 3.12 on the CUDA devel base. The runtime keeps the devel base on purpose: SGLang
# JIT-compiles some kernels (flashinfer, deep_gemm) on first use and needs nvcc and the headers.
FROM ${CUDA_BASE_IMAGE} AS cuda-python
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH}
# Ubuntu's own security updates decide these versions; pinning them would break every rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev build-essential make git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "${VIRTUAL_ENV}"

# ---------------------------------------------------------------------------------------------
# The CUDA extension, compiled ahead of time for KDTREE_CUDA_ARCHS (";"-separated sm numbers) by
# `make kernel` (torch.utils.cpp_extension into KDTREE_BUILD_DIR). No GPU is needed to compile.
FROM cuda-python AS kernel-build
ARG TORCH_VERSION
ARG KDTREE_CUDA_ARCHS="80;90;120"
ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS} \
    KDTREE_BUILD_DIR=/opt/kdtree/kernel-build \
    KDTREE_BUILD_WITHOUT_GPU=1 \
    VENV=/opt/venv \
    MAX_JOBS=8
RUN pip install "torch==${TORCH_VERSION}" "ninja==1.13.2" "setuptools==80.9.0" "wheel==0.45.1"
WORKDIR /opt/kdtree
# The Makefile and the files its `setup` prerequisite names; this venv stands in for .venv.
COPY Makefile pyproject.toml ./
COPY scripts/ scripts/
COPY requirements/ requirements/
COPY services/inference/pyproject.toml services/inference/pyproject.toml
COPY services/parity/pyproject.toml services/parity/pyproject.toml
COPY kernel/ kernel/
RUN pip install --no-deps --no-build-isolation --editable ./kernel \
    && touch "${VENV}/.setup-done" \
    && make kernel

# ---------------------------------------------------------------------------------------------
FROM cuda-python AS inference
ARG SGLANG_VERSION
ARG TORCH_VERSION
ARG KDTREE_CUDA_ARCHS="80;90;120"
ARG CUDA_VERSION
RUN pip install "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" "ninja==1.13.2"
# The op loads the compiled extension from KDTREE_BUILD_DIR through cpp_extension, which checks
# it against the sources (kernel/csrc) and takes a lock there: same paths as in kernel-build, and
# the build directory writable by the runtime user.
ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS} \
    KDTREE_BUILD_DIR=/opt/kdtree/kernel-build
COPY --from=kernel-build /opt/kdtree/kernel/ /opt/kdtree/kernel/
COPY --from=kernel-build /opt/kdtree/kernel-build/ /opt/kdtree/kernel-build/
COPY services/inference/ /opt/kdtree/services/inference/
RUN pip install --no-deps --editable /opt/kdtree/kernel \
    && pip install /opt/kdtree/services/inference \
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
      io.kdtree.cuda.version="${CUDA_VERSION}" \
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
