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
# The installer of the images' Python packages (the `uv` stage below).
ARG UV_VERSION=0.13.9

# ---------------------------------------------------------------------------------------------
# uv installs the images' Python packages (parallel downloads and unpacking, bytecode compiled on
# every core). It is a build tool: the RUNs that install bind-mount /opt/uv from this stage, and
# no image carries it. /opt/uv/bin/uv-pip is uv with pip's index settings (scripts/uv_pip.sh).
FROM ${PYTHON_SLIM_IMAGE} AS uv
# Each stage on the Python base opens with an instruction of its own (here UV_VERSION): stages
# that build at the same time (BuildKit's stages, or the parity and demo builds beside the inference one)
# would otherwise each commit the same opening steps, and a later build, finding one of the
# twins, could miss the layers built on the other and rebuild from there.
ARG UV_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
RUN pip install --no-cache-dir --target /opt/uv "uv==${UV_VERSION}"
COPY scripts/uv_pip.sh /opt/uv/bin/uv-pip

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
    && python3 -m venv "${VIRTUAL_ENV}" \
    && mkdir -p /opt/kdtree && : >/opt/kdtree/cuda-requirements.txt

# ---------------------------------------------------------------------------------------------
# The same on a plain Python base, with CUDA's compiler, headers and runtime from NVIDIA's wheels
# (they unpack into site-packages/nvidia/cu13). CUDA_HOME=/opt/cuda links there, with the two
# things torch.utils.cpp_extension and the linker expect of a toolkit and the wheels lack: lib64
# and the unversioned libcudart.so.
FROM ${PYTHON_SLIM_IMAGE} AS cuda-from-pypi
# Opens with its own instruction, as the uv stage says why.
ARG CUDA_WHEELS_VERSION
ARG CUOBJDUMP_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
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
# The wheels are requirements of the venv from here on: /opt/kdtree/cuda-requirements.txt joins
# SGLang's resolution (the serving stages), so that its set keeps this toolkit (NVIDIA's base
# leaves the file empty: its toolkit is not a wheel).
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    mkdir -p /opt/kdtree \
    && printf '%s\n' "cuda-toolkit[nvcc,crt,cccl,cudart]==${CUDA_WHEELS_VERSION}" \
        "nvidia-cuda-cuobjdump==${CUOBJDUMP_VERSION}" >/opt/kdtree/cuda-requirements.txt \
    && pip install -r /opt/kdtree/cuda-requirements.txt \
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
# What serving needs: SGLang with its dependencies and its torch (~12 GB), resolved once into
# /opt/kdtree/serving-pins.txt and installed by uv. uv's cache is a build cache mount (shared:
# uv locks it itself, and the demo image's build takes torch from it too): it survives between
# builds on one machine and never lands in an image.
# One install of all of it would be one ~12 GB layer, and committing a layer needs about four
# times its size at once (the container's files, buildah's diff of them, its copy in the store's
# staging area, the layer unpacked): ~45 GB. So the pinned set is installed in slices of at most
# ~2.5 GB, one layer each, with no further resolving (docs/operations.md, "Disk").
# This stage holds the slices the kernel is compiled against (CUDA's libraries, torch with its
# own dependencies, ninja): the kernel's build and the rest of SGLang's set both start from it,
# side by side in a builder that runs stages in parallel (BuildKit; podman 4's --jobs would start
# the runtime before the kernel-build stage it bind-mounts, so scripts/container_ci.sh builds in
# order).
FROM cuda-python AS torch-runtime
# Inherited from either CUDA stage; said again because the resolve below pipes.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG SGLANG_VERSION
ARG TORCH_VERSION
ENV KDTREE_BUILD_DIR=/opt/kdtree/kernel-build
WORKDIR /opt/kdtree
# One resolution for all that the image runs: SGLang, the toolkit's wheels, and kdtree-inference's
# own pins (its pyproject's dependencies, but for the kdtree packages installed below), so that
# installing kdtree-inference later changes nothing of the set.
COPY services/inference/pyproject.toml kdtree-inference.pyproject.toml
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    { printf '%s\n' "sglang==${SGLANG_VERSION}" "torch==${TORCH_VERSION}" "ninja==1.13.2" \
        "setuptools==80.9.0" "wheel==0.45.1"; cat cuda-requirements.txt; \
      python -c 'import sys, tomllib; print(*(d for d in tomllib.load(sys.stdin.buffer)["project"]["dependencies"] if not d.startswith("kdtree-")), sep="\n")' \
        <kdtree-inference.pyproject.toml; } \
    | /opt/uv/bin/uv-pip compile - --no-header --no-annotate --output-file serving-pins.txt \
    && printf '%s\n' "torch==${TORCH_VERSION}" "ninja==1.13.2" "setuptools==80.9.0" "wheel==0.45.1" \
        pydantic pydantic-settings \
    | /opt/uv/bin/uv-pip compile - --no-header --no-annotate --constraint serving-pins.txt \
        --output-file kernel-build-pins.txt \
    && wc -l serving-pins.txt kernel-build-pins.txt
