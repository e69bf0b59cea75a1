#!/usr/bin/env bash
# Re-create _vendor/mathjax from the npm package (needs npm; the result is committed so that
# readers and CI need no npm and the offline site still renders math).
set -euo pipefail
version=${1:-3.2.2}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
(cd "$tmp" && npm pack "mathjax@$version" >/dev/null && tar xzf mathjax-*.tgz)
rm -rf "$root/_vendor/mathjax"
mkdir -p "$root/_vendor/mathjax/output/chtml/fonts" "$root/_vendor/mathjax/input/tex"
cp "$tmp/package/es5/tex-chtml.js" "$tmp/package/LICENSE" "$root/_vendor/mathjax/"
cp -r "$tmp/package/es5/output/chtml/fonts/woff-v2" "$root/_vendor/mathjax/output/chtml/fonts/"
cp -r "$tmp/package/es5/input/tex/extensions" "$root/_vendor/mathjax/input/tex/"
rm -rf "$tmp"
echo "vendored mathjax@$version into _vendor/mathjax"
