#!/usr/bin/env bash
# The built-in real-text corpus (mixbench --data text): English documentation from Debian packages.
#
#   ci/fetch_text.sh [DIR]            download the packages (apt-get download), extract, clean,
#                                     deduplicate, split; write DIR/train.bin, DIR/val.bin,
#                                     DIR/manifest.json and the copyable archive DIR.tar.xz
#   ci/fetch_text.sh --unpack [DIR]   offline (a GPU machine): unpack DIR.tar.xz into DIR and
#                                     check the shards' SHA-256 against DIR/manifest.json
#
# DIR defaults to data/text in the repository. The cleaning, deduplication and split rules are in
# ci/text_corpus.py; the sources and their licences in README.md ("Real text").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACKAGES=(
  "linux-doc-6.1 GPL-2"
  "python3.11-doc PSF-2.0"
  "perl-doc GPL-1+ or Artistic"
  "postgresql-doc-15 PostgreSQL"
  "sqlite3-doc public-domain"
  "git-doc GPL-2"
  "debian-reference-en GPL-2+"
)

verify() {  # DIR: the shards' SHA-256 as manifest.json records them
  python3 - "$1" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
for name, f in m["files"].items():
    h = hashlib.sha256(open(os.path.join(d, name), "rb").read()).hexdigest()
    if h != f["sha256"]:
        sys.exit(f"{d}/{name}: SHA-256 {h} differs from the manifest's {f['sha256']}")
print(f"{d}: {m['documents']} documents, {m['text_bytes']} bytes of text, shards verified")
PY
}

if [[ "${1:-}" == "--unpack" ]]; then
  DIR=$(realpath -m "${2:-$ROOT/data/text}")
  [[ -f "$DIR.tar.xz" ]] || { echo "fetch_text.sh: $DIR.tar.xz not found (copy it from a machine that ran ci/fetch_text.sh)" >&2; exit 2; }
  mkdir -p "$DIR"
  tar -xJf "$DIR.tar.xz" -C "$DIR"
  verify "$DIR"
  exit 0
fi

DIR=$(realpath -m "${1:-$ROOT/data/text}")
WORK="$DIR.work"
mkdir -p "$WORK/debs" "$WORK/root"
(
  cd "$WORK/debs"
  for entry in "${PACKAGES[@]}"; do
    pkg=${entry%% *}
    ls "$pkg"_*.deb >/dev/null 2>&1 || apt-get download "$pkg"
  done
)
rm -rf "$WORK/root"
mkdir -p "$WORK/root"
{
  echo "["
  sep=""
  for entry in "${PACKAGES[@]}"; do
    pkg=${entry%% *}
    licence=${entry#* }
    deb=$(ls "$WORK/debs/$pkg"_*.deb | head -1)
    dpkg-deb -x "$deb" "$WORK/root/$pkg"
    printf '%s {"package": "%s", "version": "%s", "deb": "%s", "sha256": "%s", "deb_bytes": %s, "licence": "%s"}\n' \
      "$sep" "$pkg" "$(dpkg-deb -f "$deb" Version)" "$(basename "$deb")" "$(sha256sum "$deb" | cut -d' ' -f1)" \
      "$(stat -c %s "$deb")" "$licence"
    sep=","
  done
  echo "]"
} > "$WORK/root/sources.json"
rm -rf "$DIR"
python3 "$ROOT/ci/text_corpus.py" "$WORK/root" "$DIR"
rm -rf "$WORK/root"
tar -cJf "$DIR.tar.xz.tmp" -C "$DIR" manifest.json train.bin val.bin
mv "$DIR.tar.xz.tmp" "$DIR.tar.xz"
verify "$DIR"
echo "wrote $DIR (train.bin, val.bin, manifest.json) and $DIR.tar.xz ($(du -h "$DIR.tar.xz" | cut -f1)); the .deb files stay in $WORK/debs"
