// kvrouterd's status page: reads status.json every second and shows it. Everything a worker
// reported (models, endpoints, problems) is set as text (textContent), never parsed as HTML.
"use strict";

const POLL_MS = 1000;
// Rates are taken over the documents of the last RATE_WINDOW_MS.
const RATE_WINDOW_MS = 10000;
const STATES = new Set(["connecting", "active", "stale", "gone", "stream"]);

const samples = [];

function el(id) { return document.getElementById(id); }
function setText(id, s) { el(id).textContent = s; }

function fmtInt(n) { return Math.round(n).toLocaleString("en-US"); }

function count(n, noun) { return fmtInt(n) + " " + noun + (n === 1 ? "" : "s"); }

function fmtRate(x) { return x >= 100 ? fmtInt(x) : x.toFixed(1); }

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
}

function fmtAge(s) {
  if (s === undefined || s === null) return "—";
  if (s < 1) return "< 1 s";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return Math.round(s / 86400) + " d";
}

function fmtPercent(x) { return (100 * x).toFixed(1) + " %"; }

// rates records st and returns the rates over the window, or null until two documents apart in
// time are known. A counter that went down (a restarted daemon) starts the window again.
function rates(st) {
  const s = {
    t: Date.parse(st.time), events: st.events.processed, routed: st.routes.routed,
    hitSum: st.routes.hit_rate_sum, hitN: st.routes.hit_rate_requests,
  };
  const prev = samples[samples.length - 1];
  if (prev && (s.events < prev.events || s.routed < prev.routed || s.hitN < prev.hitN || s.t < prev.t)) {
    samples.length = 0;
  }
  if (!prev || s.t !== prev.t) samples.push(s);
  while (samples.length > 2 && s.t - samples[1].t >= RATE_WINDOW_MS) samples.shift();
  const a = samples[0];
  const dt = (s.t - a.t) / 1000;
  if (dt <= 0) return null;
  const dn = s.hitN - a.hitN;
  return {
    events: (s.events - a.events) / dt,
    routes: (s.routed - a.routed) / dt,
    hit: dn > 0 ? (s.hitSum - a.hitSum) / dn : null,
  };
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function emptyRow(tbody, cols, text) {
  const tr = document.createElement("tr");
  tr.className = "empty";
  const td = cell(tr, text);
  td.colSpan = cols;
  tbody.appendChild(tr);
}

function renderModels(models) {
  const tbody = el("models");
  tbody.replaceChildren();
  if (models.length === 0) { emptyRow(tbody, 5, "no model yet"); return; }
  for (const m of models) {
    const tr = document.createElement("tr");
    cell(tr, m.model);
    cell(tr, fmtInt(m.block_size), "num");
    cell(tr, fmtInt(m.workers), "num");
    cell(tr, fmtInt(m.blocks), "num");
    cell(tr, fmtInt(m.residencies), "num");
    tbody.appendChild(tr);
  }
}

function renderWorkers(st) {
  const tbody = el("workers");
  tbody.replaceChildren();
  if (st.workers.length === 0) { emptyRow(tbody, 11, "no worker registered"); }
  for (const w of st.workers) {
    const tr = document.createElement("tr");
    tr.dataset.worker = w.worker_id;
    tr.dataset.rank = String(w.dp_rank);
    cell(tr, w.model);
    cell(tr, w.worker_id);
    cell(tr, String(w.dp_rank), "num");
    cell(tr, w.role);
    const state = w.state || "—";
    const sc = cell(tr, state, STATES.has(w.state) ? "state-" + w.state : "");
    // Outlier ejection: a badge for a rank out of routing, or one that failed since it last
    // answered (it loses ties).
    if (w.health === "ejected" || w.health === "suspect") {
      const badge = document.createElement("span");
      badge.className = "health health-" + w.health;
      let text = w.health;
      if (w.health === "ejected" && w.ejected_for_seconds !== undefined) text += w.ejected_for_seconds > 0 ? ", probed in " + fmtAge(w.ejected_for_seconds) : ", probing";
      badge.textContent = text;
      badge.title = w.health === "ejected" ? "out of routing after failing requests (ejected " + (w.ejections || 1) + "×)" : "failed since its last answer: loses ties";
      sc.appendChild(badge);
    }
    // The time is the rank's own socket's last batch (or, without one, the worker's); the id
    // is the last event applied, whichever way it came.
    const last = [];
    if (w.last_event_age_seconds !== undefined) last.push(fmtAge(w.last_event_age_seconds) + " ago");
    if (w.last_event_id) last.push("#" + w.last_event_id);
    cell(tr, last.length ? last.join(" · ") : "none");
    cell(tr, fmtInt(w.cached_blocks), "num");
    cell(tr, fmtInt(w.active_blocks), "num");
    cell(tr, fmtInt(w.active_requests), "num");
    cell(tr, fmtInt(w.event_lag), "num");
    const ep = cell(tr, w.http_endpoint || w.endpoint || "—", "wrap");
    for (const p of w.problems || []) {
      const span = document.createElement("span");
      span.className = "problem";
      span.textContent = p;
      ep.appendChild(span);
    }
    tbody.appendChild(tr);
  }
  const hidden = st.workers_total - st.workers.length;
  setText("workers-note", hidden > 0 ? "(the first " + fmtInt(st.workers.length) + " of " + fmtInt(st.workers_total) + " ranks)" : "");
}

function render(st) {
  const r = rates(st);
  setText("workers-count", fmtInt(st.worker_ids));
  setText("workers-sub", count(st.workers_total, "rank") + ", " + count(st.models.length, "model"));
  setText("index-blocks", fmtInt(st.index.blocks));
  let idx = fmtInt(st.index.residencies) + " residencies";
  if (st.index.lower_tier_residencies > 0) idx += ", " + fmtInt(st.index.lower_tier_residencies) + " in lower tiers";
  setText("index-sub", idx);
  setText("memory-heap", fmtBytes(st.memory.heap_bytes));
  setText("memory-sub", fmtBytes(st.memory.runtime_bytes) + " held by the runtime");

  const rt = st.routes;
  if (r && r.hit !== null) {
    setText("hit-rate", fmtPercent(r.hit));
    setText("hit-rate-sub", "last 10 s; " + (rt.hit_rate_requests ? fmtPercent(rt.hit_rate_sum / rt.hit_rate_requests) + " since start" : ""));
  } else if (rt.hit_rate_requests > 0) {
    setText("hit-rate", fmtPercent(rt.hit_rate_sum / rt.hit_rate_requests));
    setText("hit-rate-sub", r ? "since start; no route in 10 s" : "since start");
  } else {
    setText("hit-rate", "—");
    setText("hit-rate-sub", "no route yet");
  }
  setText("events-rate", r ? fmtRate(r.events) : "—");
  setText("events-sub", fmtInt(st.events.applied) + " applied" + (st.events.gaps ? ", " + fmtInt(st.events.gaps) + " gaps" : ""));
  setText("routes-rate", r ? fmtRate(r.routes) : "—");
  setText("routes-sub", fmtInt(rt.routed) + " routed, " + fmtInt(rt.active) + " active");

  const q = st.queues;
  setText("router-queue", q.router_enabled ? fmtInt(q.router) : "off");
  setText("router-queue-sub", q.router_enabled ? "requests waiting" : "no --router-queue-threshold");
  setText("event-queue", fmtInt(q.events));

  const sn = st.snapshot;
  if (!sn.enabled) {
    setText("snapshot-age", "off");
    setText("snapshot-sub", "--no-snapshots");
  } else if (sn.age_seconds === undefined) {
    setText("snapshot-age", "none");
    setText("snapshot-sub", "no snapshot yet");
  } else {
    setText("snapshot-age", fmtAge(sn.age_seconds));
    setText("snapshot-sub", "taken " + new Date(sn.last).toLocaleTimeString());
  }

  renderModels(st.models);
  renderWorkers(st);
  const up = el("updated");
  up.className = "";
  up.textContent = "updated " + new Date(st.time).toLocaleTimeString() + " · up " + fmtAge(st.uptime_seconds);
}

// With --auth-token-file the document needs a read token: asked for once, kept for the tab's
// session only, sent as a bearer token.
const TOKEN_KEY = "kvrouterd-token";

el("auth").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, el("token").value.trim());
  el("token").value = "";
  el("auth").hidden = true;
});

async function poll() {
  try {
    const headers = { "Accept": "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers["Authorization"] = "Bearer " + token;
    const res = await fetch("status.json", { cache: "no-store", headers: headers });
    if (res.status === 401 || res.status === 403) {
      el("auth").hidden = false;
      throw new Error(token ? "the token was refused" : "a bearer token is needed");
    }
    if (!res.ok) throw new Error("HTTP " + res.status);
    el("auth").hidden = true;
    render(await res.json());
  } catch (e) {
    const up = el("updated");
    up.className = "stale";
    up.textContent = "not updating: " + e.message;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
