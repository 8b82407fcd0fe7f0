"""Imports of optional packages whose start-up warnings would only alarm in gptrain's output."""

from __future__ import annotations

import logging
import sys

ENUM_NOTICE = "is an Enum subclass and is now natively supported by torch.compile"
"""torch's pytree deprecation notice, logged once per enum that torchao registers, whenever one of
its modules defining such enums is imported (by gptrain's FP8, or by transformers)."""


class _DropEnumNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ENUM_NOTICE not in record.getMessage()


_PYTREE_FILTER = _DropEnumNotice()


def import_torchao_quietly() -> None:
    """Import torchao with its start-up warnings silenced (ImportError when it is not installed),
    and drop torch's notices about torchao's enum registrations from then on.

    On import torchao loads its compiled extensions (MX-format and CUTLASS kernels) and logs a
    warning for each one the installed torch cannot load, which is every one on a CPU build and on
    a CUDA build other than torchao's. Float8 training runs on torch._scaled_mm and needs none of
    them, and transformers imports torchao's modules when it builds a model (export, import), so in
    gptrain's output these lines would only alarm. Errors still show.
    """
    pytree = logging.getLogger("torch.utils._pytree")
    if _PYTREE_FILTER not in pytree.filters:
        pytree.addFilter(_PYTREE_FILTER)
    if "torchao" in sys.modules:
        return
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401
    finally:
        logger.setLevel(level)
