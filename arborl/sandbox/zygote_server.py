"""The warm interpreter of the ``zygote`` backend (runs inside bwrap; stdlib only, shipped as source).

Started by :class:`arborl.sandbox.zygote.ZygoteBackend` as root inside a bwrap with its own
mount/net/ipc/uts/pid namespaces. It receives a config (the launcher source, a seccomp BPF
program, limits, cgroup layout), imports the usual modules once, then serves one request at a time:

1. before the request arrives: make its cgroups (memory + pids) below the worker's bind-mounted
   cgroup dirs, ``unshare`` fresh pid/mount/ipc/uts namespaces (and, with a proxy, net), fork
   the *runner* (pid 1 of the new pid namespace, so all its descendants die with it), and
   ``setns`` back to its own namespaces; the runner brings up the loopback of its new network
   namespace (the relay listens there), mounts a size-capped tmpfs on ``/tmp`` and ``/dev/shm``
   and a fresh ``/proc``, joins the cgroups, hides them, sets rlimits, closes every other fd, drops to
   a uid/gid of its own (one of the worker's leased uids, see below), makes itself
   non-dumpable, installs seccomp, and waits on a socket of its own, whose other end the
   zygote passes to the caller (over a second socket, so it never mixes with replies);
2. the caller sends its fds (stdout, stderr, request memfd, stdin memfd) straight to a waiting
   runner, which reads the request and runs the snippet, and tells the zygote which runner
   started;
3. enforce the wall deadline (SIGKILL of pid 1 ends the namespace) and answer the caller with
   the status and CPU time (JSON);
4. as background work -- while no request waits, or while a runner works -- fork the next
   runners (two are kept ready) and release answered requests' namespaces and cgroups.

The host leases a few uids per worker (``config["uids"]``); each runner takes a free one and
its uid is free again only once its request is torn down (its pid namespace is gone and its
cgroups are empty), so no two live runners ever share a uid.

The zygote never holds secrets: it starts with an empty environment and only ever receives code,
limits. See :mod:`arborl.sandbox.zygote` for the threat model.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import json
import marshal
import os
import pickle  # only ever loads data written by the trusted parent
import resource
import select
import signal
import socket
import struct
import sys
import time
import types

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID = 0x20000, 0x4000000, 0x8000000, 0x20000000
CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK = 0x8914, 0x1, 0x8
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
MNT_DETACH = 2
CG_MOUNT = "/run/arborl/cg"
READY_RUNNERS = 2  # runners forked ahead of their requests
MAX_TEARDOWN_BACKLOG = 4  # answered requests whose teardown may wait for idle time
# Uids a worker needs: the ready runners, the running one, and a full teardown backlog + 1.
UIDS_PER_WORKER = READY_RUNNERS + MAX_TEARDOWN_BACKLOG + 2
SETUP_FAILED = 125  # runner exit status when the sandbox setup (not the snippet) failed
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# The one copy: zygote.py and _wasm_runtime.py import it from here, since this module runs in
# the sandbox as source text and so cannot import it from anywhere else.
def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (``EOFError`` if the peer closed)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the peer closed the socket")
        buf += chunk
    return bytes(buf)


def send_msg(sock: socket.socket, obj: dict) -> None:
    """Send one length-prefixed JSON message."""
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!Q", len(data)) + data)


class Server:
    """Serves requests on one socket; state is only the config sent by the parent."""

    def __init__(self, sock: socket.socket, ann: socket.socket, config: dict) -> None:
        self.sock = sock
        self.ann = ann
        self.cfg = config
        self.launcher = types.ModuleType("arborl_launcher")
        exec(compile(config["launcher_src"], "arborl_launcher.py", "exec"), self.launcher.__dict__)
        self.load_seccomp = self.launcher.bpf_loader(config["bpf"])
        self.cg_dirs = [os.path.join(CG_MOUNT, str(i)) for i in range(config["cg_count"])]
        self.counter = 0
        # Runners waiting for the next requests, and the namespace fds + cgroups + uid of
        # answered requests still to be released.
        self.ready: dict[int, tuple[list[int], list[str], int]] = {}
        self.teardown: collections.deque[tuple[list[int], list[str], int]] = collections.deque()
        self.free_uids = collections.deque(config["uids"])
        # The zygote's own namespaces, to return to after each fork (see fork_into_namespaces).
        self.home_ns = [
            (os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag)
            for name, flag in (
                ("pid", CLONE_NEWPID),
                ("mnt", CLONE_NEWNS),
                ("ipc", CLONE_NEWIPC),
                ("uts", CLONE_NEWUTS),
                ("net", CLONE_NEWNET),
            )
            if flag != CLONE_NEWNET or config["netns_per_run"]
        ]
        for name in config["preload"]:
            try:
                __import__(name)
            except Exception:  # an optional module that is not installed
                continue

    # -- cgroups -------------------------------------------------------------------------
    def make_cgroups(self) -> list[str]:
        """Create the next request's memory and pids cgroups below the worker's dirs."""
        self.counter += 1
        dirs = [os.path.join(d, f"r{self.counter}") for d in self.cg_dirs]
        mem, pids = self.cfg["memory_mb"] << 20, self.cfg["pids"]
        v2 = self.cfg["cg_version"] == 2
        for d in dirs:
            os.mkdir(d)
            files = os.listdir(d)
            writes = [("pids.max", str(pids))]
            if v2:
                writes += [("memory.max", str(mem)), ("memory.swap.max", "0")]
            else:
                writes += [("memory.limit_in_bytes", str(mem)), ("memory.memsw.limit_in_bytes", str(mem))]
            for name, value in writes:
                if name in files:
                    try:
                        with open(os.path.join(d, name), "w") as fh:
                            fh.write(value)
                    except OSError:
                        if "memsw" not in name and "swap" not in name:
                            raise
        return dirs

    def oom_killed(self, dirs: list[str]) -> bool:
        """Whether the kernel OOM-killed anything in the request's memory cgroup."""
        for d in dirs:
            for name in ("memory.oom_control", "memory.events"):
                try:
                    with open(os.path.join(d, name)) as fh:
                        if any(ln.startswith("oom_kill ") and int(ln.split()[1]) > 0 for ln in fh):
                            return True
                except OSError:
                    continue
        return False

    def remove_cgroups(self, dirs: list[str]) -> None:
        """Kill anything left in the request's cgroups and remove them."""
        end = time.monotonic() + 5.0  # a killed task leaves the group only once reaped: slow under load
        for d in dirs:
            while True:
                with open(os.path.join(d, "cgroup.procs")) as fh:
                    pids = [int(p) for p in fh.read().split()]
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    if time.monotonic() > end:
                        break
                    time.sleep(0.001)

    # -- one request ---------------------------------------------------------------------
    def serve_one(self) -> None:
        """Supervise one run: the caller names the runner it has just handed its fds to.

        Runners are forked, jailed and dropped to their own uid before any request exists, and
        each one's socket is passed to the caller (:meth:`background_step`), which sends the
        runner its stdout, stderr, request and stdin memfds directly, then ``START`` + the
        runner's pid here.
        The request itself is only ever read by the runner, so the zygote's memory, which every
        later runner inherits, never holds another run's code or files.
        """
        data = recv_exact(self.sock, 16)
        start = time.monotonic()
        tag, (pid,) = data[:8], struct.unpack("!Q", data[8:])
        if tag != b"START\0\0\0" or pid not in self.ready:
            send_msg(self.sock, {"exit_code": None, "error": f"zygote: malformed request {data!r}"})
            return
        slot = self.ready.pop(pid)
        report = self.wait(pid, start)
        report["memory_exceeded"] = self.oom_killed(slot[1])
        # The runner is pid 1 of its namespace: nothing inside can SIGKILL it, and nothing outside
        # but root (no other sandbox has its uid). A SIGKILL the zygote did not send at the wall
        # deadline is the kernel's: the OOM killer, or the CPU limit (soft == hard, so SIGKILL).
        # Its rusage cannot tell: it read as low as 0.84 s for a 1 s RLIMIT_CPU kill.
        if report["exit_code"] == -signal.SIGKILL and not report["memory_exceeded"]:
            report["timed_out"] = True
        send_msg(self.sock, report)
        # Tearing the request down (dropping the last reference to its mount/ipc namespaces
        # unmounts its tmpfs, an RCU wait, then its cgroups go) is background work, like forking
        # the next runners; a bounded backlog is cleared here at once.
        self.teardown.append(slot)
        while len(self.teardown) > MAX_TEARDOWN_BACKLOG:
            self.background_step()

    def background_pending(self) -> bool:
        """Whether runners are missing or finished requests still await their teardown."""
        return len(self.ready) < READY_RUNNERS or bool(self.teardown)

    def background_step(self) -> None:
        """One unit of background work: fork a missing runner first, else tear one request down.

        The zygote runs these while no request waits, and while a runner works (when requests
        come back to back there is no idle time; the second core runs them beside the runner).
        """
        if len(self.ready) < READY_RUNNERS:
            pid, chan, slot = self.prefork()
            self.ready[pid] = slot
            try:
                socket.send_fds(self.ann, [struct.pack("!Q", pid)], [chan.fileno()])
            except OSError as exc:
                raise EOFError("caller closed the runner socket") from exc
            finally:
                chan.close()  # the caller holds it now; the runner sees EOF if the caller drops it
        elif self.teardown:
            self.tear_down_one()

    def tear_down_one(self) -> None:
        """Release the oldest answered request: its namespaces, its cgroups, then its uid."""
        held, dirs, uid = self.teardown.popleft()
        for fd in held:
            os.close(fd)
        self.remove_cgroups(dirs)
        self.free_uids.append(uid)

    def idle_work(self) -> None:
        """Do background work until it is done or a request is waiting on the socket."""
        while self.background_pending() and not select.select([self.sock], [], [], 0)[0]:
            self.background_step()

    def prefork(self) -> tuple[int, socket.socket, tuple[list[int], list[str], int]]:
        """Make the next request's cgroups and runner; the runner waits for its fds.

        Returns:
            The runner's pid, the socket its fds go through, and what to release once the
            request is answered: its namespace fds, its cgroup directories and its uid.
        """
        while not self.free_uids and self.teardown:
            self.tear_down_one()  # every uid still belongs to an answered request: free one
        uid = self.free_uids.popleft()  # IndexError only if the host leased too few uids
        dirs = self.make_cgroups() if self.cg_dirs else []
        chan, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid, held = self.fork_into_namespaces(child_end, chan, dirs, uid)
        finally:
            child_end.close()
        return pid, chan, (held, dirs, uid)

    def fork_into_namespaces(
        self, chan: socket.socket, other: socket.socket, dirs: list[str], uid: int
    ) -> tuple[int, list[int]]:
        """Fork the runner as pid 1 of fresh pid/mount/ipc/uts (and, with a proxy, net) namespaces.

        ``unshare`` also moves the zygote itself into the new mount/ipc/uts/net namespaces (and sets
        its children's pid namespace), so it returns to its own ones with ``setns`` right after
        the fork. This avoids an intermediate process per request. The zygote keeps an fd on the
        request's mount and ipc namespaces, so their teardown does not delay the runner's exit.

        Returns:
            The runner's pid and the namespace fds to close once the caller has its answer.
        """
        sys.stdout.flush()
        sys.stderr.flush()
        # With a proxy, a network namespace per run: inet sockets are allowed then, and TCP state
        # outlives its processes (TIME_WAIT), so a shared one would show the next run what this
        # one connected to. Without a proxy the filter refuses every inet socket, and runs keep
        # the worker's empty one (a new one costs ~1.5 ms of CPU per run). Made ahead, like the rest.
        net = CLONE_NEWNET if self.cfg["netns_per_run"] else 0
        _check(_libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | net), "unshare")
        held = [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC) for ns in ("mnt", "ipc")]
        try:
            pid = os.fork()
            if pid == 0:
                other.close()
                self.runner(chan, dirs, uid)
        finally:
            for fd, flag in self.home_ns:
                _check(_libc.setns(fd, flag), "setns back to the zygote's namespaces")
        return pid, held

    def wait(self, runner: int, start: float) -> dict:
        """Wait for the runner until the wall deadline (then SIGKILL it); report its status."""
        report: dict = {"exit_code": None, "timed_out": False, "cpu_s": 0.0, "error": None}
        pidfd = os.pidfd_open(runner)
        try:
            while self.background_pending() and not select.select([pidfd], [], [], 0)[0]:
                if time.monotonic() - start > self.cfg["wall_s"]:
                    break
                self.background_step()
            remaining = self.cfg["wall_s"] - (time.monotonic() - start)
            if not select.select([pidfd], [], [], max(0.0, remaining))[0]:
                report["timed_out"] = True
                os.kill(runner, signal.SIGKILL)  # pid 1 of the namespace: everything in it dies
        finally:
            os.close(pidfd)
        _, status, usage = os.wait4(runner, 0)
        code = os.waitstatus_to_exitcode(status)
        cpu = usage.ru_utime + usage.ru_stime
        report.update(exit_code=code, cpu_s=cpu)
        return report

    def runner(self, chan: socket.socket, dirs: list[str], uid: int) -> None:
        """Pid 1 of the request's namespace: jail itself, drop privileges, await and run the request.

        Everything up to the seccomp filter happens before the request exists; then the runner
        (``uid`` by now) blocks until the caller passes it its stdout, stderr, request memfd and
        stdin memfd. A setup failure is reported on the caller's stderr once they arrive.
        """
        failure: BaseException | None = None
        try:
            self.jail(dirs)
            keep = chan.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            self.launcher.make_undumpable()  # the uid change did so too, unless suid_dumpable != 0
            self.load_seccomp()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failure = exc
        try:
            _, fds, _, _ = socket.recv_fds(chan, 8, 4)
        except BaseException:  # noqa: BLE001 - the zygote is gone: nothing to run, nobody to tell
            os._exit(SETUP_FAILED)
        if len(fds) != 4:
            os._exit(0)  # the zygote stopped without using this runner
        try:
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.dup2(fds[3], 0)
            if failure is not None:
                raise failure
            request = marshal.loads(self.launcher.read_fd(fds[2]))
            os.closerange(3, 1 << 16)
            self.launcher.prepare(request)
        except BaseException as exc:  # noqa: BLE001 - report any setup failure on stderr
            os.write(2, f"arborl-zygote: sandbox setup failed: {exc!r}\n".encode())
            os._exit(SETUP_FAILED)
        self.launcher.run_snippet(request["code"])

    def jail(self, dirs: list[str]) -> None:
        """Loopback, mounts, cgroups and rlimits of one request (as root, inside the new namespaces)."""
        os.setsid()
        if self.cfg["netns_per_run"]:  # lo of a new netns is down, and the relay listens there
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK))
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        opts = f"size={self.cfg['disk_mb'] << 20},mode=1777".encode()
        for path in (b"/tmp", b"/dev/shm"):
            _check(_libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"mount {path!r}")
        _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        for d in dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as fh:
                fh.write("0")
        for d in self.cg_dirs:
            _check(_libc.umount2(d.encode(), MNT_DETACH), f"umount {d}")
        cpu = int(self.cfg["cpu_s"] + 0.999)
        fsize = self.cfg["disk_mb"] << 20
        limits = [
            # soft == hard: pid 1 ignores SIGXCPU, so the limit must end it by SIGKILL at once.
            (resource.RLIMIT_CPU, (cpu, cpu)),
            (resource.RLIMIT_FSIZE, (fsize, fsize)),
            (resource.RLIMIT_CORE, (0, 0)),
            (resource.RLIMIT_NOFILE, (1024, 1024)),
        ]
        if not dirs:  # no cgroups on this machine: fall back to address-space and process rlimits
            mem = (self.cfg["memory_mb"] + 64) << 20
            limits += [(resource.RLIMIT_AS, (mem, mem)), (resource.RLIMIT_NPROC, (self.cfg["pids"],) * 2)]
        for which, value in limits:
            resource.setrlimit(which, value)

    def serve_forever(self) -> None:
        """Prepare the first runners, report ready, serve until the caller closes the socket."""
        send_msg(self.sock, {"ready": True, "pid": os.getpid()})
        while True:
            try:
                self.idle_work()
                self.serve_one()
            except EOFError:
                break
        for runner, slot in self.ready.items():  # never used: stop them
            with contextlib.suppress(OSError):
                os.kill(runner, signal.SIGKILL)
            os.waitpid(runner, 0)
            self.teardown.append(slot)
        self.ready.clear()
        while self.teardown:
            self.tear_down_one()  # not background_step(): that would fork new runners first


def main() -> None:
    """Entry point: ``python3 -I -c SOURCE SOCKET_FD RUNNER_SOCKET_FD``."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    ann = socket.socket(fileno=int(sys.argv[2]))
    (size,) = struct.unpack("!Q", recv_exact(sock, 8))
    config = pickle.loads(recv_exact(sock, size))
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    Server(sock, ann, config).serve_forever()


if __name__ == "__main__":
    main()
