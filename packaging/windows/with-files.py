#!/usr/bin/env python3
"""Prints agentbay.wxs with the files only known at build time:

- one component per wheel of WHEELS (the Python SDK and its dependencies)
  in the install directory's python folder;
- one component per file under EXAMPLES (packaging/examples: releases,
  the adapter and the LangGraph example) in its examples folder, its
  subdirectories kept.

Each component's GUID is derived from the file's name (a wheel) or its
path under EXAMPLES, so an upgrade replaces a changed file and keeps an
unchanged one.

    with-files.py agentbay.wxs WHEELS EXAMPLES > out.wxs
"""

import sys
import uuid
from pathlib import Path
from xml.sax.saxutils import quoteattr

NAMESPACE = uuid.UUID("2a14f8bb-2ecd-4bf3-8821-7241221a9032")


def component(cid: str, guid: uuid.UUID, name: str, source: Path) -> str:
    return (
        f'<Component Id="{cid}" Guid="{guid}" Win64="yes">'
        f'<File Id="{cid}File" Name={quoteattr(name)} Source={quoteattr(str(source))} KeyPath="yes"/>'
        "</Component>"
    )


def tree(directory: Path, root: Path, refs: list[str], counter: list[int]) -> str:
    """The components of a directory's files and its subdirectories."""
    parts = []
    for entry in sorted(directory.iterdir()):
        counter[0] += 1
        n = counter[0]
        if entry.is_dir():
            inner = tree(entry, root, refs, counter)
            parts.append(f'<Directory Id="ExampleDir{n}" Name={quoteattr(entry.name)}>{inner}</Directory>')
        elif entry.is_file():
            cid = f"Example{n}"
            rel = entry.relative_to(root).as_posix()
            parts.append(component(cid, uuid.uuid5(NAMESPACE, "examples/" + rel), entry.name, entry))
            refs.append(f'<ComponentRef Id="{cid}"/>')
    return "".join(parts)


def main() -> None:
    wxs = Path(sys.argv[1]).read_text()
    wheels = sorted(Path(sys.argv[2]).glob("*.whl"))
    examples = Path(sys.argv[3])
    if not wheels:
        sys.exit(f"no wheels in {sys.argv[2]}")
    if not examples.is_dir():
        sys.exit(f"no examples in {examples}")
    components, refs = [], []
    for i, wheel in enumerate(wheels):
        cid = f"PythonWheel{i}"
        components.append(component(cid, uuid.uuid5(NAMESPACE, wheel.name), wheel.name, wheel))
        refs.append(f'<ComponentRef Id="{cid}"/>')
    out = wxs.replace("<!-- PYTHON-WHEELS -->", "\n            ".join(components))
    example_refs: list[str] = []
    out = out.replace("<!-- EXAMPLES -->", tree(examples, examples, example_refs, [0]))
    out = out.replace("<!-- COMPONENT-REFS -->", "\n      ".join(refs + example_refs))
    sys.stdout.write(out)


if __name__ == "__main__":
    main()
