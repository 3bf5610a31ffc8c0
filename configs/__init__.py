"""ml-collections configs, one ``get_config()`` per model or paper table."""