# Each slice is a list of name==version lines of serving-pins.txt, one argument each: the word
# splitting is the point (SC2046), and the versions are pinned there (DL3013).
# hadolint ignore=SC2046,DL3013
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --no-deps $(grep -iE '^(nvidia-cudnn|nvidia-nccl|nvidia-cusparselt)' serving-pins.txt)
# hadolint ignore=SC2046,DL3013
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --no-deps $(grep -iE '^(nvidia-|cuda-)' serving-pins.txt)
# What the kernel's build needs besides: torch with its own dependencies, ninja, setuptools, and
# pydantic-settings (kdtree-settings reads the build's environment), at serving-pins.txt's versions.
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --no-deps -r kernel-build-pins.txt

# ---------------------------------------------------------------------------------------------
# The CUDA extension, compiled ahead of time for KDTREE_CUDA_ARCHS (";"-separated sm numbers) by
# `make kernel` (torch.utils.cpp_extension into KDTREE_BUILD_DIR). No GPU is needed to compile.
# kdtree-verify is installed as a package (its wheel carries kdtree_verify/csrc), not as an
# editable checkout, so the extension is built from the sources the image serves. The package
# and the build leave this stage as one tar (file times kept), which the runtime unpacks on the
# same torch and CUDA layers: the op's loader (ninja, comparing sources, headers, flags and file
# times) then finds the extension up to date and never recompiles at run time.
# The arch list comes from kernel/kdtree_verify/cuda_archs.txt: make passes it as this build
# argument (so the image's label names it); left empty, the build reads that file itself.
FROM torch-runtime AS kernel-build
ARG KDTREE_CUDA_ARCHS=
ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS} \
    VENV=/opt/venv
# The Makefile and the files its `setup` prerequisite names; this venv stands in for .venv.
# (Of scripts/, only that prerequisite: another script's change must not rebuild the kernel.)
COPY Makefile pyproject.toml ./
COPY scripts/setup_venv.sh scripts/
COPY requirements/ requirements/
COPY services/inference/pyproject.toml services/inference/pyproject.toml
COPY services/parity/pyproject.toml services/parity/pyproject.toml
COPY bench/pyproject.toml bench/pyproject.toml
COPY lib/settings/ lib/settings/
COPY kernel/ kernel/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install --no-deps --no-build-isolation ./kernel ./lib/settings \
    && touch "${VENV}/.setup-done" \
    && KDTREE_BUILD_WITHOUT_GPU=1 MAX_JOBS=4 make kernel \
    && rm -rf kernel \
    && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && tar --create --file /opt/kdtree/kernel.tar "${KDTREE_BUILD_DIR}" "${site}"/kdtree_verify*

# ---------------------------------------------------------------------------------------------
# The rest of SGLang's set (sgl-kernel, flashinfer, DeepGEMM, ..., then ~150 small packages).
FROM torch-runtime AS serving
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
# hadolint ignore=SC2046,DL3013
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --no-deps $(grep -iE '^(sglang-kernel|sgl-|flashinfer)' serving-pins.txt)
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --no-deps -r serving-pins.txt

