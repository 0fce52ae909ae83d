#!/bin/sh
# install.sh SOURCE TARGET: copy an executable into place
cp "$1" "$2" && chmod 755 "$2"
