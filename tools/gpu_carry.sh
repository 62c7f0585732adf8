#!/usr/bin/env bash
# Everything a GPU lease carries, made in one command on a fresh checkout (docs/gpu.md, "Running
# it"), so a session that is lent a GPU spends no thought on it:
#   1. Debian's build dependencies (.device/debs, .device/setup.sh), by the workplace's
#      PREPARE_CARRY [../shared/device/prepare-carry.sh], with libgloo-dev for the data-parallel build;
#   2. the libraries Debian's HDF5 needs at run time, in case the GPU image lacks them (.device/extra);
#   3. fla's wheels for the bench's fla row (.device/wheels);
#   4. the demo corpus and SentencePiece's archive (tools/setup.sh: data/demo, third_party/downloads);
#   5. the two binaries, built and packed (tools/gpu_prebuilt.sh pack: .device/prebuilt);
# then checks that the carried paths fit the device tool's limit and prints the carry to pass.
# The commands it runs can be stood in (APT_GET, PIP, SETUP, PREBUILT; tests/tools/test_gpu_carry.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PREPARE_CARRY="${PREPARE_CARRY:-$ROOT/../shared/device/prepare-carry.sh}"
APT_GET="${APT_GET:-apt-get}"
PIP="${PIP:-$ROOT/.venv/bin/python -m pip}"
SETUP="${SETUP:-$ROOT/tools/setup.sh}"
PREBUILT="${PREBUILT:-$ROOT/tools/gpu_prebuilt.sh}"
LIMIT_MIB="${CARRY_LIMIT_MIB:-64}"   # the device tool's limit on what a call carries
CARRY=(.device data/demo third_party/downloads)
# The packages behind what `ldd` lists for Debian 12's libhdf5_serial.so, with their own package
# dependencies; glibc's, and libsz2, libaec0 and zlib (prepare-carry's), left out.
EXTRA_LIBS=(libcurl4 libssl3 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1 libldap-2.5-0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libsasl2-2 libsasl2-modules-db libidn2-0
  libunistring2 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libtasn1-6 libkeyutils1
  libdb5.3 libffi8 libcom-err2 libzstd1)
WHEELS=(fla-core==0.6.0 einops)

if [[ ! -f "$PREPARE_CARRY" ]]; then
  echo "gpu_carry: PREPARE_CARRY=$PREPARE_CARRY not found: the workplace's script that downloads the" \
       "Debian build dependencies into .device/ (set PREPARE_CARRY to its path)" >&2
  exit 2
fi

echo "[gpu_carry] 1/5 Debian build dependencies"
bash "$PREPARE_CARRY" libgloo-dev
echo "[gpu_carry] 2/5 HDF5's run-time libraries"
rm -rf .device/extra && mkdir -p .device/extra
(cd .device/extra && $APT_GET download "${EXTRA_LIBS[@]}" > /dev/null)
echo "[gpu_carry] 3/5 fla's wheels"
rm -rf .device/wheels
PIP_DISABLE_PIP_VERSION_CHECK=1 $PIP download -q --no-deps -d .device/wheels "${WHEELS[@]}"
echo "[gpu_carry] 4/5 setup (demo corpus, SentencePiece's archive)"
"$SETUP"
echo "[gpu_carry] 5/5 the prebuilt binaries"
"$PREBUILT" pack

for path in "${CARRY[@]}"; do
  [[ -e "$path" ]] || { echo "gpu_carry: $path is missing after the steps above" >&2; exit 2; }
done
bytes=$(du -cb --apparent-size "${CARRY[@]}" | tail -n 1 | cut -f 1)
mib=$(( (bytes + 1048575) / 1048576 ))
du -sh --apparent-size "${CARRY[@]}"
if (( mib > LIMIT_MIB )); then
  echo "gpu_carry: the carried paths hold $mib MiB, over the device tool's $LIMIT_MIB MiB" >&2
  exit 2
fi
printf '[gpu_carry] %s MiB of %s; the device tool'"'"'s carry: [' "$mib" "$LIMIT_MIB"
printf '"%s", ' "${CARRY[@]:0:${#CARRY[@]}-1}"
printf '"%s"]\n' "${CARRY[-1]}"
