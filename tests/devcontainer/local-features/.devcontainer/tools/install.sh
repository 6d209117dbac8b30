#!/bin/sh
echo "tools $VERSION" > /usr/local/share/tools-version
