#!/usr/bin/env bash
# Checks systemd/reaperd.catalog against the MESSAGE_IDs reaperd sends (daemon/log.hpp):
# every id has exactly one entry with a Subject, and journalctl itself reads the file: it
# is compiled into a catalog database under a private --root and listed back (the host's
# own catalog is untouched).
# Usage: catalog_check.sh CATALOG LOG_HPP
set -euo pipefail
catalog=$1
log_hpp=$2
work=$(mktemp -d /tmp/reaperd-catalog-check.XXXXXX)
trap 'rm -rf "$work"' EXIT

ids=$(sed -n '/^namespace message_id/,/^}/p' "$log_hpp" | grep -oE '"[0-9a-f]{32}"' | tr -d '"' | sort || true)
[ -n "$ids" ] || { echo "no MESSAGE_IDs found in $log_hpp"; exit 1; }
failures=0
for id in $ids; do
  n=$(grep -c "^-- $id\$" "$catalog" || true)
  if [ "$n" != 1 ]; then
    echo "FAIL: $id has $n entries in $catalog"
    failures=$((failures + 1))
  fi
done
for id in $(grep -oE '^-- [0-9a-f]{32}$' "$catalog" | cut -c4-); do
  grep -q "$id" <<<"$ids" || { echo "FAIL: $catalog has $id, which reaperd never sends"; failures=$((failures + 1)); }
done

mkdir -p "$work/root/usr/lib/systemd/catalog" "$work/root/var/lib/systemd/catalog"
cp "$catalog" "$work/root/usr/lib/systemd/catalog/reaperd.catalog"
journalctl --root="$work/root" --update-catalog
journalctl --root="$work/root" --list-catalog >"$work/list"
for id in $ids; do
  if ! grep -q "^$id reaperd: " "$work/list" && ! grep -q "^$id " "$work/list"; then
    echo "FAIL: journalctl --list-catalog does not list $id"
    failures=$((failures + 1))
  fi
done
journalctl --root="$work/root" --dump-catalog 0e62ab2724b54aa1a1c7ea5d3e0bebbf | head -3
echo "catalog: $(wc -l <<<"$ids") ids, $failures problems"
((failures == 0))
