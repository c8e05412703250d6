#!/usr/bin/env bash
# Regenerates this wrapper module for another Kubernetes version:
#   test/k8s/tools/gen.sh v1.34.4
# One `replace k8s.io/<staging> => k8s.io/<staging> v0.<minor>.<patch>` per
# replace line of k8s.io/kubernetes' own go.mod (which points them at local
# paths), then go mod tidy. The harness rebuilds when go.mod or go.sum changes.
set -euo pipefail
V=${1:?usage: gen.sh vX.Y.Z}
cd "$(dirname "$0")"
GOFLAGS=-mod=mod go mod download k8s.io/kubernetes@"$V"
MOD=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$V.mod
STAGING=v0.${V#v1.}
{
	sed -n '1,/^module /p' go.mod
	printf '\ngo 1.24.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$V"
	sed -n '/^replace (/,/^)/p' "$MOD" | awk '/=>/ {printf "\t%s => %s %s\n", $1, $1, v}' v="$STAGING"
	printf ')\n'
} >go.mod.new
mv go.mod.new go.mod
go mod tidy
