"""ml-collections configs, one ``get_config()`` per model or paper table.

Installed as ``locvit.configs`` (see ``locvit/configs/__init__.py``); configs import each other
under that name so that they run from a checkout and from a wheel alike. They are plain data:
besides the standard library and ``ml_collections`` they import only ``locvit.configs`` modules
(``common``: the base config; ``defaults``: the default blocks and constants it is built from;
``args``: the parser of ``--config=FILE:ARG``), so loading one does not import JAX.
"""
