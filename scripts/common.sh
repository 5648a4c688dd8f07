# Shared by scripts/test, scripts/demo and scripts/test-*: install what is missing, then build.
# Sourced, not run. Two platforms ("legs"), each with its own interpreter and build folder:
#   1.13  Debian's LibTorch 1.13 (CPU) and /usr/bin/python3, into build/ -- every dependency from apt;
#   2.x   PyPI's torch 2.x with CUDA (scripts/requirements-torch2.txt) in the git-ignored venv
#         .venv-torch2/, into build-torch2/ with AUTOSTAGE_WITH_CUDA=ON (CUDA and NCCL compiled
#         against the toolkit in CUDA_HOME and linked; nothing runs on a GPU here).

AUTOSTAGE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AUTOSTAGE_BUILD=${AUTOSTAGE_BUILD:-$AUTOSTAGE_ROOT/build}
AUTOSTAGE_PYTHON=/usr/bin/python3   # Debian's interpreter, where python3-torch lives

AUTOSTAGE_PACKAGES=(cmake ninja-build g++ libtorch-dev python3-torch python3-torchvision
  python3-torchaudio libopenmpi-dev openmpi-bin libboost-graph-dev libprotobuf-dev
  protobuf-compiler libspdlog-dev catch2 pybind11-dev libtoml11-dev python3-pytest chromium
  libgrpc++-dev protobuf-compiler-grpc nlohmann-json3-dev)

# mpirun as root (CI and this machine run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step() { echo "==> $* [${SECONDS} s]" >&2; }  # [seconds since the script started]

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
    cmake -S "$AUTOSTAGE_ROOT" -B "$AUTOSTAGE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$AUTOSTAGE_PYTHON" "$@"
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

# --- the PyTorch 2.x leg -------------------------------------------------------------------------
TORCH2_VENV=${TORCH2_VENV:-$AUTOSTAGE_ROOT/.venv-torch2}
TORCH2_BUILD=${TORCH2_BUILD:-$AUTOSTAGE_ROOT/build-torch2}
TORCH2_PYTHON=$TORCH2_VENV/bin/python
TORCH2_REQUIREMENTS=$AUTOSTAGE_ROOT/scripts/requirements-torch2.txt
# The wheels, kept between runs (pip's own HTTP cache is not relied on): a warm run installs from
# here without the network, a cold one downloads into it first.
TORCH2_WHEELS=${TORCH2_WHEELS:-$AUTOSTAGE_ROOT/.cache/wheels}

# Makes .venv-torch2 hold exactly scripts/requirements-torch2.txt: reused as it is when its stamp
# matches the requirements, otherwise (re)installed from the wheel folder, downloading what it
# lacks. The venv's interpreter is python3 from PATH (3.11 here), not Debian's.
prepare_torch2() {
  local stamp="$TORCH2_VENV/.autostage-requirements"
  if [ -x "$TORCH2_PYTHON" ] && cmp -s "$TORCH2_REQUIREMENTS" "$stamp"; then
    step "PyTorch 2.x venv $TORCH2_VENV is current ($(torch2_versions))"
    return
  fi
  local base=${TORCH2_BASE_PYTHON:-python3}
  if ! command -v "$base" >/dev/null; then
    echo "scripts: $base not found; set TORCH2_BASE_PYTHON to a Python 3.10+ interpreter" >&2
    return 1
  fi
  step "PyTorch 2.x venv: $TORCH2_VENV from $($base --version) and $TORCH2_REQUIREMENTS"
  [ -x "$TORCH2_PYTHON" ] || "$base" -m venv "$TORCH2_VENV"
  mkdir -p "$TORCH2_WHEELS"
  # pip download skips the files the folder already has; with all of them there it only reads the
  # index, and --no-index below installs from the folder alone.
  "$TORCH2_PYTHON" -m pip download -q --disable-pip-version-check -d "$TORCH2_WHEELS" \
    -r "$TORCH2_REQUIREMENTS"
  "$TORCH2_PYTHON" -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$TORCH2_WHEELS" -r "$TORCH2_REQUIREMENTS"
  cp "$TORCH2_REQUIREMENTS" "$stamp"
  step "PyTorch 2.x venv ready ($(torch2_versions))"
}

torch2_versions() {
  "$TORCH2_PYTHON" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")'
}

# Configures (once) and builds build-torch2/ against the venv's LibTorch with CUDA and NCCL, then
# points the venv at its Python package (a .pth file), as install_python_path does for build/.
build_torch2() {
  if [ ! -f "$TORCH2_BUILD/build.ninja" ]; then
    local torch_prefix pybind11_dir
    torch_prefix=$("$TORCH2_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
    pybind11_dir=$("$TORCH2_PYTHON" -m pybind11 --cmakedir)
    step "configuring $TORCH2_BUILD (LibTorch from $torch_prefix, AUTOSTAGE_WITH_CUDA=ON)"
    # TORCH_CUDA_ARCH_LIST only quiets LibTorch's architecture probe (no GPU here): autostage
    # compiles no device code of its own; its CUDA and NCCL sources are host code. The torch-free
    # parts' tests are the 1.13 leg's (AUTOSTAGE_TORCH_FREE_TESTS in CMakeLists.txt).
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} \
      cmake -S "$AUTOSTAGE_ROOT" -B "$TORCH2_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DAUTOSTAGE_WITH_CUDA=ON -DAUTOSTAGE_TORCH_FREE_TESTS=OFF -DPython_EXECUTABLE="$TORCH2_PYTHON" \
      -DTorch_DIR="$torch_prefix/Torch" -Dpybind11_DIR="$pybind11_dir" "$@"
  fi
  step "building $TORCH2_BUILD (incremental)"
  cmake --build "$TORCH2_BUILD" -j "$(nproc)"
  local site
  site=$("$TORCH2_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$TORCH2_BUILD/python" > "$site/autostage.pth"
}
