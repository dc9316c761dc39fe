"""Definitions autoloaded by ``dg.load_from_defs_folder``."""
