#!/usr/bin/env bash
# Sandbox backends bwrap / zygote / process: bubblewrap, libseccomp and Debian's system Python
# (the interpreter inside the sandbox must be world-readable; a pyenv under /root is not), plus
# the pyseccomp binding in the active venv; checks that the reserved sandbox uid range is unused.
# Idempotent. Needs root for apt.
set -euo pipefail

need_apt=0
command -v bwrap >/dev/null || need_apt=1
[ -x /usr/bin/python3 ] || need_apt=1
# grep without -q reads all input, so ldconfig never dies of SIGPIPE under pipefail
ldconfig -p 2>/dev/null | grep 'libseccomp\.so\.2' >/dev/null || need_apt=1

if [ "$need_apt" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "sandbox.sh: run as root to apt-get install bubblewrap libseccomp2 python3" >&2
        exit 1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap libseccomp2 python3
fi

python -m pip install --quiet "pyseccomp==0.1.2"
python - <<'PY'
import sys

from arborl.sandbox import Sandbox, uids

# Every sandbox runs as a uid of its own from this reserved range (arborl/sandbox/uids.py); a
# host user or container mapping inside it would share a uid with sandboxed code.
r = uids.UID_RANGE
clashes = uids.conflicts()
if clashes:
    sys.exit(f"sandbox.sh: the sandbox uid range {r.start}-{r.stop - 1} is in use on this host: "
             + "; ".join(clashes) + ". Move it with ARBORL_SANDBOX_UIDS=FIRST:COUNT")
print(f"sandbox uids: {r.start}-{r.stop - 1} (free on this host)")
print("sandbox backends available:", ", ".join(Sandbox.available_backends()) or "none")
PY
