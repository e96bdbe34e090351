#!/bin/sh
# Remove what install.sh put under <prefix> (~/.local unless PREFIX is set). Leaves your settings alone
# and removes only links that point into <prefix>/lib/gpumem.
set -eu
PREFIX=${PREFIX:-$HOME/.local}
LIB=$PREFIX/lib/gpumem
for name in gpumem gpumem-gui; do
    link=$PREFIX/bin/$name
    if [ -L "$link" ] && [ "$(readlink "$link")" = "$LIB/$name" ]; then
        rm -f "$link"
    fi
done
rm -f "$PREFIX/share/applications/gpumem.desktop" \
      "$PREFIX/share/icons/hicolor/256x256/apps/gpumem.png" \
      "$PREFIX/share/icons/hicolor/scalable/apps/gpumem.svg"
if [ -f "$LIB/gpumem" ] && [ -d "$LIB/_internal" ]; then
    rm -rf "$LIB"
fi
ICONS=$PREFIX/share/icons/hicolor
if [ -f "$ICONS/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null 2>&1; then
    gtk-update-icon-cache -q -t "$ICONS" 2>/dev/null || true
fi
echo "gpumem removed from $PREFIX"
