"use strict";
// Renders the once-a-second snapshot from /dashboard/events. No framework, no network
// access beyond this admin listener.

const $ = (sel) => document.querySelector(sel);
const fmt = (v, unit = "", digits = 1) =>
  v === null || v === undefined ? "–" : `${Number(v).toFixed(digits)}${unit}`;
const esc = (s) => String(s ?? "").replace(/[&<>"]/g, (c) =>
  ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

// `empty`: what an empty table says, under it (a blank panel explains nothing); its rows stay
// the items' only.
function rows(tbody, items, render, empty = "none") {
  tbody.innerHTML = items.map((it) => `<tr>${render(it)}</tr>`).join("");
  const table = tbody.parentElement;
  let said = table.nextElementSibling;
  if (!said || !said.classList.contains("empty")) {
    said = document.createElement("p");
    said.className = "empty";
    table.after(said);
  }
  said.textContent = empty;
  said.hidden = items.length > 0;
}

function bars(values) {
  if (!values || !values.length) return "–";
  return `<div class="bars" title="${values.map((v) => (v * 100).toFixed(0) + "%").join(" ")}">` +
    values.map((v) => `<div style="height:${Math.max(2, v * 28)}px"></div>`).join("") + "</div>";
}

function render(s) {
  $("#policy-version").textContent = s.policy.version;
  $("#updated").textContent = new Date(s.time * 1000).toLocaleTimeString();
  rows($("#backends tbody"), s.backends, (b) => `
    <td>${esc(b.name)}</td><td><code>${esc(b.speculative ?? b.task)}</code></td>
    <td><span class="badge ${esc(b.health)}">${esc(b.health)}</span>${b.guard_tripped ? ' <span class="badge down">guard</span>' : ""}</td>
    <td class="num">${b.in_flight}</td><td class="num">${b.queued}</td>
    <td class="num">${b.running ?? "–"} / ${b.waiting ?? "–"}</td>
    <td>${b.kv_usage === null ? "–" : `<span class="kv"><span style="width:${(b.kv_usage * 100).toFixed(0)}%"></span></span> ${(b.kv_usage * 100).toFixed(0)}%`}</td>
    <td class="num">${fmt(b.decode_tokens_per_s)}</td><td class="num">${fmt(b.acceptance, "", 2)}</td>
    <td>${bars(b.per_position)}</td>`);
  rows($("#admission tbody"), s.admission || [], (a) => `
    <td>${esc(a.backend)}</td><td>${a.enabled ? "on" : "off"}</td><td class="num">${a.resident}</td>
    <td class="num">${a.resident_tokens} / ${a.kv_tokens ?? "–"}</td>
    <td class="num">${a.waiting}</td><td class="num">${fmt(a.longest_wait_s, " s", 0)}</td>
    <td class="num">${a.held}</td><td class="num">${a.timeouts}</td><td class="num">${fmt(a.longest_ever_s, " s", 0)}</td>`,
    "off: this policy does not enable session-aware admission (admission.sessions.enabled)");
  rows($("#variants tbody"), s.variants, (v) => `
    <td>${esc(v.variant)}</td><td class="num">${v.requests}</td>
    <td class="num">${fmt(v.ttft_p50_ms, " ms", 0)}</td><td class="num">${fmt(v.ttft_p95_ms, " ms", 0)}</td>
    <td class="num">${fmt(v.itl_p50_ms, " ms")}</td><td class="num">${fmt(v.itl_p95_ms, " ms")}</td>
    <td class="num">${fmt(v.tokens_per_step, "", 2)}</td>`);
  const agents = s.agents || [];
  rows($("#agents tbody"), agents, (a) => `
    <td><code title="${esc(a.session)}">${esc(a.session.slice(0, 12))}</code></td><td>${esc(a.agent)}</td>
    <td>${esc(a.client)}</td><td>${esc(a.engine)}${a.moves ? ` <span class="count">(${a.moves})</span>` : ""}</td>
    <td class="num">${a.requests}</td><td class="num">${a.tokens_in}</td><td class="num">${a.tokens_out}</td>
    <td class="num">${a.cached_tokens === null ? "–" : a.cached_tokens + (a.tokens_in ? ` (${(100 * a.cached_tokens / a.tokens_in).toFixed(0)}%)` : "")}</td>
    <td class="num" title="${esc(a.loss_where || "")}">${a.lost_tokens}${a.loss_cause ? ` <span class="count">${esc(a.loss_cause)}</span>` : ""}</td>
    <td class="num">${fmt(a.decode_s, " s")}</td><td class="num">${a.engine_share === null ? "–" : (a.engine_share * 100).toFixed(0) + "%"}</td>
    <td class="num">${fmt(a.idle_s, " s", 0)}</td>`, "no agent session yet");
  if (s.timeline) {
    drawCharts($("#charts-variants"), Object.entries(s.timeline.variants).map(([k, v]) => [esc(k), v]),
      s.timeline.bucket_s);
    drawCharts($("#charts-agents"), agents.slice(0, PALETTE.length).map((a) =>
      [`<code>${esc(a.session.slice(0, 10))}</code> ${esc(a.agent)}`, a.series]), s.timeline.bucket_s);
  }
  $("#inflight-count").textContent = `(${s.in_flight.length})`;
  rows($("#inflight tbody"), s.in_flight, (r) => `
    <td><code>${esc(r.id)}</code></td><td>${esc(r.client)}</td><td>${esc(r.route)}</td>
    <td>${esc(r.variant)}</td><td>${esc(r.reason)}</td><td class="num">${fmt(r.elapsed_s, " s")}</td>
    <td class="num">${r.tokens}</td><td class="num">${fmt(r.tokens_per_s)}</td>
    <td class="num">${fmt(r.ttft_ms, " ms", 0)}</td>`, "none");
  rows($("#recent tbody"), s.recent, (r) => `
    <td><code>${esc(r.id)}</code></td><td>${esc(r.client)}</td><td>${esc(r.agent || "–")}</td><td>${esc(r.variant)}</td>
    <td>${esc(r.reason)}</td>
    <td class="num">${r.temperature === null ? "–" : r.temperature + (r.temperature_default ? "*" : "")}</td>
    <td class="num">${fmt(r.ttft_ms, " ms", 0)}</td><td class="num">${fmt(r.itl_p50_ms, " ms")}</td>
    <td class="num">${fmt(r.itl_p95_ms, " ms")}</td><td class="num" title="${esc(r.tps_source || "")}">${fmt(r.tokens_per_step, "", 2)}${r.tps_source && r.tps_source !== "engine" ? "~" : ""}</td>
    <td class="num">${r.tokens}</td><td class="outcome-${esc(r.outcome)}">${esc(r.outcome)}</td>`,
    "no request yet");
  $("#history").innerHTML = s.policy.history.slice().reverse().map((h) =>
    `<li><code>#${h.number} ${esc(h.version)}</code> by ${esc(h.who)} at ${new Date(h.time * 1000).toLocaleString()}` +
    (h.note ? ` (${esc(h.note)})` : "") + (h.changes.length ? `: ${h.changes.length} change(s)` : "") + "</li>").join("");
  $("#repairs").innerHTML = s.repairs.length ? s.repairs.slice().reverse().map((r) =>
    `<li><code>${esc(r.backend)}</code> at ${new Date(r.time * 1000).toLocaleTimeString()}: ` +
    `<span class="outcome-${r.result === "ok" ? "ok" : "upstream_error"}">${esc(r.result)}</span></li>`).join("")
    : "<li>none</li>";
  const events = s.events || [];  // newest first
  $("#events").innerHTML = events.length ? events.map((e) =>
    `<li>${new Date(e.time * 1000).toLocaleTimeString()} <span class="badge ${esc(eventClass(e.kind))}">${esc(e.kind)}</span> ` +
    (e.backend ? `<code>${esc(e.backend)}</code> ` : "") + (e.version ? `<code>${esc(e.version)}</code> ` : "") +
    esc(e.detail) + "</li>").join("")
    : "<li>none</li>";
}

function eventClass(kind) {
  if (kind === "backend_up" || kind === "policy_applied") return "up";
  if (kind === "backend_starting" || kind.startsWith("repair")) return "starting";
  return "down";
}

function connect() {
  const source = new EventSource("/dashboard/events");
  source.onopen = () => { $("#status").textContent = "live"; $("#status").className = "pill live"; };
  source.onmessage = (e) => render(JSON.parse(e.data));
  source.onerror = () => { $("#status").textContent = "reconnecting…"; $("#status").className = "pill"; };
}
connect();
