# Shared by start.sh, serve.sh and test.sh: a virtual environment with the pinned requirements,
# the services they start and the secrets they keep.
# Sourced, not run.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$REPO_ROOT/.venv}"
PY="$VENV/bin/python"

ensure_venv() {
    local requirements="$1"
    if [ ! -x "$PY" ]; then
        echo "==> creating virtual environment in $VENV"
        python3 -m venv "$VENV"
    fi
    # Reinstall only when the requirements changed since the last install.
    local stamp="$VENV/.installed-$(basename "$requirements")"
    local digest
    digest="$(cat "$REPO_ROOT/requirements.txt" "$requirements" | sha256sum | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ]; then
        echo "==> installing $(basename "$requirements")"
        "$PY" -m pip install --quiet --disable-pip-version-check -r "$requirements"
        echo "$digest" > "$stamp"
    fi
}

ensure_postgres() {
    if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
    echo "==> starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    for _ in $(seq 1 60); do
        pg_isready -q -h 127.0.0.1 -p 5432 && return 0
        sleep 0.5
    done
    echo "PostgreSQL did not become ready" >&2
    return 1
}

ensure_redis() {
    if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
    echo "==> starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
    for _ in $(seq 1 60); do
        redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "Redis did not become ready" >&2
    return 1
}

# Installs the Debian package $1, which the tests named in $2 need, when running as root with
# apt-get; otherwise says what is missing and fails.
install_debian_package() {
    local package="$1" needed_for="$2"
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> installing Debian's $package for $needed_for"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
    else
        echo "$package is missing: install Debian's $package package for $needed_for" >&2
        return 1
    fi
}

ensure_chromium() {
    if command -v chromium >/dev/null 2>&1; then return 0; fi
    install_debian_package chromium "the browser tests"
}

# Prints the secret kept in the file $1, written once (readable by its owner only) from the
# Python expression $2: a key of this machine's own survives a restart and is never committed.
kept_secret() {
    local file="$1" expression="$2"
    if [ ! -s "$file" ]; then
        (umask 077 && "$PY" -c "import secrets; print($expression)" > "$file")
    fi
    cat "$file"
}

# Starts the sandbox module $3 (with its arguments after it) in the background, logging to $2,
# adds it to the caller's pids, and waits up to ten seconds for $1 to answer.
start_sandbox() {
    local health="$1" log="$2"
    shift 2
    "$PY" -m "$@" >"$log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do
        curl -fsS "$health" >/dev/null 2>&1 && break
        sleep 0.1
    done
}

# The chaos test's hosts mode skews one simulated host's clock with Debian's libfaketime
# (harness/chaos/hosts.py), preloaded into every process of that host.
ensure_faketime() {
    if compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null; then return 0; fi
    install_debian_package faketime "the chaos test's skewed host"
}
