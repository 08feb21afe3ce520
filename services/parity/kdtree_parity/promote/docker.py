"""The ``docker`` executable on PATH: every Docker action of a promotion goes through it, so the
flow runs against a real daemon or a stand-in alike."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from kdtree_parity.promote.errors import PromotionError
from kdtree_parity.promote.progress import step


@dataclass
class Docker:
    """The ``docker`` executable; every call is logged and a failure raises with its stderr."""

    executable: str = "docker"
    env: Mapping[str, str] = field(default_factory=dict)

    def with_env(self, env: Mapping[str, str]) -> Docker:
        """The same executable with ``env`` added to what every call sees."""
        return Docker(self.executable, {**self.env, **env})

    def run(
        self, *args: str, check: bool = True, capture: bool = True
    ) -> subprocess.CompletedProcess:
        command = [self.executable, *args]
        step("$ " + " ".join(command))
        try:
            result = subprocess.run(
                command,
                env={**os.environ, **self.env},
                text=True,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None,
                check=False,
            )
        except FileNotFoundError as exc:
            raise PromotionError(
                f"'{self.executable}' was not found on PATH: install Docker with the compose plugin"
            ) from exc
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout or "").strip()
            raise PromotionError(
                f"'{' '.join(command)}' exited {result.returncode}"
                + (f": {detail[-2000:]}" if detail else "")
            )
        return result

    def image_digest(self, ref: str) -> str:
        """The content-addressed image id (``sha256:...``) that ``ref`` names right now."""
        out = self.run("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", out):
            raise PromotionError(f"docker image inspect {ref} gave no sha256 image id: {out!r}")
        return out

    def repo_digests(self, ref: str) -> list[str]:
        out = self.run("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout
        try:
            digests = json.loads(out or "null")
        except json.JSONDecodeError as exc:
            raise PromotionError(f"unreadable RepoDigests for {ref}: {out!r}") from exc
        return [str(d) for d in digests or []]
