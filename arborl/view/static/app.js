// arborl view: a read-only explorer over the JSON API of arborl/view/api.py.
// Views are picked by the URL hash: #/episodes?filters, #/episode/ID, #/group/ID, #/runs, #/profile.
// Every string from the store is put into the page as text (textContent), never as HTML.
"use strict";

const PALETTE = ["#e63946", "#2a9d8f", "#e9c46a", "#457b9d", "#f4a261", "#8338ec", "#3a86ff", "#06d6a0",
                 "#ff006e", "#8d99ae"];
const STOP_REASONS = ["", "terminated", "truncated", "max_turns", "max_context", "env_error"];

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of kids.flat(Infinity)) if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of kids.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

async function api(path, params) {
  const q = params ? "?" + params.toString() : "";
  const r = await fetch(path + q);
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

const fmt = (x, d = 3) => (x === null || x === undefined ? "-" : typeof x === "number" ? +x.toFixed(d) : String(x));
const when = (t) => new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
const main = () => document.getElementById("main");

function show(...nodes) {
  const m = main();
  m.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
  return m;
}

function fail(e) {
  show(h("p", { class: "error", id: "error" }, String(e.message || e)));
}

// --- episode list -------------------------------------------------------------------------------
const listState = { key: "", cursors: [null], page: 0, sortCol: null, sortDir: 1 };

function filterForm(params) {
  const field = (name, label, attrs = {}) =>
    h("label", {}, label, h("input", { name, value: params.get(name) || "", ...attrs }));
  const select = (name, label, options) =>
    h("label", {}, label, h("select", { name }, options.map(([v, t]) =>
      h("option", { value: v, selected: (params.get(name) || "") === v }, t))));
  const form = h("form", { class: "filters", id: "filters" },
    field("task_type", "task type", { list: "task-types" }), field("source", "source", { list: "sources" }),
    select("success", "success", [["", "any"], ["true", "succeeded"], ["false", "failed"]]),
    field("min_reward", "reward ≥", { type: "number", step: "any" }),
    field("max_reward", "reward ≤", { type: "number", step: "any" }),
    field("iteration", "iteration", { type: "number" }), field("min_iteration", "iteration ≥", { type: "number" }),
    field("max_iteration", "iteration ≤", { type: "number" }), field("policy_version", "policy", { type: "number" }),
    field("tag", "tag"),
    select("stop_reason", "stop / errors", STOP_REASONS.map((s) => [s, s === "" ? "any" : s === "env_error" ? "env_error (errors)" : s])),
    select("order", "order", [["newest", "newest first"], ["oldest", "oldest first"]]),
    select("limit", "per page", [["50", "50"], ["20", "20"], ["100", "100"], ["500", "500"]]),
    h("button", { type: "submit", id: "apply" }, "Apply"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v !== "") p.set(k, v);
    location.hash = "#/episodes?" + p.toString();
  });
  return form;
}

function sortRows(rows) {
  const c = listState.sortCol;
  if (!c) return rows;
  return [...rows].sort((a, b) => ((a[c] ?? -Infinity) > (b[c] ?? -Infinity) ? 1 : -1) * listState.sortDir);
}

