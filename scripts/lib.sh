# Shared settings for scripts/stack, scripts/test and scripts/demo. Sourced, not run.
# Everything here can be overridden from the environment.

SLUICE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Runtime state of the local stack (broker data, PostgreSQL cluster, pid files, logs). Git-ignored.
SLUICE_STACK_DIR="${SLUICE_STACK_DIR:-$SLUICE_ROOT/.stack}"
# Downloads and build output kept between runs and clones (Kafka jars, cargo target dir).
SLUICE_CACHE_DIR="${SLUICE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}"
# One cargo target directory shared by every clone: librdkafka takes minutes to build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SLUICE_CACHE_DIR/target}"

# The one place the Kafka version is pinned.
KAFKA_VERSION="${SLUICE_KAFKA_VERSION:-4.4.0}"
KAFKA_PORT="${SLUICE_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${SLUICE_KAFKA_CONTROLLER_PORT:-19093}"
PG_PORT="${SLUICE_PG_PORT:-55432}"

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Run a command as root: directly when we are root, through sudo otherwise.
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Installs Debian packages (the only way the scripts install system software).
apt_install() {
  log "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# What cargo needs beyond Rust and the system OpenSSL: libcurl's headers, so that librdkafka is
# built with OAuth/OIDC (`sasl.oauthbearer.method = "oidc"`; its configure leaves it out, silently,
# without them: a unit test then fails, naming this). Every script that builds calls it.
ensure_build_deps() {
  [ -e /usr/include/x86_64-linux-gnu/curl/curl.h ] || [ -e /usr/include/curl/curl.h ] \
    || apt_install libcurl4-openssl-dev pkg-config
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The benchmark tool and the release sluice it measures (two builds: the tool's dependencies
# must not change the binary's features). Sets $BENCH and exports SLUICE_BENCH_BINARY and SLUICE_ROOT.
build_bench() {
  ensure_build_deps
  # As scripts/build-release builds it: the binary measured is the binary shipped.
  SLUICE_LINK_LAYOUT=1 cargo build --release --locked --quiet --bin sluice
  cargo build --release --locked --quiet -p sluice-harness --bin sluice-bench
  BENCH="$CARGO_TARGET_DIR/release/sluice-bench"
  export SLUICE_BENCH_BINARY="$CARGO_TARGET_DIR/release/sluice" SLUICE_ROOT
}

# Closes every descriptor above stderr in this (sub)shell: a daemon started from it then holds
# only its own. One inherited from the caller would stay open as long as the daemon runs; a
# `flock` on the stack's lock, say, stays held (scripts/bench restarts the broker under it).
close_inherited_fds() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
}

# True when the pid in file $1 is alive and its command line contains $2
# (guards against a recycled pid after a reboot).
pid_alive() {
  local file=$1 marker=$2 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$marker"
}

# Stop the process whose pid is in file $1: SIGTERM, wait up to $2 seconds, then SIGKILL.
stop_pid_file() {
  local file=$1 grace=${2:-30} pid i
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid did not stop within ${grace}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
}
