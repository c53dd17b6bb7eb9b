#!/usr/bin/env python3
"""Builds mixbench's real-text corpus from extracted Debian documentation packages.

    text_corpus.py ROOT OUT

ROOT holds one folder per package (the package's files, as `dpkg-deb -x` extracts them) and
ROOT/sources.json ([{package, version, deb, sha256, licence}], written by ci/fetch_text.sh).
OUT receives train.bin, val.bin (modded-nanogpt .bin shards of byte tokens, BOS = 256 before each
document) and manifest.json.

Rules (the same for every input; README.md, "Real text"):
  documents  each selected file of a package, packages and files in sorted order; which files a
             package contributes is SELECT below (one representation per document: reST sources
             where the package also ships their HTML rendering)
  cleaning   HTML -> text (script/style dropped, block elements end lines, entities decoded);
             bytes decoded as UTF-8 (invalid sequences -> U+FFFD); CR LF / CR -> LF; tabs -> spaces
             to the next multiple of 8; other control characters dropped; trailing spaces dropped;
             runs of blank lines -> one blank line; leading/trailing blank lines dropped; documents
             empty after cleaning dropped
  english    the corpus is English: files under a translations/ folder are not selected, and a
             document whose cleaned text is more than 5 % non-ASCII characters is dropped (counted
             per package as "non_english"); a few non-English documents in an English corpus are
             rare, unpredictable bytes whose batches spike the training loss of every method
  dedup      a document whose cleaned bytes equal an earlier document's (SHA-256) is dropped
  split      the k-th kept document (k = 1, 2, ...) goes to validation when k % 100 == 0, else to
             training
"""
import array
import gzip
import hashlib
import html
import html.parser
import json
import os
import re
import struct
import sys

BOS = 256
SPLIT_EVERY = 100
SHARD_MAGIC, SHARD_VERSION = 20240520, 1

# package -> regular expressions on the file's path inside the package; a file is taken when one
# matches. Packages not listed contribute their .txt, .rst, .pod and .html files (and .gz of them).
SELECT = {
    "linux-doc-6.1": [r"^usr/share/doc/linux-doc-6\.1/Documentation/.*\.(rst|txt)\.gz$"],
    "python3.11-doc": [r"^usr/share/doc/python3\.11/html/_sources/.*\.txt$"],
    "perl-doc": [r"\.pod$"],
    "git-doc": [r"^usr/share/doc/git-doc/.*\.txt$"],
    "postgresql-doc-15": [r"\.html$"],
    "sqlite3-doc": [r"\.html$"],
    "debian-reference-en": [r"\.html$"],
}
DEFAULT_SELECT = [r"\.(txt|rst|pod|html?)(\.gz)?$"]
# Debian packaging files are not the package's documentation.
# Translated documentation (linux-doc's Documentation/translations/: Chinese, Japanese, Korean,
# Italian, Spanish) is not English.
EXCLUDE = re.compile(r"(^|/)(copyright|changelog[^/]*|NEWS\.Debian[^/]*|README\.Debian[^/]*)$|^usr/share/lintian/"
                     r"|(^|/)translations/")
# A cleaned document with a larger share of non-ASCII characters is not English prose.
MAX_NON_ASCII = 0.05


def non_english(doc):
    text = doc.decode("utf-8")
    return bool(text) and sum(1 for ch in text if ord(ch) > 127) > MAX_NON_ASCII * len(text)

BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "dl", "dt", "dd", "tr", "table", "pre", "h1", "h2", "h3",
              "h4", "h5", "h6", "blockquote", "section", "article", "header", "footer", "hr", "title", "td", "th"}