function episodeTable(rows, rerender) {
  const cols = [["episode_id", "episode"], ["task_type", "task type"], ["source", "source"], ["iteration", "iter"],
    ["policy_version", "policy"], ["reward", "reward"], ["success", "success"], ["n_turns", "turns"],
    ["n_nodes", "nodes"], ["stop_reason", "stop"], ["group_id", "group"], ["created_at", "created (UTC)"]];
  const head = h("tr", {}, cols.map(([c, t]) => h("th", {
    class: "sortable", title: "sort this page", onclick: () => {
      listState.sortDir = listState.sortCol === c ? -listState.sortDir : 1;
      listState.sortCol = c;
      rerender();
    } }, t + (listState.sortCol === c ? (listState.sortDir > 0 ? " ▲" : " ▼") : ""))));
  const body = sortRows(rows).map((r) => h("tr", { class: "row" + (r.stop_reason === "env_error" ? " env-error" : ""), "data-id": r.episode_id,
    onclick: () => { location.hash = "#/episode/" + r.episode_id; } },
    h("td", {}, h("a", { href: "#/episode/" + r.episode_id }, r.episode_id.slice(0, 12))), h("td", {}, r.task_type),
    h("td", {}, r.source), h("td", {}, r.iteration), h("td", {}, r.policy_version), h("td", {}, fmt(r.reward)),
    h("td", { class: r.success === false ? "bad" : r.success ? "good" : "" }, fmt(r.success)),
    h("td", {}, r.n_turns), h("td", {}, r.n_nodes), h("td", {}, r.stop_reason), h("td", {}, r.group_id),
    h("td", {}, when(r.created_at))));
  return h("table", { id: "episodes" }, h("thead", {}, head), h("tbody", {}, body));
}

async function viewEpisodes(params) {
  const key = [...params].filter(([k]) => k !== "page").map(([k, v]) => k + "=" + v).join("&");
  if (key !== listState.key) Object.assign(listState, { key, cursors: [null], page: 0 });
  const q = new URLSearchParams(params);
  if (listState.cursors[listState.page]) q.set("cursor", listState.cursors[listState.page]);
  const page = await api("/api/episodes", q);
  listState.cursors[listState.page + 1] = page.next_cursor;
  const count = h("span", { id: "count", class: "muted" }, "counting…");
  const wrap = h("div", {});
  const rerender = () => wrap.replaceChildren(episodeTable(page.episodes, rerender));
  rerender();
  const go = (d) => { listState.page += d; route(); };
  const pager = h("div", { class: "pager" },
    h("button", { id: "prev", disabled: listState.page === 0, onclick: () => go(-1) }, "← newer"),
    h("span", {}, `page ${listState.page + 1}, ${page.episodes.length} shown`),
    h("button", { id: "next", disabled: !page.next_cursor, onclick: () => go(1) }, "next →"), count);
  show(filterForm(params), pager, wrap,
    h("p", { class: "muted" }, "The store pages by creation time; clicking a column sorts the page shown."));
  const cq = new URLSearchParams(params);
  for (const k of ["order", "limit", "stop_reason"]) cq.delete(k);
  api("/api/count", cq).then((c) => { count.textContent = `${c.count} match the store filters`; }).catch(() => {});
  facets(page.episodes);
}

// Suggestions for the task type and source fields, from the rows seen so far (a profile query for
// them would scan the whole store and hold it for seconds on a million episodes).
const seen = { "task-types": new Set(), sources: new Set() };
function facets(rows) {
  for (const r of rows) { seen["task-types"].add(r.task_type); seen.sources.add(r.source); }
  for (const [id, values] of Object.entries(seen)) {
    const list = document.getElementById(id) || document.body.appendChild(h("datalist", { id }));
    list.replaceChildren(...[...values].sort().map((v) => h("option", { value: v })));
  }
}

// --- one episode ----------------------------------------------------------------------------------
function tokensView(t, shade) {
  if (!t.tokens.length) return null;
  return h("div", { class: "tokens" }, h("span", { class: "label" }, "output tokens "), t.tokens.map((k) => {
    const p = k.logprob === null ? null : Math.exp(k.logprob);
    const style = shade && p !== null && k.mask ? `background: rgba(42,157,143,${(0.15 + 0.85 * p).toFixed(3)})` : null;
    const title = `id ${k.id}` + (k.logprob === null ? "" : `, logprob ${k.logprob.toFixed(3)}`) + (k.mask ? "" : ", loss mask 0");
    return h("span", { class: "tok" + (k.mask ? "" : " mask0"), title, style }, k.text ?? String(k.id));
  }));
}

