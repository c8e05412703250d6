#!/usr/bin/env bash
# Re-vendors the system headers bpf/*.c include (Linux uapi from Debian's
# linux-libc-dev, libbpf's bpf_helpers.h & co from libbpf-dev), so that
# `make generate` reads no header of the build machine but clang's own: the
# same bytes on every machine. Copies the closure `clang -M` finds for every
# program, keeping paths relative to /usr/include (the multiarch asm/ dir
# flattened to asm/), and records the packages' versions in VERSIONS.
#
#   bpf/include/update.sh     # after apt-get install linux-libc-dev libbpf-dev clang
set -euo pipefail
cd "$(dirname "$0")/../.."
out=bpf/include
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

find "$out" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
for c in bpf/*.c; do
	clang -target bpf -I/usr/include/"$multiarch" -Ibpf -M "$c"
done | tr ' \\' '\n\n' | grep '^/usr/include/' | sort -u | while read -r h; do
	rel=${h#/usr/include/}
	rel=${rel#"$multiarch"/}
	mkdir -p "$out/$(dirname "$rel")"
	cp "$h" "$out/$rel"
done
{
	echo "# Packages the headers under bpf/include were copied from (bpf/include/update.sh)."
	dpkg-query -W -f '${Package} ${Version}\n' linux-libc-dev libbpf-dev
} >"$out/VERSIONS"
echo "vendored $(find "$out" -name '*.h' | wc -l) headers into $out"
