#!/usr/bin/env bash
# What the console browser tests need: Debian's chromium and chromium-driver, plus a CJK
# font so the demo's Chinese renders in screenshots.
exec "$(dirname "$0")/install_debian_packages.sh" install_browser "the console browser tests" \
  chromium chromium-driver fonts-noto-cjk