# ---------------------------------------------------------------------------------------------
# The runtime: SGLang's environment with the compiled kernel and kdtree-inference (the compiler
# stays: SGLang compiles kernels with nvcc on first use on sm_90 and newer, docs/operations.md
# "What the inference image holds").
FROM serving AS inference
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG SGLANG_VERSION
ARG TORCH_VERSION
ARG KDTREE_CUDA_ARCHS=
ARG CUDA_SOURCE
# The loader compiles with the archs it was built for: the same variable as in kernel-build.
ENV KDTREE_CUDA_ARCHS=${KDTREE_CUDA_ARCHS}
RUN --mount=type=bind,from=kernel-build,source=/opt/kdtree/kernel.tar,target=/tmp/kernel.tar \
    tar --extract --file /tmp/kernel.tar --directory /
COPY lib/settings/ /opt/kdtree/lib/settings/
COPY services/inference/ /opt/kdtree/services/inference/
# The op takes a lock in KDTREE_BUILD_DIR when it loads the extension: writable by the runtime user.
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    pip install /opt/kdtree/lib/settings /opt/kdtree/services/inference \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree \
    && chown -R 10001 /opt/kdtree/kernel-build
# Labels last: VCS_REF changes with every revision, and an ARG declared above a RUN
# invalidates the cached layers of that RUN (the installs above are slow).
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
# podman 4's buildah finds a cached LABEL step by its text, whatever the ARG values in it: a
# later revision got the earlier one's label. A RUN is found by its ARG values too, so the steps
# from here on are each revision's own (an empty layer; BuildKit needs none of it).
RUN test -n "${VCS_REF}"
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
COPY lib/settings/ /opt/kdtree/lib/settings/
COPY services/parity/ /opt/kdtree/services/parity/
RUN pip install /opt/kdtree/lib/settings /opt/kdtree/services/parity \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree \
    && mkdir -p /reports && chown kdtree /reports
# Labels last, as in the inference stage.
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
# Each revision's own labels, as the inference stage says why.
RUN test -n "${VCS_REF}"
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
# Another torch release for the demo (empty: TORCH_VERSION), for a site whose CPU build of
# TORCH_VERSION is out of reach but another is on disk: the demo's op is its pure-torch CPU path,
# tied to no torch ABI, and the CUDA build of torch would make this image ~6 GB instead of ~1.
ARG DEMO_TORCH_VERSION=
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    KDTREE_HEALTH_PORT=30000
# torch from TORCH_INDEX_URL (its CPU build), through uv and its cache, as the inference image;
# the packages' own torch pin is overridden by the release installed here.
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    echo "torch==${DEMO_TORCH_VERSION:-${TORCH_VERSION}}" >/opt/torch-override.txt \
    && PIP_INDEX_URL="${TORCH_INDEX_URL}" /opt/uv/bin/uv-pip install --system \
       --requirement /opt/torch-override.txt
COPY lib/settings/ /opt/kdtree/lib/settings/
COPY kernel/ /opt/kdtree/kernel/
COPY services/inference/ /opt/kdtree/services/inference/
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=cache,target=/root/.cache/uv,sharing=shared \
    /opt/uv/bin/uv-pip install --system --override /opt/torch-override.txt \
       /opt/kdtree/lib/settings /opt/kdtree/kernel /opt/kdtree/services/inference \
    && rm /opt/torch-override.txt \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kdtree
# Labels last, as in the inference stage.
ARG VCS_REF=unknown
ARG SOURCE_URL=https://example.invalid/kdtree
# Each revision's own labels, as the inference stage says why.
RUN test -n "${VCS_REF}"
LABEL org.opencontainers.image.title="kdtree reference engine (CPU demo)" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      io.kdtree.torch.version="${DEMO_TORCH_VERSION:-${TORCH_VERSION}}"
USER 10001
WORKDIR /home/kdtree
EXPOSE 30000
# Shell form, as in the inference stage.
# hadolint ignore=DL3025
HEALTHCHECK --interval=5s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('KDTREE_HEALTH_PORT', '30000'), timeout=4)"
ENTRYPOINT ["kdtree-engine"]
CMD ["--host", "0.0.0.0", "--port", "30000"]
