#!/usr/bin/env bash
# Docker sandbox backend: install the engine, start dockerd if none answers, build the image.
# Idempotent. Needs root (apt, dockerd). No registry is needed: the image is built locally from
# this machine's /usr/bin/python3 (arborl.sandbox._docker_image.ensure_image).
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    echo "docker.sh: run as root (it installs docker.io and starts dockerd)" >&2
    exit 1
fi

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null || [ ! -x /usr/bin/python3 ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io python3
fi

if ! docker version >/dev/null 2>&1; then
    # No systemd here: start the daemon by hand. cgroupfs driver and overlay2 work on cgroup v1
    # hosts; logs go to a file so a failed start can be read.
    log=/var/log/arborl-dockerd.log
    nohup dockerd --exec-opt native.cgroupdriver=cgroupfs >"$log" 2>&1 &
    for _ in $(seq 1 150); do
        docker version >/dev/null 2>&1 && break
        sleep 0.2
    done
    if ! docker version >/dev/null 2>&1; then
        echo "docker.sh: dockerd did not start; last lines of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
fi

python -m arborl.sandbox.docker build-image
