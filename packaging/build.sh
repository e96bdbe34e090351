#!/usr/bin/env bash
# Build gpumem's installable Linux binary (`make package`):
#   dist/gpumem-<version>-linux-x86_64.tar.gz   one folder: gpumem-gui, gpumem, resources, .desktop, icon,
#                                               install.sh, uninstall.sh, README.txt
#   dist/gpumem_<version>_amd64.deb             the same folder in /opt/gpumem, commands in /usr/bin
#
# Everything is built from a clean throwaway venv (build/package/venv): the runtime dependencies that
# pyproject.toml lists, pinned by packaging/constraints.txt, PyInstaller pinned by
# packaging/requirements-build.txt, and gpumem's own wheel. The version comes from pyproject.toml only.
# Everything PyInstaller caches stays under build/package (PYINSTALLER_CONFIG_DIR).
#
# Environment: PYTHON (default python3, >= 3.11), GPUMEM_REUSE_VENV=1 keeps an existing build venv whose
# inputs are unchanged (for iterating on the spec; the default and CI always start from a new one).
set -euo pipefail
umask 022
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
PKG=$REPO/packaging
BUILD=$REPO/build/package
DIST=$REPO/dist
VENV=$BUILD/venv
export PYINSTALLER_CONFIG_DIR=$BUILD/pyinstaller-config
export PYTHONNOUSERSITE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV

