"""Promote an inference image to ``stable`` only when the parity gate passes; roll back by record.

``python -m kdtree_parity.promote promote`` builds the candidate image (tagged by git revision),
gates it with the compose pair and the parity sidecar, and only on a pass tags its digest
``stable`` (pushing when asked) and writes a promotion record; a fail or an error verdict tags
nothing, writes a ``refused`` record and exits non-zero with the reasons. ``gate`` is the build
and the gate alone; ``rollback`` points ``stable`` back at the digest stable before, as the
records tell it. ``--gate-profile demo`` runs the same path with the CPU reference engine
standing in for the inference image, which is how it is exercised on a machine without a GPU.

Modules: ``docker`` (the ``docker`` executable: every Docker action goes through it, so a real
daemon and a stand-in are driven alike), ``registry``, ``records`` (the typed records and the
append-only promotions/ directory), ``gate_report`` (the sidecar's verdict, read through the
report's schema), ``flow``, ``cli``, ``settings`` (the KDTREE_* variables).

It runs with the kdtree-parity package and its dependencies installed (the venv, or the parity
image), not with a bare Python: the gate's report is read through the report's own pydantic
schema and the settings are pydantic-settings, so it is not importable without them.
"""