function kv(obj) {
  const e = Object.entries(obj || {});
  return e.length ? e.map(([k, v]) => h("span", {}, h("b", {}, k + " "), fmt(v, 4), "  ")) : null;
}

function turnCard(ep, t, shade) {
  const media = t.media.map((m) => m.mime.startsWith("image/")
    ? h("img", { class: "media", src: `/api/episodes/${ep.episode_id}/media/${ep._pos[t.turn_id]}/${m.k}` })
    : h("span", { class: "muted" }, `[${m.mime}]`));
  const tc = t.tool_call;
  return h("div", { class: "turn" + (t.on_main_path ? " main" : "") + (t.error ? " has-error" : ""), "data-turn": t.turn_id },
    h("h4", {}, `turn ${t.index}`, t.state_key ? h("span", { class: "muted" }, `  state ${t.state_key}`) : null),
    h("span", { class: "label" }, "observation"), h("pre", {}, t.observation), media,
    tokensView(t, shade),
    h("span", { class: "label" }, "model output"), h("pre", { class: "action" }, t.action_text),
    tc ? h("div", { class: "kv" }, h("b", {}, "tool call "), `${tc.name}(${JSON.stringify(tc.arguments)})`) : null,
    t.result !== null ? [h("span", { class: "label" }, "result"), h("pre", {}, t.result)] : null,
    h("div", { class: "kv" }, h("b", {}, "reward "), fmt(t.reward), "  ", h("b", {}, "action "), fmt(t.action),
      "  ", h("b", { class: t.valid ? "" : "bad" }, t.valid ? "valid" : "invalid"),
      t.terminated ? "  terminated" : "", t.truncated ? "  truncated" : "",
      `  prompt ${t.n_prompt_tokens} tokens, output ${t.tokens.length}`),
    t.error ? h("div", { class: "kv bad" }, h("b", {}, "error "), t.error) : null,
    Object.keys(t.timings).length ? h("div", { class: "kv" }, h("b", {}, "timings (s) "), kv(t.timings)) : null,
    Object.keys(t.advantages).length ? h("div", { class: "kv advantages" }, h("b", {}, "advantage "), kv(t.advantages)) : null);
}

// A continuation stored as its own episode (origin.of = this one), hanging off the turn it starts
// after: "expand" reads it and shows its own turns (path index origin.turn on) in place.
function continuation(c, where, shade) {
  const box = h("div", { class: "continuation", "data-episode": c.episode_id });
  const expand = h("button", { class: "expand", onclick: async () => {
    expand.disabled = true;
    try {
      const d = await api("/api/episodes/" + encodeURIComponent(c.episode_id));
      const ep = d.episode;
      ep._pos = Object.fromEntries(d.turns.map((t, i) => [t.turn_id, i]));
      const byId = Object.fromEntries(d.turns.map((t) => [t.turn_id, t]));
      box.replaceChildren(...d.main_path.slice(c.turn).map((tid) => turnCard(ep, byId[tid], shade)));
    } catch (e) {
      box.replaceChildren(h("span", { class: "error" }, String(e.message || e)));
    }
  } }, "expand");
  return h("div", {}, h("div", { class: "branch-label" },
    `${c.kind} ${where}: action ${fmt(c.action)}, reward ${fmt(c.reward)}, success ${fmt(c.success)}, ${c.n_turns} turns `,
    expand, " ", h("a", { href: "#/episode/" + c.episode_id }, "open")), box);
}

function subtree(ep, byId, id, shade, conts) {
  const t = byId[id];
  const out = [turnCard(ep, t, shade)];
  const branches = (conts[id] || []).map((c) => continuation(c, "after this turn", shade));
  if (t.children.length === 1 && !branches.length) return out.concat(subtree(ep, byId, t.children[0], shade, conts));
  if (t.children.length === 0) return out.concat(branches);
  const main = t.children.find((c) => byId[c].on_main_path);
  const side = t.children.filter((c) => c !== main);
  out.push(h("div", { class: "branches" }, branches, side.map((c) => h("div", {},
    h("div", { class: "branch-label" }, "branch"), subtree(ep, byId, c, shade, conts)))));
  if (main) return out.concat(subtree(ep, byId, main, shade, conts));
  return out;
}

