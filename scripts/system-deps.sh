#!/usr/bin/env bash
# The system packages the test suite needs that pip cannot provide, from Debian's archive:
# Chromium and its driver (the operator console's browser test drives Debian's Chromium,
# never a downloaded browser), Prometheus (promtool checks the alert rules; a real
# Prometheus scrapes workers and a relay) and nftables (the network fault tests drop packets
# with `nft`, only inside network namespaces they create) and perf (bench.pg_profile's heavy
# test samples PostgreSQL with `perf record`). Installs only what is missing;
# needs root and apt-get. Used by `make system-deps` and by .ci/run.
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  missing+=(prometheus)
fi
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v perf >/dev/null 2>&1 || missing+=(linux-perf)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${missing[*]}: run as root on Debian/Ubuntu, or install them yourself" >&2
  exit 1
fi
echo "system-deps: installing ${missing[*]} (apt-get)"
apt-get update -qq
# The prometheus package's own service is not needed: tests start Prometheus themselves.
# nftables' service is never enabled here: no rule ever goes into the machine's own namespace.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
