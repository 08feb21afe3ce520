"""Build and load the CUDA extension (``kdtree_verify._C``) with torch.utils.cpp_extension.

The pure-Python package installs without nvcc or a GPU; the extension is compiled on first use
(or ahead of time by ``make kernel`` / ``python -m kdtree_verify._build``) into a build directory
keyed by the torch version, so one checkout can serve several environments.

Environment (read through ``_settings.BuildSettings``, the shared settings dialect: unset, empty
or blank is the default, and a bad value is refused naming the variable):
- ``KDTREE_CUDA_ARCHS``: semicolon-separated SM versions to compile for (unset or empty: the list
  in ``cuda_archs.txt`` beside this module, the one source of the default).
- ``KDTREE_BUILD_DIR``: where objects and the module go (default ``<repo>/kernel/build/<tag>`` in
  a checkout; ``$XDG_CACHE_HOME/kdtree-verify/<tag>``, i.e. ``~/.cache/...``, for an installed
  package, whose site-packages may not be writable).
- ``KDTREE_BUILD_WITHOUT_GPU``: ``1`` (or ``on``) builds where CUDA is not available.

The sources are ``kernel/csrc`` in a checkout (and an editable install) and ``kdtree_verify/csrc``
in an installed wheel, which carries them for exactly this build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from ._settings import ARCHS_FILE, DEFAULT_ARCHS, build_settings, parse_archs

__all__ = ["ARCHS_FILE", "DEFAULT_ARCHS", "cuda_archs", "load", "parse_archs"]

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCES = ("binding.cpp", "verify_kernel.cu")


def _find_csrc() -> tuple[Path, bool]:
    """(the CUDA source directory, whether it belongs to a source checkout)."""
    checkout = PACKAGE_DIR.parent / "csrc"
    if (checkout / SOURCES[1]).is_file():
        return checkout, True
    return PACKAGE_DIR / "csrc", False


CSRC_DIR, IN_CHECKOUT = _find_csrc()
EXTENSION_NAME = "kdtree_verify_cuda"

_module: ModuleType | None = None


def cuda_archs() -> list[str]:
    """SM versions from KDTREE_CUDA_ARCHS, or the default list (e.g. ``['80', '90', '120']``);
    a bad list raises BuildSettingsError (a ValueError) naming the variable."""
    return build_settings().archs


def gencode_flags(archs: list[str]) -> list[str]:
    """nvcc -gencode flags: machine code for every arch (no PTX JIT at load time)."""
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]


def nvcc_flags(archs: list[str]) -> list[str]:
    """The nvcc flags of the kernel build (shared with the CI ptxas check)."""
    return ["-O3", "-lineinfo", *gencode_flags(archs)]


def _toolkit_gaps(cuda_home: str) -> tuple[list[str], list[str]]:
    """Host-compiler and linker flags for toolkits that lack what torch's CUDA headers need.

    torch's ATen CUDA headers include cusparse.h, and its linker line asks for -lcudart under
    CUDA_HOME/lib64. A minimal toolkit (nvcc + cudart only, as on our CI machine) lacks the first
    and may keep the second elsewhere; torch's own nvidia-* wheels carry the headers.
    """
    home = Path(cuda_home)
    cflags: list[str] = []
    if not (home / "include" / "cusparse.h").exists():
        try:
            import nvidia

            for root in map(Path, nvidia.__path__):
                wheel_include = root / "cu13" / "include"
                if (wheel_include / "cusparse.h").exists():
                    cflags.append(f"-isystem{wheel_include}")
                    break
        except ImportError:
            pass
    ldflags: list[str] = []
    if not (home / "lib64" / "libcudart.so").exists():
        for lib in (home / "lib", home / "cuda" / "lib64", Path("/usr/local/cuda/lib64")):
            if (lib / "libcudart.so").exists():
                ldflags.append(f"-L{lib}")
                break
    return cflags, ldflags


def build_dir() -> Path:
    import torch

    settings = build_settings()
    tag = f"torch{torch.__version__.replace('+', '_')}"
    if IN_CHECKOUT:
        default = CSRC_DIR.parent / "build" / tag
    else:
        default = settings.cache_home / "kdtree-verify" / tag
    path = settings.build_dir or default
    path.mkdir(parents=True, exist_ok=True)
    return path


def load(verbose: bool = False) -> ModuleType:
    """Compile (if stale) and import the extension. Raises RuntimeError with the reason."""
    global _module
    if _module is not None:
        return _module
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available() and not build_settings().build_without_gpu:
        raise RuntimeError("kdtree_verify: CUDA is not available; the CUDA kernel cannot run here")
    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError("kdtree_verify: nvcc not found (set CUDA_HOME) to build the kernel")
    missing = [s for s in SOURCES if not (CSRC_DIR / s).is_file()]
    if missing:
        raise RuntimeError(
            f"kdtree_verify: the CUDA sources {missing} are not in {CSRC_DIR}; reinstall the "
            "kdtree-verify package (its wheel carries kdtree_verify/csrc)"
        )
    archs = cuda_archs()
    host_flags, link_flags = _toolkit_gaps(cpp_extension.CUDA_HOME)
    _module = cpp_extension.load(
        name=EXTENSION_NAME,
        sources=[str(CSRC_DIR / s) for s in SOURCES],
        extra_cflags=["-O2", *host_flags],
        extra_ldflags=link_flags,
        extra_cuda_cflags=nvcc_flags(archs),
        extra_include_paths=[str(CSRC_DIR)],
        build_directory=str(build_dir()),
        verbose=verbose,
    )
    return _module


def main() -> int:
    print(f"building {EXTENSION_NAME} for sm_{', sm_'.join(cuda_archs())} in {build_dir()}")
    module = load(verbose=True)
    print(f"built: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