async function viewEpisode(id, params) {
  const t0 = performance.now();
  const d = await api("/api/episodes/" + encodeURIComponent(id));
  const shade = params.get("logprobs") === "1";
  const ep = d.episode;
  ep._pos = Object.fromEntries(d.turns.map((t, i) => [t.turn_id, i]));
  const byId = Object.fromEntries(d.turns.map((t) => [t.turn_id, t]));
  const conts = {};
  const atRoot = [];
  for (const c of d.continuations) (c.after_turn ? (conts[c.after_turn] ||= []) : atRoot).push(c);
  const toggle = new URLSearchParams(params);
  toggle.set("logprobs", shade ? "0" : "1");
  const facts = [["task", `${ep.task_type} ${ep.task_id}`], ["source", ep.source], ["iteration", ep.iteration],
    ["policy", ep.policy_version], ["reward", fmt(ep.reward)], ["success", fmt(ep.success)], ["stop", ep.stop_reason],
    ["turns", `${ep.n_turns} on the main path, ${ep.n_nodes} in the tree`], ["group", ep.group_id],
    ["created", when(ep.created_at)], ["rewards", JSON.stringify(ep.rewards)], ["tags", ep.tags.join(", ") || "-"]];
  const nodes = [
    h("h2", {}, "episode ", h("code", {}, ep.episode_id)),
    h("div", { class: "facts" }, facts.map(([k, v]) => h("span", {}, h("b", {}, k + ": "), v))),
    ep.origin ? h("p", {}, `${ep.origin.kind} of `, h("a", { href: "#/episode/" + ep.origin.of }, ep.origin.of.slice(0, 12)),
      ` from turn ${ep.origin.turn}` + (ep.origin.action ? `, forced action ${ep.origin.action}` : "")) : null,
    ep.error ? h("p", { class: "bad" }, "error: " + ep.error) : null,
    h("p", {}, h("a", { href: "#/group/" + ep.episode_id, id: "to-group" }, "compare with its group"), "  ",
      h("a", { href: `#/episode/${ep.episode_id}?${toggle}`, id: "toggle-logprobs" },
        shade ? "hide log-prob shading" : "shade tokens by log-prob"),
      h("span", { class: "muted" }, "  (struck-through grey tokens: loss mask 0, not trained on)")),
    atRoot.length ? h("div", { class: "branches" }, atRoot.map((c) => continuation(c, "from the start", shade))) : null,
    h("div", { id: "tree" }, d.roots.map((r) => subtree(ep, byId, r, shade, conts))),
  ];
  show(...nodes);
  main().dataset.renderMs = (performance.now() - t0).toFixed(1);
  main().dataset.view = "episode";
}

