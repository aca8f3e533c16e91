#!/usr/bin/env bash
# System set-up: install what the tests and the served stack need beyond pip, from Debian's packages.
#   openssh-server  real sshd on loopback for the on-prem (SSH) executor tests
#   postgresql-15   the served stack's database (`make up`) and its tests
#   redis-server    the served stack's messaging between Prefect's API and services (prefect-redis)
#   chromium        headless browser for the UI tests
# Idempotent and quick when all is there (no apt call at all). Without root or apt it installs
# nothing and prints the one command to run. Used by `make test` and `.ci/run`.
set -euo pipefail

PG_BIN="${HYBRIDTRAIN_PG_BIN:-/usr/lib/postgresql/15/bin}"
missing=()
{ command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; } || missing+=(openssh-server)
[ -x "$PG_BIN/postgres" ] && [ -x "$PG_BIN/initdb" ] || missing+=(postgresql-15)
{ command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; } || missing+=(redis-server)
{ command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } || missing+=(chromium)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-system: missing ${missing[*]}; install them with:  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "setup-system: installing ${missing[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# postgresql's postinst would create and start a cluster on port 5432; the project starts its own.
if [[ " ${missing[*]} " == *" postgresql-15 "* ]] && [ ! -e /etc/postgresql-common/createcluster.conf.d/hybridtrain.conf ]; then
  mkdir -p /etc/postgresql-common/createcluster.conf.d
  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf.d/hybridtrain.conf
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-system: installed ${missing[*]}" >&2
