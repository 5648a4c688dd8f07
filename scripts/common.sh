# Shared by scripts/test, scripts/demo and scripts/test-*: install what is missing, then build.
# Sourced, not run. Every dependency comes from Debian's apt.

AUTOSTAGE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AUTOSTAGE_BUILD=${AUTOSTAGE_BUILD:-$AUTOSTAGE_ROOT/build}
AUTOSTAGE_PYTHON=/usr/bin/python3   # Debian's interpreter, where python3-torch lives

AUTOSTAGE_PACKAGES=(cmake ninja-build g++ libtorch-dev python3-torch python3-torchvision
  python3-torchaudio libopenmpi-dev openmpi-bin libboost-graph-dev libprotobuf-dev
  protobuf-compiler libspdlog-dev catch2 pybind11-dev libtoml11-dev python3-pytest chromium
  libgrpc++-dev protobuf-compiler-grpc)

# mpirun as root (CI and this machine run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() { echo "==> $*" >&2; }

install_dependencies() {
  local missing=()
  for p in "${AUTOSTAGE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    step "all ${#AUTOSTAGE_PACKAGES[@]} Debian packages present"
    return
  fi
  step "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build_autostage() {
  if [ ! -f "$AUTOSTAGE_BUILD/build.ninja" ]; then
    step "configuring $AUTOSTAGE_BUILD"
    cmake -S "$AUTOSTAGE_ROOT" -B "$AUTOSTAGE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
  fi
  step "building (incremental)"
  cmake --build "$AUTOSTAGE_BUILD" -j "$(nproc)"
  install_python_path
}

# Makes `import autostage` work for /usr/bin/python3 without extra environment: a .pth file in its
# site directory points at the package staged in build/python.
install_python_path() {
  [ -d "$AUTOSTAGE_BUILD/python/autostage" ] || return 0
  local site
  site=$("$AUTOSTAGE_PYTHON" -c 'import site; print(site.getsitepackages()[0])')
  mkdir -p "$site"
  echo "$AUTOSTAGE_BUILD/python" > "$site/autostage.pth"
  step "autostage Python package: $AUTOSTAGE_BUILD/python (via $site/autostage.pth)"
}