// --- group comparison ---------------------------------------------------------------------------
async function viewGroup(id) {
  const g = await api(`/api/episodes/${encodeURIComponent(id)}/group`);
  const n = Math.max(0, ...g.episodes.map((e) => e.turns.length));
  const head = h("tr", {}, h("th", {}, "turn"), g.episodes.map((e) => h("th", {},
    h("a", { href: "#/episode/" + e.episode_id }, e.episode_id.slice(0, 8)), e.episode_id === id ? " (this)" : "",
    h("div", { class: "muted" }, `${e.source}, reward ${fmt(e.reward)}, success ${fmt(e.success)}`),
    e.origin ? h("div", { class: "muted" }, `${e.origin.kind} of ${e.origin.of.slice(0, 8)} at turn ${e.origin.turn}`) : null)));
  const rows = [];
  for (let i = 0; i < n; i++) {
    const mark = i === g.first_divergence;
    rows.push(h("tr", { class: mark ? "diverge" : "", "data-index": i },
      h("th", {}, String(i), mark ? h("div", { class: "bad", id: "first-divergence" }, "first divergence") : null),
      g.episodes.map((e) => {
        const t = e.turns[i];
        if (!t) return h("td", { class: "muted" }, "(ended)");
        const a = t.state_key in g.anchors ? PALETTE[g.anchors[t.state_key] % PALETTE.length] : null;
        return h("td", { class: a ? "anchor" : "", style: a ? `--anchor: ${a}` : null, title: t.state_key || "" },
          h("pre", {}, t.action_text), h("div", { class: "kv" }, h("b", {}, "reward "), fmt(t.reward),
            t.valid ? "" : h("span", { class: "bad" }, "  invalid")),
          t.error ? h("div", { class: "kv bad" }, t.error.slice(0, 120)) : null);
      })));
  }
  show(h("h2", {}, `group ${g.group_id}: ${g.episodes.length} episodes`),
    h("p", { class: "muted" }, "Aligned by turn along each main path; the left bar colours turns at an anchor state " +
      "that several episodes visited; the highlighted row is the first turn where the actions differ."),
    h("table", { class: "group-table", id: "group" }, h("thead", {}, head), h("tbody", {}, rows)));
}

