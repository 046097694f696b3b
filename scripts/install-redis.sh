#!/usr/bin/env bash
# Installs redis-server (Debian's package) when it is missing: the scale-out
# tests start a real one. Run by .ci/run before the tests, and by the test
# harness itself (tests/src/redis.rs) so a fresh clone's `cargo test` works.
# Test binaries run in parallel: a lock makes them install once.
set -euo pipefail
command -v redis-server >/dev/null 2>&1 && exit 0
exec 9>/tmp/socialgate-install-redis.lock
flock 9
command -v redis-server >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get install -y redis-server >&2 \
  || { $SUDO apt-get update >&2 && $SUDO apt-get install -y redis-server >&2; }
# The package may start a system service; the tests start their own.
command -v redis-server >/dev/null 2>&1
