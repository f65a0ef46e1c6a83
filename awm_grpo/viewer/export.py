"""A static, self-contained copy of the viewer: one HTML file with the page, its script and the run's data.

    python -m awm_grpo.traces export RUN_DIR OUT_DIR      # -> OUT_DIR/index.html, opens from disk

The page is the served one (static/) with the stylesheet and script inlined and every answer of
the JSON API embedded as one JSON block, which app.js reads instead of fetching. Good for sharing
an eval or a short run; a long training run's every trajectory makes a large file (`--max-episodes`).
"""

from __future__ import annotations

from pathlib import Path

from awm_grpo.viewer.server import STATIC, to_json
from awm_grpo.viewer.store import RunStore


def export_data(root: Path, max_episodes: int = 0) -> dict:
    """{"root", "runs", "summaries": {run: summary}, "episodes": {run: {id: episode}}} (the API's answers)."""
    store = RunStore(root)
    data: dict = {"root": str(store.root), "runs": list(store.runs()), "summaries": {}, "episodes": {}}
    for run in data["runs"]:
        summary = dict(store.summary(run))  # the store keeps its summary: cut a copy
        if max_episodes:
            summary["episodes"] = summary["episodes"][:max_episodes]
        data["summaries"][run] = summary
        data["episodes"][run] = {row["id"]: store.episode(run, row["id"]) for row in summary["episodes"]}
    return data


def export(root: Path, out_dir: Path, max_episodes: int = 0) -> Path:
    """Write OUT_DIR/index.html; returns its path."""
    page = (STATIC / "index.html").read_text()
    css = (STATIC / "style.css").read_text()
    js = (STATIC / "app.js").read_text()
    if "</script" in js.lower():
        raise ValueError("app.js contains '</script': it could not be inlined into the exported page")
    data = to_json(export_data(root, max_episodes)).decode().replace("</", "<\\/")
    page = page.replace('<link rel="stylesheet" href="/static/style.css">', f"<style>\n{css}\n</style>")
    page = page.replace('<script src="/static/app.js"></script>',
                        f'<script type="application/json" id="awm-data">{data}</script>\n' + f"<script>\n{js}\n</script>")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
