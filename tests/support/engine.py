"""A real container engine for the deployment tests: rootful podman, images built once a run.

Where this runs (a Debian machine, CI's kind): podman 4.3 runs rootful containers with
``--runtime runc`` (crun fails on the host's hybrid cgroups) and needs explicit rlimits (the
default ones are refused). No registry is reachable, so the base image is a Debian root made by
``mmdebstrap`` (from the Debian archive, as apt does) and ``podman import``; every other image is
built on it with ``podman build`` and the Python wheels made here by ``pip wheel`` (mounted into
the build, installed with ``--no-index``).

Images are tagged by what they are made of (package list; Containerfile, source tree and build
arguments), so a second test run on the same machine reuses them; within a run each is built at
most once (the session object below memoises). Images of ours older than an hour and not
current, and the untagged build stages that podman keeps, are removed at the start of a session
(an image still used by a container is kept).

Without podman, mmdebstrap or root the tests that need them skip, saying why; with CI=true they
fail instead (``.ci/run`` installs the packages).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support import ROOT, required_tool

ENGINE = ("podman", "--runtime", "runc")
RUN_LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")
LABEL = "io.sparkdiag.test"  # on every container a test starts
REPO = "localhost/sparkdiag-test"  # image names: REPO-base, REPO-image, ...
SUITE = "bookworm"  # its python3 (3.11) matches the cp311 torch wheel CI has
BASE_PACKAGES = ("python3", "python3-venv", "systemd", "systemd-sysv", "procps")
CONTAINERFILES = ROOT / "tests" / "fixtures" / "containerfiles"
# What the sparkdiag image is built from (a change in any of these builds a new image).
SOURCE_PATHS = (
    "Containerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "sparkdiag",
    "grafana",
    "prometheus",
    "systemd",
)
STALE_AFTER_SECONDS = 3600
T = TypeVar("T")


def require_engine() -> None:
    """Skip (fail in CI) unless rootful podman and mmdebstrap are here."""
    required_tool("podman", "podman runc")
    required_tool("runc", "runc")
    required_tool("mmdebstrap", "mmdebstrap")
    if os.geteuid() != 0:
        message = "the container tests run rootful podman: run them as root"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def podman(
    *args: str, timeout: float = 120, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``podman --runtime runc ARGS``; raises with podman's stderr when ``check`` fails."""
    done = subprocess.run(
        [*ENGINE, *args], capture_output=True, text=True, timeout=timeout, input=input
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} ... exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def _tree_bytes(paths: Sequence[str]) -> bytes:
    """Names and contents of every file under ``paths`` (relative to the checkout), sorted."""
    chunks: list[bytes] = []
    for name in paths:
        top = ROOT / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts:
                continue
            chunks += [str(path.relative_to(ROOT)).encode(), path.read_bytes()]
    return b"\0".join(chunks)


def image_exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


