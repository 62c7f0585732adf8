#!/usr/bin/env bash
# Downloads the SentencePiece source archive that third_party/sentencepiece.pin pins into the
# git-ignored third_party/downloads/, and checks its sha256. Returns at once when it is there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIN="$ROOT/third_party/sentencepiece.pin"
pinned() { sed -n "s/^$1=//p" "$PIN"; }
VERSION="$(pinned SENTENCEPIECE_VERSION)"
URL="$(pinned SENTENCEPIECE_URL)"
SHA256="$(pinned SENTENCEPIECE_SHA256)"
ARCHIVE="$ROOT/third_party/downloads/sentencepiece-$VERSION.tar.gz"
sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$ARCHIVE" && "$(sha_of "$ARCHIVE")" == "$SHA256" ]]; then exit 0; fi
echo "[fetch_sentencepiece] downloading SentencePiece $VERSION source ($URL)"
mkdir -p "$(dirname "$ARCHIVE")"
partial="$ARCHIVE.partial"
if command -v curl > /dev/null; then
  curl -fsSL --retry 3 -o "$partial" "$URL"
else  # the Docker image's Debian base has python3 but no curl
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$URL" "$partial"
fi
got="$(sha_of "$partial")"
if [[ "$got" != "$SHA256" ]]; then
  rm -f "$partial"
  echo "[fetch_sentencepiece] error: $URL has sha256 $got, but $PIN pins $SHA256" >&2
  exit 1
fi
mv "$partial" "$ARCHIVE"
