#!/usr/bin/env bash
# tests/gpu/with_debs.sh CMD... - on a device machine whose image lacks the
# build dependencies: unpack the Debian packages in .debs/ (fetched here with
# apt-get download, never committed) under /tmp/deps, point pkg-config,
# CMake and the loader at them, and run CMD.
set -u
D=/tmp/deps
mkdir -p "$D"
for f in .debs/*.deb; do dpkg -x "$f" "$D"; done
A=x86_64-linux-gnu
for pc in "$D"/usr/lib/$A/pkgconfig/*.pc "$D"/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i -e "s#^prefix=/usr#prefix=$D/usr#" -e "/^Requires.private/d" "$pc"
done
export PKG_CONFIG_PATH=$D/usr/lib/$A/pkgconfig:$D/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export CMAKE_PREFIX_PATH=$D/usr
export EN_EXTRA_CMAKE="-DOPENBLAS_LIB=$D/usr/lib/$A/openblas-openmp/libopenblas.so -DCBLAS_INCLUDE_DIR=$D/usr/include/$A/openblas-openmp -DZLIB_ROOT=$D/usr"
export EN_LD=$D/usr/lib/$A:$D/usr/lib/$A/openblas-openmp
"$@"
