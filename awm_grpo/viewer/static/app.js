// The trajectory viewer's page: plain JS, no framework, no build step, no network but its own server.
// Served: it asks the JSON API (awm_grpo/viewer/server.py). Exported: it reads the same answers from
// the embedded #awm-data block (awm_grpo/viewer/export.py). The page state lives in location.hash,
// so a view is a link: #run=.&ep=rollout_000001.jsonl:3&cmp=rollout_000002.jsonl:0&turn=2&outcome=failure
"use strict";

const EMBEDDED = (() => {
  const node = document.getElementById("awm-data");
  return node ? JSON.parse(node.textContent) : null;
})();
const FILTERS = ["file", "scenario", "task_type", "outcome"];
const COLOURS = ["#2563b0", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207"];
const MAX_ROWS = 500;
const SVG = "http://www.w3.org/2000/svg";

let summary = null; // the current run's /api/run answer

async function api(path, params) {
  if (EMBEDDED) {
    if (path === "/api/runs") return { root: EMBEDDED.root, runs: EMBEDDED.runs };
    if (path === "/api/run") return EMBEDDED.summaries[params.run];
    const ep = (EMBEDDED.episodes[params.run] || {})[params.id];
    if (!ep) throw new Error("episode " + params.id + " is not in this export (see --max-episodes)");
    return ep;
  }
  const response = await fetch(path + "?" + new URLSearchParams(params || {}));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// ---- small DOM helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const shortHash = (h) => (h ? String(h).slice(0, 12) : "–");

function showError(err) {
  const box = document.getElementById("error");
  box.hidden = !err;
  box.textContent = err ? String(err.message || err) : "";
}

// ---- page state in the hash ------------------------------------------------------------------------

function state() {
  return Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
}

function setState(changes) {
  const next = { ...state(), ...changes };
  for (const k of Object.keys(next)) if (next[k] === "" || next[k] === null || next[k] === undefined) delete next[k];
  location.hash = new URLSearchParams(next).toString();
}

// ---- overview: steps table and curves ------------------------------------------------------------

function renderSteps() {
  const body = document.querySelector("#steps tbody");
  body.replaceChildren();
  const stats = {};
  for (const [series, points] of Object.entries(summary.curves)) {
    for (const p of points) stats[series + "@" + p.step] = p;
  }
  const current = state().file;
  for (const f of summary.files) {
    const p = stats[f.series + "@" + (f.step === null ? 0 : f.step)] || {};
    const row = el("tr", { "data-file": f.name, class: current === f.name ? "selected" : null,
                           onclick: () => setState({ file: current === f.name ? "" : f.name, ep: "", cmp: "" }) },
      el("td", {}, f.name), el("td", {}, f.series), el("td", {}, f.step === null ? "–" : f.step),
      el("td", {}, f.episodes), el("td", {}, pct(p.success_rate)), el("td", {}, fmt(p.reward_mean)));
    body.append(row);
  }
}

function chart(title, key, lo, hi, seriesList) {
  const W = 300, H = 150, L = 38, R = 8, T = 18, B = 24;
  const steps = seriesList.flatMap(([, pts]) => pts.map((p) => p.step));
  const x0 = Math.min(...steps), x1 = Math.max(...steps);
  const sx = (s) => (x1 === x0 ? (L + W - R) / 2 : L + ((s - x0) / (x1 - x0)) * (W - L - R));
  const sy = (v) => T + (1 - (v - lo) / (hi - lo || 1)) * (H - T - B);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", "data-metric": key });
  g.append(svg("text", { x: L, y: 12, "font-size": 11, fill: "#6b7480" }, title));
  for (const v of [lo, (lo + hi) / 2, hi]) {
    g.append(svg("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#d9dee4" }));
    g.append(svg("text", { x: L - 4, y: sy(v) + 3, "font-size": 9, "text-anchor": "end", fill: "#6b7480" },
                 key === "success_rate" ? Math.round(v * 100) + "%" : v.toFixed(2)));
  }
  for (const s of [...new Set(steps)]) {
    g.append(svg("text", { x: sx(s), y: H - 8, "font-size": 9, "text-anchor": "middle", fill: "#6b7480" }, s));
  }
  g.append(svg("text", { x: W - R, y: 12, "font-size": 9, "text-anchor": "end", fill: "#6b7480" }, "x: step"));
  seriesList.forEach(([name, pts], i) => {
    const colour = COLOURS[i % COLOURS.length];
    const valid = pts.filter((p) => p[key] !== null && p[key] !== undefined);
    if (valid.length > 1) {
      g.append(svg("polyline", { points: valid.map((p) => `${sx(p.step)},${sy(p[key])}`).join(" "),
                                 fill: "none", stroke: colour, "stroke-width": 1.8 }));
    }
    for (const p of valid) {
      g.append(svg("circle", { cx: sx(p.step), cy: sy(p[key]), r: 3, fill: colour, class: "point",
                               "data-series": name, "data-step": p.step, "data-value": p[key] },
                   svg("title", {}, `${name} step ${p.step}: ${key} ${fmt(p[key])} (${p.episodes} episodes)`)));
    }
  });
  return g;
}

function renderCurves() {
  const box = document.getElementById("curves");
  box.replaceChildren();
  const seriesList = Object.entries(summary.curves);
  if (!seriesList.length) return;
  const rewards = seriesList.flatMap(([, pts]) => pts.map((p) => p.reward_mean)).filter((v) => v !== null);
  const lo = Math.min(0, ...rewards), hi = Math.max(1, ...rewards);
  box.append(el("div", { style: "display:grid;grid-template-columns:1fr 1fr;gap:8px" },
                chart("success rate", "success_rate", 0, 1, seriesList), chart("mean reward", "reward_mean", lo, hi, seriesList)));
  box.append(el("div", { class: "legend" }, seriesList.map(([name], i) =>
    el("span", {}, el("span", { class: "swatch", style: `background:${COLOURS[i % COLOURS.length]}` }), name))));
}

// ---- episode list with filters --------------------------------------------------------------------

function renderFilters() {
  const s = state();
  for (const key of FILTERS) {
    const select = document.getElementById("f-" + key);
    select.replaceChildren(el("option", { value: "" }, "all"),
      ...summary.facets[key].map((v) => el("option", { value: v, selected: s[key] === v }, v)));
  }
}

function filtered() {
  const s = state();
  return summary.episodes.filter((r) => FILTERS.every((k) => !s[k] || String(r[k]) === s[k]));
}

const taskText = (r) => summary.tasks[`${r.scenario}#${r.task_idx}`] || "";

function renderEpisodes() {
  const rows = filtered();
  const s = state();
  document.getElementById("count").textContent =
    `${rows.length} of ${summary.episodes.length}` + (rows.length > MAX_ROWS ? ` (first ${MAX_ROWS} shown)` : "");
  const body = document.querySelector("#episodes tbody");
  body.replaceChildren(...rows.slice(0, MAX_ROWS).map((r) =>
    el("tr", { "data-id": r.id, "data-outcome": r.outcome, class: r.id === s.ep || r.id === s.cmp ? "selected" : null,
               onclick: () => setState({ ep: r.id, cmp: "", turn: "" }) },
      el("td", {}, r.step === null ? "–" : r.step),
      el("td", { class: "task-cell", title: `${r.task_type}: ${taskText(r)}` },
         el("b", {}, `${r.scenario}#${r.task_idx}`), " ", el("span", { class: "muted" }, taskText(r))),
      el("td", {}, r.turns),
      el("td", { class: "outcome-" + r.outcome }, r.outcome), el("td", {}, fmt(r.reward, 2)))));
}

// ---- one trajectory, turn by turn -----------------------------------------------------------------

function changeText(entry) {
  if (entry.table) return `table ${entry.table}`;
  const cols = (entry.changed_columns || []).length ? ` (${entry.changed_columns.join(", ")})` : "";
  return `+${entry.added} −${entry.removed} ~${entry.changed}${cols}`;
}

function dbBlock(view) {
  if (view.state_hash === undefined && view.phi === undefined) return null;
  const parts = [el("div", { class: "label" }, "database")];
  if (view.state_hash !== undefined) {
    parts.push(el("div", {},
      el("span", { class: "hash", title: view.state_hash }, "state " + shortHash(view.state_hash)), " ",
      el("span", { class: "badge " + (view.state_changed ? "changed" : "same") },
         view.state_changed ? "changed this turn" : "no change"),
      view.tables_changed.length ? " tables: " + view.tables_changed.join(", ") : ""));
    const since = Object.entries(view.changes_since_start || {});
    if (since.length) {
      parts.push(el("div", { class: "db-table muted" }, "since start: ",
                    since.map(([t, e]) => `${t} ${changeText(e)}`).join(" · ")));
    }
  }
  for (const [table, r] of Object.entries(view.rows || {})) {
    const bits = [];
    if (r.inserted.length) bits.push("inserted " + r.inserted.join(" "));
    if (r.updated.length) bits.push("updated " + r.updated.join(" "));
    if (r.deleted.length) bits.push("deleted " + r.deleted.join(" "));
    parts.push(el("div", { class: "db-table rows" }, `${table}: ${bits.join("; ")}`));
  }
  if (view.phi !== undefined && view.phi !== null) {
    const d = view.phi_delta;
    parts.push(el("div", { class: "phi" }, "Φ ", fmt(view.phi, 2), " ",
      d === null || d === undefined ? "" : el("span", { class: d > 0 ? "up" : d < 0 ? "down" : "" },
                                              `(${d >= 0 ? "+" : ""}${fmt(d, 2)})`),
      "  Φ_b ", fmt(view.phi_b, 2)));
  }
  return el("div", { class: "block db" }, parts);
}

function callBlock(turn) {
  const calls = turn.calls || [];
  if (!calls.length) return null;
  return el("div", { class: "block calls" }, el("div", { class: "label" }, "tool call"),
    calls.map((c) => c.invalid !== undefined
      ? el("div", { class: "call error" }, "invalid call: " + c.invalid, el("pre", {}, c.raw || ""))
      : el("div", { class: "call" + (c.is_error ? " error" : "") },
           `${c.name}(${JSON.stringify(c.arguments)})` + (c.kind && c.kind !== "ok" ? `  [${c.kind}]` : ""))));
}

function turnCard(turn, view, diverged) {
  const obs = turn.observations || [];
  const error = (turn.calls || []).some((c) => c.is_error || c.invalid !== undefined);
  return el("div", { class: "turn" + (diverged ? " diverged" : ""), "data-turn": turn.turn },
    el("div", { class: "turn-head" }, el("b", {}, "turn " + turn.turn),
       el("span", { class: "muted" }, `${turn.tokens ?? "?"} tokens · finish ${turn.finish ?? "–"}`),
       diverged ? el("span", { class: "badge changed" }, "state differs from the other") : null),
    el("div", { class: "block model" }, el("div", { class: "label" }, "model"), el("pre", {}, turn.assistant || "")),
    callBlock(turn),
    obs.length ? el("div", { class: "block observation" }, el("div", { class: "label" }, "observation"),
                    obs.map((o) => el("pre", { class: "obs" + (error ? " error" : "") }, o))) : null,
    dbBlock(view));
}

function trajectory(ep, divergedTurns) {
  const r = ep.record;
  const row = { outcome: r.infra_error ? "infra" : r.verdict === "complete" ? "success" : "failure" };
  const recovery = r.recovery || {};
  return el("div", { class: "trajectory", "data-id": ep.id },
    el("div", { class: "traj-head" },
      el("div", { class: "muted" }, `${ep.id} · ${ep.series} step ${ep.step ?? "–"} · group ${r.group_index ?? "–"} sample ${r.index ?? "–"}`),
      el("div", { class: "task" }, `${r.scenario}#${r.task_idx}: ${r.task || ""}`),
      el("div", { class: "kv" },
        el("span", {}, el("b", {}, "type "), r.task_type || "unlabelled"),
        el("span", {}, el("b", {}, "turns "), (r.turns || []).length),
        el("span", {}, el("b", {}, "tool calls "), r.tool_calls ?? 0),
        el("span", {}, el("b", {}, "stop "), r.stop_reason || "–"),
        recovery.phi0 !== undefined ? el("span", { class: "phi" }, el("b", {}, "Φ₀ "), fmt(recovery.phi0, 2)) : null,
        el("span", { class: "outcome-" + row.outcome }, el("b", {}, "verdict "), r.verdict || "–"),
        el("span", {}, el("b", {}, "reward "), fmt(r.reward, 2)))),
    (r.turns || []).map((t, i) => turnCard(t, ep.turns[i] || {}, divergedTurns.has(i))),
    el("div", { class: "verdict " + row.outcome },
      el("div", {}, el("b", {}, "verdict "), r.verdict || "–", " · ", el("b", {}, "reward "), fmt(r.reward, 2),
         " · ", el("b", {}, "stop "), r.stop_reason || "–"),
      r.final_answer ? el("div", {}, el("div", { class: "label" }, "final answer"), el("pre", {}, r.final_answer)) : null,
      r.verifier_detail ? el("div", {}, el("div", { class: "label" }, "verifier"), el("pre", {}, r.verifier_detail)) : null,
      r.infra_error ? el("div", { class: "outcome-infra" }, "infrastructure failure: " + r.infra_error) : null));
}

function divergence(a, b) {
  // turns where both episodes ran a tool and their DB state hashes differ
  const out = new Set();
  const n = Math.min(a.turns.length, b.turns.length);
  for (let i = 0; i < n; i++) {
    const ha = a.turns[i].state_hash, hb = b.turns[i].state_hash;
    if (ha && hb && ha !== hb) out.add(i);
  }
  return out;
}

async function renderDetail() {
  const s = state();
  const detail = document.getElementById("detail");
  const bar = document.getElementById("compare-bar");
  if (!s.ep) {
    bar.hidden = true;
    detail.className = "";
    detail.replaceChildren(el("p", { class: "muted" }, "Pick an episode on the left."));
    return;
  }
  const first = await api("/api/episode", { run: s.run, id: s.ep });
  const row = summary.episodes.find((r) => r.id === s.ep);
  const siblings = summary.episodes.filter((r) => r.id !== s.ep && row &&
                                                  r.scenario === row.scenario && r.task_idx === row.task_idx);
  const select = document.getElementById("compare");
  select.replaceChildren(el("option", { value: "" }, siblings.length ? "— pick one —" : "no other episode of this task"),
    ...siblings.map((r) => el("option", { value: r.id, selected: r.id === s.cmp },
                              `${r.id} · step ${r.step ?? "–"} · ${r.outcome} · ${r.turns} turns`)));
  bar.hidden = false;
  document.getElementById("close-compare").hidden = !s.cmp;
  if (!s.cmp) {
    detail.className = "";
    detail.replaceChildren(trajectory(first, new Set()));
    return;
  }
  const second = await api("/api/episode", { run: s.run, id: s.cmp });
  const diverged = divergence(first, second);
  detail.className = "pair";
  const columns = [trajectory(first, diverged), trajectory(second, diverged)];
  // one grid row per turn shared by both columns (CSS subgrid): turn i sits beside turn i
  const rows = Math.max(first.record.turns.length, second.record.turns.length) + 2;
  for (const column of columns) column.style.gridRow = `1 / span ${rows}`;
  detail.replaceChildren(...columns);
}

function scrollToTurn() {
  // #...&turn=N: a link to one turn; the trajectory pane scrolls, the page stays
  const turn = state().turn;
  const detail = document.getElementById("detail");
  const card = turn && detail.querySelector(`.turn[data-turn="${CSS.escape(turn)}"]`);
  const head = Math.max(0, ...[...detail.querySelectorAll(".traj-head")].map((h) => h.offsetHeight));
  detail.scrollTop = card ? card.offsetTop - detail.offsetTop - head - 10 : 0;
}

// ---- wiring ---------------------------------------------------------------------------------------

let loadedRun = null;

async function render() {
  try {
    showError(null);
    const s = state();
    if (s.run !== loadedRun) {
      summary = await api("/api/run", { run: s.run });
      loadedRun = s.run;
      document.getElementById("run").value = s.run;
    }
    renderSteps();
    renderCurves();
    renderFilters();
    renderEpisodes();
    await renderDetail();
    scrollToTurn();
    document.body.dataset.ready = "1"; // for tests and screenshots: everything for this hash is drawn
  } catch (err) {
    showError(err);
    document.body.dataset.ready = "error";
  }
}

async function start() {
  try {
    const { root, runs } = await api("/api/runs");
    document.getElementById("root").textContent = root;
    const select = document.getElementById("run");
    select.replaceChildren(...runs.map((r) => el("option", { value: r }, r)));
    select.addEventListener("change", () => setState({ run: select.value, ep: "", cmp: "", file: "" }));
    if (!runs.length) throw new Error(`no trace files under ${root}`);
    for (const key of FILTERS) {
      document.getElementById("f-" + key).addEventListener("change", (e) => setState({ [key]: e.target.value }));
    }
    document.getElementById("compare").addEventListener("change", (e) => setState({ cmp: e.target.value }));
    document.getElementById("close-compare").addEventListener("click", () => setState({ cmp: "" }));
    window.addEventListener("hashchange", () => { document.body.dataset.ready = ""; render(); });
    if (!runs.includes(state().run)) {
      history.replaceState(null, "", "#" + new URLSearchParams({ ...state(), run: runs[0] }));
    }
    await render();
  } catch (err) {
    showError(err);
    document.body.dataset.ready = "error";
  }
}

start();
