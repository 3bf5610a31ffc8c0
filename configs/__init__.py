"""ml-collections configs, one ``get_config()`` per model or paper table.

Installed as ``locvit.configs`` (see ``locvit/configs/__init__.py``); configs import each other
under that name so that they run from a checkout and from a wheel alike.
"""