class Images:
    """The images of one test session, each built on first use and then shared."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._built: dict[str, str] = {}
        self._wheelhouse: Path | None = None
        self._prune()

    # -- building blocks

    def wheelhouse(self) -> Path:
        """sparkdiag's wheel and every dependency, with CPU torch, from pip as configured here."""
        if self._wheelhouse is None:
            target = self.workdir / "wheels"
            target.mkdir()
            done = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                 "--wheel-dir", str(target), "torch==2.13.0", "setuptools>=68",
                 f"{ROOT}[probe]"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, f"pip wheel failed:\n{done.stderr[-3000:]}"
            assert list(target.glob("sparkdiag-*.whl")), "pip wheel made no sparkdiag wheel"
            self._wheelhouse = target
        return self._wheelhouse

    def base(self) -> str:
        """Debian with python3, venv, systemd: made by mmdebstrap, imported into podman."""
        if "base" not in self._built:
            key = _digest(SUITE.encode(), " ".join(BASE_PACKAGES).encode(), b"minbase")
            tag = f"{REPO}-base:{key}"
            if not image_exists(tag):
                tarball = self.workdir / "base.tar"
                done = subprocess.run(
                    ["mmdebstrap", "--variant=minbase", "--quiet",
                     f"--include={','.join(BASE_PACKAGES)}", SUITE, str(tarball)],
                    capture_output=True, text=True, timeout=900,
                )  # fmt: skip
                assert done.returncode == 0, f"mmdebstrap failed:\n{done.stderr[-3000:]}"
                podman("import", "--change", 'CMD ["/bin/bash"]', str(tarball), tag, timeout=300)
                tarball.unlink()
            self._built["base"] = tag
        return self._built["base"]

    def _build(
        self,
        name: str,
        containerfile: Path,
        build_args: dict[str, str],
        context: Path = ROOT,
        extra: bytes = b"",
    ) -> str:
        key = _digest(
            containerfile.read_bytes(),
            json.dumps(build_args, sort_keys=True).encode(),
            _tree_bytes(SOURCE_PATHS),
            extra,
        )
        tag = f"{REPO}-{name}:{key}"
        if not image_exists(tag):
            args = [arg for k, v in build_args.items() for arg in ("--build-arg", f"{k}={v}")]
            podman(
                # --no-cache: the wheels come in through a volume, which podman's layer cache
                # does not see; a cached layer would keep an older sparkdiag under a new tag
                "build",
                "--format",
                "docker",
                "--pull=never",
                "--no-cache",
                *RUN_LIMITS,
                "--volume",
                f"{self.wheelhouse()}:/wheels:ro",
                "--label",
                f"{LABEL}=1",
                "--file",
                str(containerfile),
                "--tag",
                tag,
                *args,
                str(context),
                timeout=900,
            )
        return tag

    # -- the images the tests use

    def sparkdiag(self, probe: bool = False) -> str:
        """The shipped Containerfile on the Debian base, offline; ``probe`` adds CPU torch."""
        name = "image-probe" if probe else "image"
        if name not in self._built:
            base = self.base()
            self._built[name] = self._build(
                name,
                ROOT / "Containerfile",
                {
                    "BASE": base,
                    "EXTRAS": "probe" if probe else "",
                    "PIP_OPTIONS": "--no-index --find-links /wheels",
                },
                extra=base.encode(),
            )
        return self._built[name]

    def systemd(self) -> str:
        """The Debian base with sparkdiag installed as docs/deploy.md's "Running as a service"
        says."""
        if "systemd" not in self._built:
            base = self.base()
            self._built["systemd"] = self._build(
                "systemd",
                CONTAINERFILES / "systemd.Containerfile",
                {"BASE": base},
                extra=base.encode(),
            )
        return self._built["systemd"]

    def _prune(self) -> None:
        """Remove our images that are neither recent nor in use (best effort), and the
        untagged build stages that podman build keeps (they carry our label)."""
        podman(
            "image",
            "prune",
            "--force",
            "--filter",
            f"label={LABEL}=1",
            "--filter",
            f"until={STALE_AFTER_SECONDS}s",
            check=False,
        )
        listing = podman(
            "images", "--format", "json", "--filter", f"reference={REPO}-*", check=False
        )
        try:
            images = json.loads(listing.stdout or "[]")
        except json.JSONDecodeError:
            return
        now = time.time()
        for image in images:
            created = float(image.get("Created") or now)
            if now - created > STALE_AFTER_SECONDS and "-base:" not in " ".join(
                image.get("Names") or []
            ):
                podman("rmi", image["Id"], check=False)


@contextlib.contextmanager
def container(
    image: str, *args: str, run_options: Sequence[str] = (), name: str | None = None
) -> Iterator[str]:
    """``podman run -d`` with our label; yields the container name; always removed after."""
    name = name or f"sparkdiag-test-{uuid.uuid4().hex[:10]}"
    podman(
        "run",
        "-d",
        "--name",
        name,
        "--label",
        f"{LABEL}=1",
        *RUN_LIMITS,
        *run_options,
        image,
        *args,
    )
    try:
        yield name
    finally:
        podman("rm", "--force", "--time", "0", name, check=False, timeout=60)


def containers_with_label(label: str) -> list[str]:
    """IDs of every container (running or not) that carries ``label`` (KEY or KEY=VALUE)."""
    done = podman("ps", "--all", "--quiet", "--filter", f"label={label}")
    return done.stdout.split()


def wait_for(predicate: Callable[[], T], seconds: float, every: float = 0.2) -> T:
    """Poll ``predicate()`` until it returns something truthy; return it (or the last value)."""
    end = time.monotonic() + seconds
    value = predicate()
    while not value and time.monotonic() < end:
        time.sleep(every)
        value = predicate()
    return value
