#!/usr/bin/env python3
"""Prints agentbay.wxs with one component per wheel of DIR (the Python SDK
and its dependencies) in the install directory's python folder. Each
component's GUID is derived from the wheel's file name, so an upgrade
replaces a changed wheel and keeps an unchanged one.

    with-wheels.py agentbay.wxs DIR > out.wxs
"""

import sys
import uuid
from pathlib import Path
from xml.sax.saxutils import quoteattr

NAMESPACE = uuid.UUID("2a14f8bb-2ecd-4bf3-8821-7241221a9032")


def main() -> None:
    wxs, wheels = Path(sys.argv[1]).read_text(), sorted(Path(sys.argv[2]).glob("*.whl"))
    if not wheels:
        sys.exit(f"no wheels in {sys.argv[2]}")
    components, refs = [], []
    for i, wheel in enumerate(wheels):
        cid = f"PythonWheel{i}"
        guid = uuid.uuid5(NAMESPACE, wheel.name)
        components.append(
            f'<Component Id="{cid}" Guid="{guid}" Win64="yes">'
            f'<File Id="{cid}File" Name={quoteattr(wheel.name)} Source={quoteattr(str(wheel))} KeyPath="yes"/>'
            "</Component>"
        )
        refs.append(f'<ComponentRef Id="{cid}"/>')
    out = wxs.replace("<!-- PYTHON-WHEELS -->", "\n            ".join(components))
    out = out.replace("<!-- PYTHON-WHEEL-REFS -->", "\n      ".join(refs))
    sys.stdout.write(out)


if __name__ == "__main__":
    main()
