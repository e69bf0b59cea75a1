#!/usr/bin/env bash
# The browser test drives Debian's chromium through playwright (never `playwright install`,
# which downloads a browser build). Install it when it is missing and we may.
set -u
for exe in "${PPBOOK_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  [ -n "$exe" ] && [ -x "$exe" ] && { echo "chromium: $exe"; exit 0; }
done
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
  if [ "$SUDO" != none ]; then
    echo "installing Debian's chromium for the browser test"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null && exit 0
  fi
fi
echo "chromium not found and not installable here: the browser test will be skipped (set PPBOOK_CHROMIUM=/path/to/chromium to run it)" >&2
exit 0
