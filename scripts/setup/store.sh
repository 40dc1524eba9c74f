#!/usr/bin/env bash
# Trajectory store: servers the store tests start on temporary ports (PostgreSQL, Redis) and the
# Python clients (the `store` extra plus moto, which emulates S3 and DynamoDB). Idempotent. apt needs root; the pip
# part installs into the active virtual environment. No service is left running: each test
# fixture starts its own server (see tests/store/services.py).
set -euo pipefail

need_apt=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v redis-server >/dev/null || need_apt+=(redis-server)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "store.sh: run as root to apt-get install ${need_apt[*]}" >&2
        exit 1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_apt[@]}"
    # The Debian packages start system-wide servers where systemd/init runs; the tests do not use
    # them. Stop them if they came up so they hold no ports or memory.
    if command -v service >/dev/null; then
        service redis-server stop >/dev/null 2>&1 || true
        service postgresql stop >/dev/null 2>&1 || true
    fi
fi

python -m pip install --quiet \
    "psycopg[binary]>=3.2,<3.4" "psycopg-pool>=3.2" "redis>=5,<9" "boto3>=1.34" "pyarrow>=15" "duckdb>=1.1" \
    "pandas>=2" "moto[server]>=5.0"
