"""The trajectory viewer: a local web page over a run's traces (`python -m awm_grpo.traces serve RUN_DIR`).

store.py reads run directories, server.py serves the page and its JSON API (aiohttp), export.py
writes a self-contained HTML copy; static/ holds the page (plain HTML, CSS and JS, no CDN).
"""
