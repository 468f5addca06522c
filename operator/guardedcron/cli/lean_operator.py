"""Keep the official `kubernetes` client out of the operator's process.

The CLI depends on the official client for its logins (guardedcron.cli.kubeconfig), so
it is installed wherever guardedcron is, the image included. kopf imports it at its own
import whenever it can (to recognise the client's model objects as bodies, and for
logins we do not use: the operator registers its own login handler), which cost the
operator 21 MiB of resident memory and about a second of start-up on two busy cores
(docs/design.md, "The CLI's logins"). The operator passes kopf no such objects, so
`guardedcron operator` makes the package unimportable before kopf is imported; kopf
then takes its "not installed" path, as it would on an install without the client.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN_PACKAGE = "kubernetes"


class HideOfficialClient(importlib.abc.MetaPathFinder):
    """Answers every import of the package, and only it, with ModuleNotFoundError."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname == HIDDEN_PACKAGE or fullname.startswith(HIDDEN_PACKAGE + "."):
            raise ModuleNotFoundError(f"{fullname} is kept out of the operator's process "
                                      "(guardedcron.cli.lean_operator)", name=fullname)
        return None


def hide_official_client() -> bool:
    """Hide the package from later imports; False if it is already imported (a test
    running the operator in its own process), when there is nothing left to save."""
    if HIDDEN_PACKAGE in sys.modules:
        return False
    if not any(isinstance(finder, HideOfficialClient) for finder in sys.meta_path):
        sys.meta_path.insert(0, HideOfficialClient())
    return True
