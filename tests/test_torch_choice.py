"""The README's first command (`bash scripts/run.sh`) on a CPU-only Linux laptop takes torch's CPU
build, and on a machine with an NVIDIA GPU the CUDA build: scripts/run.sh sets up through
scripts/setup.sh, which asks scripts/torch_choice.sh. Here the choice runs with a faked
`nvidia-smi` (and `uname`) on the PATH; nothing is downloaded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def fake(bin_dir: Path, name: str, body: str) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


def choice(bin_dir: Path) -> str:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir)}
    out = subprocess.run(["bash", str(REPO / "scripts/torch_choice.sh")], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("uname", "nvidia_smi", "wanted"),
    [
        ("Linux x86_64", None, "cpu"),  # an ordinary laptop: no GPU, no driver
        ("Linux x86_64", "echo 'GPU 0: NVIDIA H100 (UUID: GPU-0)'", "default"),  # the CUDA build
        ("Linux x86_64", "echo 'NVIDIA-SMI has failed' >&2; exit 9", "cpu"),  # a driver tool, no GPU behind it
        ("Darwin arm64", None, "default"),  # PyPI's macOS torch is the CPU build already
        ("Linux aarch64", None, "default"),
    ],
    ids=["laptop", "gpu", "driver-without-gpu", "mac", "arm"],
)
def test_setup_picks_the_cpu_wheel_only_where_there_is_no_nvidia_gpu(tmp_path, uname, nvidia_smi, wanted):
    system, machine = uname.split()
    fake(tmp_path, "uname", f'case "$1" in -s) echo {system};; -m) echo {machine};; *) echo {system};; esac')
    if nvidia_smi is not None:
        fake(tmp_path, "nvidia-smi", nvidia_smi)
    assert choice(tmp_path) == wanted


def test_the_readme_run_command_sets_up_through_that_choice():
    readme = (REPO / "README.md").read_text()
    first = readme.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert first == "bash scripts/run.sh"
    run = (REPO / "scripts/run.sh").read_text()
    setup = (REPO / "scripts/setup.sh").read_text()
    assert "bash scripts/setup.sh" in run and run.index("scripts/setup.sh") < run.index("two-pot-kitchen \"$@\"")
    cpu_branch = setup.split('$(bash scripts/torch_choice.sh)" = cpu', 1)[1].split("\nfi", 1)[0]
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu_branch
    assert setup.index("torch_choice.sh") < setup.index("pip install -q -e")  # torch first, then the app