class _HtmlText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.pre = [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
        if tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        # outside <pre>, source line breaks and indentation are layout, not text
        self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(text):
    p = _HtmlText()
    p.feed(text)
    p.close()
    return "".join(p.parts)


def normalise(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.expandtabs(8).rstrip() for line in text.split("\n"))
    text = "".join(ch for ch in text if ch == "\n" or not (ord(ch) < 32 or ord(ch) == 127))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def clean(raw, path):
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
        path = path[:-3]
    text = raw.decode("utf-8", errors="replace")
    if path.endswith((".html", ".htm")):
        text = html_to_text(text)
    return normalise(text).encode("utf-8")


def documents(root, packages):
    for pkg in packages:
        base = os.path.join(root, pkg)
        rules = [re.compile(r) for r in SELECT.get(pkg, DEFAULT_SELECT)]
        files = []
        for d, _, names in os.walk(base):
            for n in names:
                rel = os.path.relpath(os.path.join(d, n), base).replace(os.sep, "/")
                if os.path.isfile(os.path.join(d, n)) and not EXCLUDE.search(rel) and any(r.search(rel) for r in rules):
                    files.append(rel)
        for rel in sorted(files):
            with open(os.path.join(base, rel), "rb") as f:
                yield pkg, rel, clean(f.read(), rel)


def write_shard(path, tokens):
    with open(path, "wb") as f:
        header = [0] * 256
        header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
        f.write(struct.pack("<256i", *header))
        if sys.byteorder != "little":
            tokens = array.array("H", tokens)
            tokens.byteswap()
        tokens.tofile(f)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(root, out):
    with open(os.path.join(root, "sources.json")) as f:
        sources = json.load(f)
    packages = sorted(s["package"] for s in sources)
    seen = set()
    streams = {"train": array.array("H"), "val": array.array("H")}
    per_pkg = {p: {"documents": 0, "bytes": 0, "duplicates": 0, "non_english": 0} for p in packages}
    kept = 0
    for pkg, rel, doc in documents(root, packages):
        if not doc:
            continue
        if non_english(doc):
            per_pkg[pkg]["non_english"] += 1
            continue
        digest = hashlib.sha256(doc).digest()
        if digest in seen:
            per_pkg[pkg]["duplicates"] += 1
            continue
        seen.add(digest)
        kept += 1
        split = "val" if kept % SPLIT_EVERY == 0 else "train"
        streams[split].append(BOS)
        streams[split].extend(doc)
        per_pkg[pkg]["documents"] += 1
        per_pkg[pkg]["bytes"] += len(doc)
    if not streams["train"] or not streams["val"]:
        sys.exit(f"text_corpus.py: {kept} documents: too few for a validation split (every {SPLIT_EVERY}th)")
    os.makedirs(out, exist_ok=True)
    files = {}
    for split, toks in streams.items():
        path = os.path.join(out, split + ".bin")
        write_shard(path, toks)
        files[split + ".bin"] = {"tokens": len(toks), "documents": toks.count(BOS), "bytes": os.path.getsize(path),
                                 "sha256": sha256_file(path)}
    for s in sources:
        s.update(per_pkg[s["package"]])
    manifest = {
        "format": "modded-nanogpt .bin shards (magic 20240520, version 1, uint16 tokens): bytes 0..255, BOS = 256 before each document",
        "bos": BOS,
        "documents": kept,
        "text_bytes": sum(p["bytes"] for p in per_pkg.values()),
        "split": f"the k-th kept document (k = 1, 2, ...) goes to val.bin when k % {SPLIT_EVERY} == 0, else to train.bin",
        "cleaning": "HTML to text; UTF-8 (invalid -> U+FFFD); LF line ends; tabs expanded (8); control characters and "
                    "trailing spaces dropped; blank-line runs -> one; empty documents dropped",
        "english": f"files under translations/ not selected; documents over {MAX_NON_ASCII:.0%} non-ASCII characters "
                   "dropped (per package: non_english)",
        "dedup": "exact: a document whose cleaned bytes (SHA-256) equal an earlier one's is dropped",
        "files": files,
        "sources": sources,
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    m = build(sys.argv[1], sys.argv[2])
    print(f"{m['documents']} documents, {m['text_bytes']} bytes of text: "
          f"train {m['files']['train.bin']['tokens']} tokens, val {m['files']['val.bin']['tokens']} tokens")
