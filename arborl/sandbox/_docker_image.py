"""Builds the docker sandbox image locally, without a registry: ``docker import`` of a tiny rootfs.

The rootfs holds only what ``python3`` needs: the host's interpreter binary, the shared libraries
that it and its stdlib extension modules load (found with ``ldd``), the stdlib (without tests,
tkinter, idle and the build config), ``/etc/passwd`` and ``/etc/group`` with ``nobody``, and an
empty ``/scratch`` mount point. No shell, no package manager, no setuid binary.

The tar is reproducible for a given host interpreter: entries sorted, owner root, mtimes those of the
host files (stdlib ``.pyc`` files are validated against them). The tag
``arborl/sandbox-python:<IMAGE_SCHEMA>-py<version>`` changes whenever this recipe or the
interpreter version changes, so an old image is never reused by mistake.
"""

from __future__ import annotations

import io
import os
import platform
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator

from arborl.sandbox.base import SandboxError

IMAGE_SCHEMA = 2
"""Bump when the recipe below changes."""

HOST_PYTHON = "/usr/bin/python3"
"""The distribution's interpreter (its stdlib lives on world-readable system paths)."""

_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                "dist-packages", "__phello__", "pydoc_data"}
_PASSWD = b"root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/scratch:/usr/sbin/nologin\n"
_GROUP = b"root:x:0:\nnogroup:x:65534:\n"


def _host_python_version(python: str = HOST_PYTHON) -> tuple[str, str]:
    """(full version, stdlib dir) of the host interpreter the image is made from."""
    if not os.path.exists(python):
        raise SandboxError(f"{python} not found; install the distribution's python3 (apt-get install python3)")
    out = subprocess.run(
        [python, "-I", "-S", "-c", "import sys,sysconfig;print(sys.version.split()[0]);print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True, text=True, check=True).stdout.split()
    return out[0], out[1]


def image_tag(python: str = HOST_PYTHON) -> str:
    """Tag of the image built from ``python`` with the current recipe."""
    return f"arborl/sandbox-python:{IMAGE_SCHEMA}-py{_host_python_version(python)[0]}"


def _ldd(paths: list[str]) -> set[str]:
    """Absolute paths of the shared libraries (and the loader) that ``paths`` load."""
    libs: set[str] = set()
    out = subprocess.run(["ldd", *paths], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        m = re.search(r"(/\S+) \(0x", line)
        if m:
            libs.add(m.group(1))
    return libs


def _walk_stdlib(stdlib: str) -> Iterator[str]:
    for dirpath, dirs, files in os.walk(stdlib):
        rel = os.path.relpath(dirpath, stdlib)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-")]
        dirs.sort()
        for f in sorted(files):
            yield os.path.join(dirpath, f)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int = 0) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), mode, mtime
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def build_rootfs_tar(dest: str, python: str = HOST_PYTHON) -> None:
    """Write the reproducible rootfs tar of the sandbox image to ``dest``."""
    version, stdlib = _host_python_version(python)
    pyc_suffix = ".cpython-{}{}.pyc".format(*version.split(".")[:2])
    binary = os.path.realpath(python)
    stdlib_files = list(_walk_stdlib(stdlib))
    modules = [f for f in stdlib_files if f.endswith(".so")]
    files = {binary: binary, "/usr/bin/python3": binary}
    for lib in _ldd([binary, *modules]):
        files[lib] = os.path.realpath(lib)  # the file's content under the name the loader asks for
    for f in stdlib_files:
        if "__pycache__" in f and not f.endswith(pyc_suffix):
            continue
        files[f] = os.path.realpath(f)
    dirs = {"/etc", "/scratch", "/tmp", "/run", "/run/arborl"}
    for name in files:
        d = os.path.dirname(name)
        while d not in ("/", ""):
            dirs.add(d)
            d = os.path.dirname(d)
    with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in sorted(dirs):
            _add_dir(tar, d, 0o1777 if d in ("/scratch", "/tmp") else 0o755)
        _add_bytes(tar, "/etc/passwd", _PASSWD, 0o644)
        _add_bytes(tar, "/etc/group", _GROUP, 0o644)
        for name in sorted(files):
            with open(files[name], "rb") as fh:
                data = fh.read()
            st = os.stat(files[name])
            # Keep the source mtime: .pyc files record it, and a mismatch makes every import
            # recompile (the read-only root cannot cache the result).
            _add_bytes(tar, name, data, st.st_mode & 0o755, int(st.st_mtime))


def image_exists(*, docker_host: str | None = None, tag: str | None = None) -> bool:
    """Whether the daemon already has the sandbox image."""
    cmd = ["docker", *(["--host", docker_host] if docker_host else []), "image", "inspect",
           tag or image_tag()]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def ensure_image(*, docker_host: str | None = None, python: str = HOST_PYTHON) -> str:
    """Build and ``docker import`` the sandbox image unless the daemon has it; returns its tag."""
    tag = image_tag(python)
    if image_exists(docker_host=docker_host, tag=tag):
        return tag
    if platform.system() != "Linux":
        raise SandboxError("the docker sandbox image is built from a Linux host's python3; build it on Linux")
    with tempfile.TemporaryDirectory(prefix="arborl-image-") as tmp:
        rootfs = os.path.join(tmp, "rootfs.tar")
        build_rootfs_tar(rootfs, python)
        changes = ["ENV PATH=/usr/bin:/bin", "ENV LANG=C.UTF-8", "USER 65534:65534",
                   "WORKDIR /scratch", f"LABEL arborl.sandbox.image={IMAGE_SCHEMA}",
                   'CMD ["/usr/bin/python3"]']
        cmd = ["docker", *(["--host", docker_host] if docker_host else []), "import"]
        for c in changes:
            cmd += ["--change", c]
        r = subprocess.run([*cmd, rootfs, tag], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SandboxError(f"docker import failed ({r.stderr.strip()[:300]}); is dockerd running?")
    return tag