// --- charts ---------------------------------------------------------------------------------------
function lineChart(title, series, xLabel) {
  const W = 420, H = 240, L = 48, B = 30, T = 20, R = 10;
  const pts = series.flatMap((s) => s.points);
  if (!pts.length) return h("div", { class: "chart muted" }, `${title}: no data`);
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - B - T);
  const g = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` },
    svg("text", { x: L, y: 12 }, title),
    svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" }),
    svg("text", { x: 2, y: sy(y1) + 4 }, fmt(y1)), svg("text", { x: 2, y: sy(y0) + 4 }, fmt(y0)),
    svg("text", { x: L, y: H - 8 }, fmt(x0)), svg("text", { x: W - R - 40, y: H - 8 }, fmt(x1)),
    svg("text", { x: W / 2 - 20, y: H - 8 }, xLabel));
  series.forEach((s, k) => {
    const c = PALETTE[k % PALETTE.length];
    g.append(svg("polyline", { fill: "none", stroke: c, "stroke-width": 2,
      points: s.points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" ") }));
    for (const p of s.points) g.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: c }));
  });
  const legend = h("div", { class: "legend" }, series.map((s, k) =>
    h("span", {}, h("i", { style: `background:${PALETTE[k % PALETTE.length]}` }), s.name)));
  return h("div", { class: "chart", "data-title": title }, g, legend);
}

// --- runs -----------------------------------------------------------------------------------------
async function viewRuns(params) {
  const info = await api("/api/info");
  if (!info.runs.length) return show(h("p", { class: "muted", id: "no-runs" }, "No runs: start with --run RUN_DIR (repeatable)."));
  const runs = await Promise.all(info.runs.map((r) => api("/api/runs/" + r.k).catch((e) => ({ name: r.name, error: e.message, metrics: [] }))));
  const keys = [...new Set(runs.flatMap((r) => r.metrics.flatMap((m) => Object.keys(m).filter((k) => typeof m[k] === "number"))))]
    .filter((k) => !["step", "time", "env_steps"].includes(k)).sort();
  const chosen = (params.get("metrics") || "success,reward").split(",").filter((k) => keys.includes(k));
  const series = (key) => runs.map((r) => ({ name: r.name, points: r.metrics
    .filter((m) => typeof m[key] === "number" && typeof m.env_steps === "number").map((m) => [m.env_steps, m[key]]) }));
  const pick = h("select", { id: "metric", multiple: true, size: 6, onchange: (ev) => {
    const p = new URLSearchParams({ metrics: [...ev.target.selectedOptions].map((o) => o.value).join(",") });
    location.hash = "#/runs?" + p;
  } }, keys.map((k) => h("option", { value: k, selected: chosen.includes(k) }, k)));
  const summaries = h("table", { id: "summaries" }, h("tr", {}, ["run", "sft success", "rl success", "rl gain", "env steps", "wall s"]
    .map((c) => h("th", {}, c))), runs.map((r) => {
    const s = r.summary || {};
    return h("tr", {}, h("td", {}, r.name), h("td", {}, fmt(s.sft?.success)), h("td", {}, fmt(s.rl?.success)),
      h("td", {}, fmt(s.rl_gain)), h("td", {}, fmt(s.env_steps)), h("td", {}, fmt(s.wall_s, 1)));
  }));
  show(h("h2", {}, `runs (${runs.length})`), runs.filter((r) => r.error).map((r) => h("p", { class: "error" }, `${r.name}: ${r.error}`)),
    summaries, h("p", {}, h("label", { class: "stacked" }, "metrics to plot (ctrl-click for several)", pick)),
    h("div", { class: "charts", id: "curves" }, chosen.map((k) => lineChart(k, series(k), "env steps"))));
}

// --- capability profile ---------------------------------------------------------------------------
async function viewProfile(params) {
  const by = params.get("group_by") || "task_type,iteration";
  const p = await api("/api/profile", new URLSearchParams({ group_by: by }));
  const cols = p.group_by;
  const table = h("table", { id: "profile" }, h("tr", {}, [...cols, "count", "scored", "success", "reward", "turns"]
    .map((c) => h("th", {}, c))), p.rows.map((r) => h("tr", {}, cols.map((c) => h("td", {}, fmt(r[c]))),
    h("td", {}, r.count), h("td", {}, r.n_scored), h("td", {}, r.success_rate === null ? "-" : (100 * r.success_rate).toFixed(1) + "%"),
    h("td", {}, fmt(r.mean_reward)), h("td", {}, fmt(r.mean_turns, 2)))));
  let chart = null;
  if (cols.includes("iteration")) {
    const other = cols.filter((c) => c !== "iteration");
    const byName = {};
    for (const r of p.rows) {
      if (r.success_rate === null) continue;
      const name = other.map((c) => r[c]).join(" / ") || "all";
      (byName[name] ||= []).push([r.iteration, r.success_rate]);
    }
    chart = lineChart("success rate by iteration", Object.entries(byName).map(([name, points]) =>
      ({ name, points: points.sort((a, b) => a[0] - b[0]) })), "iteration");
  }
  const form = h("form", { id: "profile-form", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = "#/profile?" + new URLSearchParams({ group_by: ev.target.elements.group_by.value });
  } }, "group by ", h("input", { name: "group_by", value: by, size: 40 }), " ", h("button", { type: "submit" }, "Apply"),
  h("span", { class: "muted" }, "  columns: task_type, policy_version, source, iteration, stop_reason, task_id"));
  show(h("h2", {}, "capability profile"), form, h("div", { class: "charts" }, chart), table);
}

// --- routing --------------------------------------------------------------------------------------
async function route() {
  const [path, query] = (location.hash.slice(1) || "/episodes").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "nav-" + parts[0]);
  main().dataset.view = "";
  try {
    if (parts[0] === "episode" && parts[1]) await viewEpisode(decodeURIComponent(parts[1]), params);
    else if (parts[0] === "group" && parts[1]) await viewGroup(decodeURIComponent(parts[1]));
    else if (parts[0] === "runs") await viewRuns(params);
    else if (parts[0] === "profile") await viewProfile(params);
    else await viewEpisodes(params);
    if (!main().dataset.view) main().dataset.view = parts[0] || "episodes";
  } catch (e) {
    fail(e);
  }
}

window.addEventListener("hashchange", route);
api("/api/info").then((i) => { document.getElementById("store").textContent = i.store; }).catch(fail);
route();
