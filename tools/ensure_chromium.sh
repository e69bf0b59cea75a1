#!/usr/bin/env bash
# The browser test drives Debian's chromium through playwright (never `playwright install`,
# which downloads a browser build), and the PDF test reads `make pdf`'s output with poppler-utils
# (pdftotext, pdfimages). Install what is missing when we may.
set -u
need=()
found=""
for exe in "${PPBOOK_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  [ -n "$exe" ] && [ -x "$exe" ] && { found=$exe; break; }
done
if [ -n "$found" ]; then echo "chromium: $found"; else need+=(chromium); fi
if command -v pdftotext >/dev/null 2>&1 && command -v pdfimages >/dev/null 2>&1; then
  echo "poppler-utils: $(command -v pdftotext)"
else
  need+=(poppler-utils)
fi
[ ${#need[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
  if [ "$SUDO" != none ]; then
    echo "installing Debian's ${need[*]} for the browser and PDF tests"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null && exit 0
  fi
fi
echo "${need[*]} not found and not installable here: the browser and PDF tests will be skipped (set PPBOOK_CHROMIUM=/path/to/chromium for the browser)" >&2
exit 0
