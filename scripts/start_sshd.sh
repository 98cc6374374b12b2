#!/usr/bin/env bash
# Start a throwaway sshd on 127.0.0.1 for the SSH host tests: scripts/start_sshd.sh DIR [PORT]
#
# Everything it makes lives in DIR (default /tmp/stepwatch-sshd): its own host key, config, pid
# file and log, and a client key pair authorized for the user running it (root in CI). The
# system's sshd, its config and port 22 are left alone. Installs openssh-server with apt-get
# when sshd is missing (root only). Idempotent: with our sshd already answering in DIR it only
# re-checks it. Writes DIR/env with STEPWATCH_TEST_SSH_{PORT,KEY,USER,KNOWN_HOSTS}=... lines.
set -euo pipefail

dir=${1:-/tmp/stepwatch-sshd}
want_port=${2:-}
sshd=/usr/sbin/sshd

say() { echo "start_sshd: $*" >&2; }
die() { say "$*"; exit 1; }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

mkdir -p "$dir"
chmod 700 "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/sshd_config
pidfile=$dir/sshd.pid

# Already running from this directory? Then only check that it still answers.
if [ -f "$pidfile" ] && [ -f "$dir/env" ]; then
  pid=$(cat "$pidfile")
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$conf"; then
    port=$(sed -n 's/^STEPWATCH_TEST_SSH_PORT=//p' "$dir/env")
    if [ -n "$port" ] && answers "$port"; then
      say "sshd already running (pid $pid, 127.0.0.1:$port)"
      exit 0
    fi
    kill "$pid" 2>/dev/null || true
  fi
fi

install_sshd() {
  [ "$(id -u)" = 0 ] || die "sshd is not installed ($sshd) and installing it needs root"
  command -v apt-get >/dev/null || die "sshd is not installed ($sshd) and there is no apt-get to install it"
  # Keep the package's post-install from starting the system sshd on port 22 (the standard
  # Debian switch; left in place if it was already there, as in Docker images).
  local made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local ok=
  export DEBIAN_FRONTEND=noninteractive
  if apt-get install -y -q --no-install-recommends openssh-server >"$dir/apt.log" 2>&1; then
    ok=1
  elif apt-get update -q >>"$dir/apt.log" 2>&1 &&
       apt-get install -y -q --no-install-recommends openssh-server >>"$dir/apt.log" 2>&1; then
    ok=1
  fi
  [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ -n "$ok" ] || die "cannot install openssh-server: $(tail -n 1 "$dir/apt.log")"
}

[ -x "$sshd" ] || install_sshd
[ -x "$sshd" ] || die "openssh-server is installed but $sshd is missing"
command -v ssh-keygen >/dev/null || die "ssh-keygen is missing (package openssh-client)"

# Keys: a host key for this sshd, and a client key pair for the tests.
[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C stepwatch-test-host -f "$dir/host_ed25519"
[ -f "$dir/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C stepwatch-test-client -f "$dir/client_ed25519"
cp "$dir/client_ed25519.pub" "$dir/authorized_keys"
chmod 600 "$dir/authorized_keys"

if [ -n "$want_port" ]; then
  port=$want_port
  ! answers "$port" || die "127.0.0.1:$port is already taken by another program"
else
  port=
  for p in $(seq 2222 2299); do
    if ! answers "$p"; then port=$p; break; fi
  done
  [ -n "$port" ] || die "no free port in 2222-2299 on 127.0.0.1"
fi

user=$(id -un)
# With UsePAM no, sshd refuses any login to an account whose password field starts with '!'
# (locked). Debian's root is '*' (no password, not locked); where it is locked, let PAM decide.
use_pam=no
if [ "$(id -u)" = 0 ] && [ -r /etc/shadow ] && grep -q "^$user:!" /etc/shadow; then
  use_pam=yes
fi

cat >"$conf" <<EOF
# stepwatch test sshd: 127.0.0.1 only, keys only, everything under $dir
Port $port
ListenAddress 127.0.0.1
HostKey "$dir/host_ed25519"
PidFile "$pidfile"
AuthorizedKeysFile "$dir/authorized_keys"
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM $use_pam
# The key files live under /tmp, which is world-writable: sshd's path checks would refuse them.
StrictModes no
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxStartups 50
MaxSessions 50
Subsystem sftp internal-sftp
EOF

# The privilege-separation directory that the system's service would create at boot.
[ "$(id -u)" != 0 ] || { mkdir -p /run/sshd && chmod 755 /run/sshd; }
"$sshd" -t -f "$conf" || die "sshd rejects $conf"
rm -f "$pidfile"
"$sshd" -f "$conf" -E "$dir/sshd.log"

for _ in $(seq 1 100); do
  answers "$port" && break
  sleep 0.1
done
answers "$port" || die "sshd did not answer on 127.0.0.1:$port: $(tail -n 1 "$dir/sshd.log" 2>/dev/null)"

echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >"$dir/known_hosts"
cat >"$dir/env" <<EOF
STEPWATCH_TEST_SSH_PORT=$port
STEPWATCH_TEST_SSH_KEY=$dir/client_ed25519
STEPWATCH_TEST_SSH_USER=$user
STEPWATCH_TEST_SSH_KNOWN_HOSTS=$dir/known_hosts
EOF
say "sshd running (pid $(cat "$pidfile"), 127.0.0.1:$port, $dir/env)"
