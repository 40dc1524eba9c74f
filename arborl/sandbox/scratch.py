"""Emptying a scratch directory that a snippet has shaped to resist it.

Warm sandboxes (the docker runner, the wasm workers) reuse one scratch directory for many runs
and empty it in between. A snippet controls everything in it: nesting thousands of directories
deep (``shutil.rmtree`` and ``os.walk`` recurse and raise ``RecursionError``; the paths outgrow
``PATH_MAX``), directories without read or write permission, symlinks to elsewhere. :func:`wipe`
walks the tree iteratively with one directory fd at a time (a stack of names, not of fds or
paths), so neither depth nor path length nor the fd limit stops it; it never follows a symlink,
and makes each directory it owns writable and readable before emptying it. Run it only once
every process that could write to the directory is dead.

Standard library only, and self-contained: the docker runner ships this file's source into the
container (``_docker_image.RUNNER``), so it must not import arborl.
"""

import contextlib
import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, parent: int) -> int:
    """Open subdirectory ``name`` of ``parent``, granting ourselves access first if needed."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)  # a directory (scandir said so): no symlink to follow
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-directory in ``fd``; return the names of its subdirectories."""
    # Unlinking needs write permission on the directory itself. A directory that is not ours
    # (the scratch root may belong to root) was never restricted by the snippet.
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o700)
    subdirs = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    return subdirs


def wipe(root: str) -> bool:
    """Remove everything below ``root`` (``root`` itself stays).

    Each directory is listed once, so a wide tree costs linear time as a deep one does.

    Args:
        root: The scratch directory.

    Returns:
        ``True`` if ``root`` is empty afterwards; ``False`` if something could not be removed
        (the caller must then not reuse the sandbox).
    """
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return False
    # One frame per level from root down to fd: (fd's name in its parent, the parent's
    # subdirectories still to empty). Names only: no fd or path grows with the depth.
    stack: list[tuple[str, list[str]]] = []
    try:
        pending = _clear_files(fd)
        while True:
            if pending:
                name = pending.pop()
                child = _open_dir(name, fd)
                os.close(fd)
                fd = child
                stack.append((name, pending))
                pending = _clear_files(fd)
            elif stack:
                name, pending = stack.pop()
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(name, dir_fd=fd)
            else:
                return not os.listdir(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
