"""Small shared pieces plugins import by path: `types` (Sample), `misc` (load_function), `http_utils`.

Nothing is re-exported here so that importing `slime.utils.types` stays free of httpx and friends.
"""
