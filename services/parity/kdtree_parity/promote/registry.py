"""The registry an image is pushed to, and whether it answers before anything is gated."""

from __future__ import annotations

import urllib.error
import urllib.request

from kdtree_parity.promote.errors import PromotionError


def registry_host(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first component with a dot, a
    colon or ``localhost`` is a host; anything else lives on Docker Hub)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "registry-1.docker.io"


def check_registry(image: str, timeout_s: float = 10.0) -> None:
    """Fail before the gate, and so before any tag or push, when the registry does not answer.

    Any HTTP answer from ``/v2/`` counts as up (401 asks for the login ``docker push`` brings);
    HTTPS is tried first, then plain HTTP, which Docker uses for loopback registries.
    """
    host = registry_host(image)
    errors = []
    for scheme in ("https", "http"):
        try:
            with urllib.request.urlopen(f"{scheme}://{host}/v2/", timeout=timeout_s):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError) as exc:
            errors.append(f"{scheme}: {getattr(exc, 'reason', exc)}")
    raise PromotionError(
        f"the registry {host} of {image} does not answer ({'; '.join(errors)}): "
        "nothing was gated, tagged or pushed"
    )
