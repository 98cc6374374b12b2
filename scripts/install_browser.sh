#!/usr/bin/env bash
# Install Debian's chromium for the end-to-end dashboard test (tests/test_e2e_browser.py drives it
# through Playwright with executable_path=/usr/bin/chromium; Playwright's own browser download
# is not used). Does nothing when chromium is already there. Needs root (or sudo).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends chromium; then
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update
  $SUDO apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends chromium
fi
/usr/bin/chromium --version
