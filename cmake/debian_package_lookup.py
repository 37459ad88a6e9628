"""Find a Debian binary package's pool path and SHA256 in a suite's Packages index.

Called by cmake/OrtHeaders.cmake only when the pinned libonnxruntime-dev .deb has left
Debian's pool (the pool drops superseded versions). The index is xz-compressed and CMake
cannot decompress a bare .xz file, hence this stdlib-only helper run with the build's Python.

On success it prints one CMake list, ``<Filename>;<SHA256>;<Version>;<suite>``, and exits 0.
It exits 1 when no suite lists the package, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import io
import lzma
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator

_WANTED_FIELDS = ("Package", "Version", "Filename", "SHA256")


def _stanzas(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Yields each paragraph of a Packages file, keeping only the fields this script reads."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            if fields:
                yield fields
            fields = {}
        elif not line[0].isspace():
            key, _, value = line.partition(":")
            if key in _WANTED_FIELDS:
                fields[key] = value.strip()
    if fields:
        yield fields


def find_in_suite(mirror: str, suite: str, component: str, arch: str, package: str) -> dict[str, str] | None:
    """Returns the package's fields from one suite's index, or None if the suite lacks it.

    Raises:
        urllib.error.URLError, OSError, lzma.LZMAError: the index could not be read.
    """
    url = f"{mirror}/dists/{suite}/{component}/binary-{arch}/Packages.xz"
    # Stream-decompress: the index is ~10 MB compressed, ~60 MB of text.
    with (
        urllib.request.urlopen(url, timeout=120) as response,
        io.TextIOWrapper(lzma.open(response), encoding="utf-8", errors="replace") as text,
    ):
        for fields in _stanzas(text):
            if fields.get("Package") == package:
                missing = [name for name in _WANTED_FIELDS if name not in fields]
                if missing:
                    raise OSError(f"{url}: entry for {package} lacks {', '.join(missing)}")
                return fields
    return None


def main(argv: list[str] | None = None) -> int:
    """Searches the suites in order and prints the first match."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default="https://deb.debian.org/debian")
    parser.add_argument("--suite", action="append", required=True, help="repeat; searched in order")
    parser.add_argument("--component", default="main")
    parser.add_argument("--arch", default="amd64")
    parser.add_argument("package")
    args = parser.parse_args(argv)

    mirror = args.mirror.rstrip("/")
    for suite in args.suite:
        try:
            fields = find_in_suite(mirror, suite, args.component, args.arch, args.package)
        except (urllib.error.URLError, OSError, lzma.LZMAError, EOFError) as error:
            print(f"debian_package_lookup: {suite}: {error}", file=sys.stderr)
            continue
        if fields is None:
            print(f"debian_package_lookup: {suite}: no package {args.package}", file=sys.stderr)
            continue
        print(f"{fields['Filename']};{fields['SHA256']};{fields['Version']};{suite}")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
