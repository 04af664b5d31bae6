"""``python -m docket_core.sansio --diagram``: print the lifecycle table as
drawn in ``lifecycle``'s docstring (paste it there when the table changes)."""

from __future__ import annotations

import sys

from .lifecycle import diagram

if __name__ == "__main__":
    if sys.argv[1:] != ["--diagram"]:
        sys.exit("usage: python -m docket_core.sansio --diagram")
    print(diagram())
