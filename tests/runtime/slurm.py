"""The local Slurm the ``slurm`` tests use: its partition, and whether a controller and an idle node answer."""

from __future__ import annotations

import os
import shutil
import subprocess

PARTITION = os.environ.get("SLURM_CI_PARTITION", "debug")


def controller_answers() -> str | None:
    """``None`` when a controller and an idle node answer, else the reason they do not."""
    if shutil.which("scontrol") is None:
        return "no Slurm client (scontrol) installed; ./dev test installs it and starts Slurm via scripts/services-up"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
        if ping.returncode != 0:
            said = (ping.stdout.strip() or ping.stderr.strip()).splitlines()
            return f"no Slurm controller answers `scontrol ping` ({said[0] if said else 'no output'})"
        nodes = subprocess.run(["sinfo", "-h", "-p", PARTITION, "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Slurm did not answer: {exc!r}"
    if not any(s.startswith(("idle", "mix")) for s in nodes.stdout.split()):
        return f"no idle node in partition {PARTITION!r} (sinfo: {nodes.stdout.strip()!r})"
    return None
