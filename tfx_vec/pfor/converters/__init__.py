"""Converter modules, one per op family; importing this package registers all of them.

Every module in this folder (except private ``_*`` ones) is imported, so a new family is
added by dropping a file here that uses ``@register_converter``.
"""
import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if not _info.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_info.name}")