T0=$(date +%s%N)
step() {
    local ms=$((($(date +%s%N) - T0) / 1000000))
    printf '[package %3d.%ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}
die() { echo "packaging/build.sh: $*" >&2; exit 1; }
pip_quiet() {  # pip, its output in a log shown only when it fails
    "${PIP[@]}" install --quiet --no-compile "$@" > "$BUILD/pip.log" 2>&1 \
        || { grep -v 'is ignored' "$BUILD/pip.log" | tail -30; die "pip install failed (log: $BUILD/pip.log)"; }
}

[[ $(uname -s) == Linux && $(uname -m) == x86_64 ]] || die "builds linux-x86_64 only (this is $(uname -sm))"
for tool in tar gzip fakeroot dpkg-deb objdump; do
    command -v "$tool" >/dev/null || die "needs $tool (Debian: apt-get install binutils fakeroot dpkg-dev)"
done

VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
# Debian version: PEP 440 pre-/dev-releases sort before the release with "~"
DEB_VERSION=$(echo "$VERSION" | sed -E 's/\.?(dev|a|b|rc)([0-9]*)/~\1\2/g; s/\+/+local./')
NAME=gpumem-$VERSION-linux-x86_64
TARBALL=$DIST/$NAME.tar.gz
DEB=$DIST/gpumem_${DEB_VERSION}_amd64.deb
step "gpumem $VERSION -> $TARBALL, $DEB"

# ---- 1. clean build venv --------------------------------------------------------------------------------
mkdir -p "$BUILD"
"$PYTHON" - > "$BUILD/requirements-runtime.txt" <<'EOF'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
EOF
INPUTS_HASH=$(cat pyproject.toml "$PKG/constraints.txt" "$PKG/requirements-build.txt" | sha256sum | cut -c1-16)
if [[ ${GPUMEM_REUSE_VENV:-0} == 1 && -f $VENV/.inputs && $(cat "$VENV/.inputs") == "$INPUTS_HASH" ]]; then
    step "reusing build venv (GPUMEM_REUSE_VENV=1, inputs unchanged); reinstalling gpumem only"
    if "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        PIP=("$VENV/bin/python" -m pip)
    else  # made --without-pip below: the outer pip fills it
        PIP=("$PYTHON" -m pip --python "$VENV/bin/python")
    fi
else
    rm -rf "$VENV"
    if "$PYTHON" -m pip --version >/dev/null 2>&1; then
        # a venv without pip, filled by the outer pip (--python): saves ~12 s of ensurepip
        "$PYTHON" -m venv --without-pip "$VENV"
        PIP=("$PYTHON" -m pip --python "$VENV/bin/python")
    else
        "$PYTHON" -m venv "$VENV"
        PIP=("$VENV/bin/python" -m pip)
    fi
    step "installing runtime dependencies and PyInstaller into a clean venv"
    pip_quiet -c "$PKG/constraints.txt" -r "$PKG/requirements-build.txt" -r "$BUILD/requirements-runtime.txt"
    echo "$INPUTS_HASH" > "$VENV/.inputs"
fi
pip_quiet --no-deps --no-build-isolation --force-reinstall "$REPO"
"$VENV/bin/python" -c 'import PyInstaller, gpumem_gui' 2>/dev/null || die "the build venv is incomplete"
installed=$(cd / && "$VENV/bin/python" -c 'import gpumem_gui; print(gpumem_gui.__version__)')
[[ $installed == "$VERSION" ]] || die "the build venv has gpumem $installed, pyproject says $VERSION"

# ---- 2. PyInstaller (one folder, two executables) ---------------------------------------------------------
step "PyInstaller $("$VENV/bin/python" -c 'import PyInstaller; print(PyInstaller.__version__)')"
rm -rf "$BUILD/work" "$BUILD/dist" "$BUILD/stage" "$BUILD/deb"
# run from build/package so that the repository root is not on sys.path: the analysis sees the installed wheel
(cd "$BUILD" && "$VENV/bin/python" -m PyInstaller --noconfirm --log-level WARN \
    --distpath "$BUILD/dist" --workpath "$BUILD/work" "$PKG/gpumem.spec") > "$BUILD/pyinstaller.log" 2>&1 \
    || { tail -40 "$BUILD/pyinstaller.log"; die "PyInstaller failed (log: $BUILD/pyinstaller.log)"; }
APP=$BUILD/dist/gpumem
[[ -x $APP/gpumem-gui && -x $APP/gpumem ]] || die "PyInstaller made no gpumem-gui/gpumem"

# Debug sections of the Python interpreter and its stdlib extensions (~20 MB). Nothing else: numpy's
# bundled OpenBLAS/gfortran break when stripped, and the Qt libraries come stripped already.
if command -v strip >/dev/null; then
    strip --strip-debug "$APP"/_internal/libpython3*.so* "$APP"/_internal/python3*/lib-dynload/*.so
fi

# The oldest glibc the bundle runs on: the newest GLIBC_x.y symbol version any of its files needs.
GLIBC=$(find "$APP" -type f \( -name '*.so*' -o -name gpumem -o -name gpumem-gui \) -print0 \
    | xargs -0 objdump -T 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 | sed 's/GLIBC_//')
step "bundle needs glibc >= $GLIBC"

# ---- 3. the folder users get ------------------------------------------------------------------------------
STAGE=$BUILD/stage/$NAME
mkdir -p "$STAGE"
cp -al "$APP/." "$STAGE/"
ln -s _internal/gpumem_gui/resources "$STAGE/resources"
cp "$PKG/gpumem.desktop" "$PKG/gpumem.png" "$PKG/gpumem.svg" "$STAGE/"
install -m 0755 "$PKG/install.sh" "$PKG/uninstall.sh" "$STAGE/"
sed -e "s/@VERSION@/$VERSION/g" -e "s/@GLIBC@/$GLIBC/g" "$PKG/README.txt" > "$STAGE/README.txt"
[[ -d $STAGE/resources/fake_gpus && -f $STAGE/resources/models.json ]] || die "resources missing in the bundle"
[[ ! -e $STAGE/resources/tools ]] || die "resources/tools (build-time only) is in the bundle"

# ---- 4. Debian package ------------------------------------------------------------------------------------
ROOT=$BUILD/deb/root
mkdir -p "$ROOT/DEBIAN" "$ROOT/opt" "$ROOT/usr/bin" "$ROOT/usr/share/applications" \
    "$ROOT/usr/share/icons/hicolor/256x256/apps" "$ROOT/usr/share/icons/hicolor/scalable/apps" \
    "$ROOT/usr/share/doc/gpumem"
cp -al "$STAGE" "$ROOT/opt/gpumem"
rm "$ROOT/opt/gpumem/install.sh" "$ROOT/opt/gpumem/uninstall.sh"  # dpkg installs and removes
ln -s /opt/gpumem/gpumem "$ROOT/usr/bin/gpumem"
ln -s /opt/gpumem/gpumem-gui "$ROOT/usr/bin/gpumem-gui"
cp "$PKG/gpumem.desktop" "$ROOT/usr/share/applications/"
cp "$PKG/gpumem.png" "$ROOT/usr/share/icons/hicolor/256x256/apps/"
cp "$PKG/gpumem.svg" "$ROOT/usr/share/icons/hicolor/scalable/apps/"
printf 'gpumem %s\nLicense: Apache-2.0\nThird-party components in /opt/gpumem/_internal keep their own licenses.\n' \
    "$VERSION" > "$ROOT/usr/share/doc/gpumem/copyright"
# Qt's xcb platform needs these (names checked with apt-cache on Debian 12; the same on Ubuntu 22.04+).
XCB_DEPENDS="libxcb-cursor0, libxkbcommon-x11-0, libxcb-icccm4, libxcb-keysyms1, libxcb-shape0,\
 libxcb-render-util0, libxcb-image0, libxcb-randr0, libxcb-xkb1, libegl1, libgl1, libfontconfig1, libdbus-1-3"
cat > "$ROOT/DEBIAN/control" <<EOF
Package: gpumem
Version: $DEB_VERSION
Section: science
Priority: optional
Architecture: amd64
Maintainer: gpumem developers
Installed-Size: $(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
Depends: libc6 (>= $GLIBC), libstdc++6 (>= 11), libgcc-s1, libexpat1, $XCB_DEPENDS
Recommends: fonts-dejavu-core | fonts-liberation
Description: will this model fit on my GPUs, and what is eating the memory?
 gpumem estimates the GPU memory of large-model inference from the model's own
 files or a built-in catalog, checks it against local NVIDIA GPUs (through the
 driver's NVML, loaded at run time) and explains what takes the room.
 Self-contained build: gpumem-gui (Qt window) and gpumem (command line).
EOF

# ---- 5. archives (the two compressions run side by side) --------------------------------------------------
mkdir -p "$DIST"
rm -f "$DIST"/gpumem-*-linux-x86_64.tar.gz "$DIST"/gpumem_*_amd64.deb
step "writing $(basename "$TARBALL") and $(basename "$DEB")"
MTIME=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$MTIME" -C "$BUILD/stage" -cf - "$NAME" \
    | gzip -6 -n > "$TARBALL.part" &
tar_pid=$!
# zstd: a third of xz's time here, smaller than gzip; dpkg reads it since 1.21.18 (Debian 12, Ubuntu 22.04)
fakeroot dpkg-deb -Zzstd -z9 --build "$ROOT" "$DEB.part" > /dev/null
wait "$tar_pid" || die "tar failed"
mv "$TARBALL.part" "$TARBALL"
mv "$DEB.part" "$DEB"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
step "done"
echo "  $TARBALL  $(mib "$(stat -c %s "$TARBALL")") MiB"
echo "  $DEB  $(mib "$(stat -c %s "$DEB")") MiB"
echo "  unpacked: $(mib "$(du -sb "$STAGE" | cut -f1)") MiB in $(find "$STAGE" -type f | wc -l) files"
