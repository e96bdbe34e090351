#!/bin/sh
# Install gpumem from this unpacked folder for the current user (no root, no Python needed):
#   <prefix>/lib/gpumem/                                 the program (a copy of this folder)
#   <prefix>/bin/gpumem, <prefix>/bin/gpumem-gui          symbolic links to it
#   <prefix>/share/applications/gpumem.desktop           the menu entry
#   <prefix>/share/icons/hicolor/{256x256,scalable}/apps  the icon
# <prefix> is ~/.local unless PREFIX is set (PREFIX=/opt/tools ./install.sh). Run it again to upgrade;
# <prefix>/lib/gpumem/uninstall.sh removes all of it.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd -P)
PREFIX=${PREFIX:-$HOME/.local}
LIB=$PREFIX/lib/gpumem
BIN=$PREFIX/bin
APPS=$PREFIX/share/applications
ICONS=$PREFIX/share/icons/hicolor

for f in gpumem gpumem-gui _internal gpumem.desktop gpumem.png gpumem.svg uninstall.sh; do
    [ -e "$HERE/$f" ] || { echo "install.sh: $HERE/$f is missing; unpack the whole archive first" >&2; exit 1; }
done

mkdir -p "$PREFIX/lib" "$BIN" "$APPS" "$ICONS/256x256/apps" "$ICONS/scalable/apps"
if [ "$HERE" != "$(cd "$LIB" 2>/dev/null && pwd -P)" ]; then
    rm -rf "$LIB.new"
    cp -R "$HERE" "$LIB.new"
    rm -rf "$LIB"
    mv "$LIB.new" "$LIB"
fi
ln -sfn "$LIB/gpumem" "$BIN/gpumem"
ln -sfn "$LIB/gpumem-gui" "$BIN/gpumem-gui"
sed -e "s|^Exec=.*|Exec=$BIN/gpumem-gui|" -e "s|^TryExec=.*|TryExec=$BIN/gpumem-gui|" \
    "$HERE/gpumem.desktop" > "$APPS/gpumem.desktop"
cp "$HERE/gpumem.png" "$ICONS/256x256/apps/gpumem.png"
cp "$HERE/gpumem.svg" "$ICONS/scalable/apps/gpumem.svg"
# refresh an existing icon cache (a stale one hides new icons); never create one
if [ -f "$ICONS/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null 2>&1; then
    gtk-update-icon-cache -q -t "$ICONS" 2>/dev/null || true
fi

echo "gpumem $("$LIB/gpumem" --version | sed 's/^gpumem //') installed in $LIB"
echo "  commands: $BIN/gpumem, $BIN/gpumem-gui; menu entry: $APPS/gpumem.desktop"
case ":$PATH:" in
    *":$BIN:"*) ;;
    *) echo "  note: $BIN is not on your PATH; add it, e.g. echo 'export PATH=\"$BIN:\$PATH\"' >> ~/.profile" ;;
esac
echo "  uninstall: $LIB/uninstall.sh"
