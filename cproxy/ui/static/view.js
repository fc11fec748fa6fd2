// Rendering: pure functions from the polled state to DOM nodes (no fetching here).

import { assess, lagHistory, noConsumer, severity, totalLag } from "./health.js";

/** Rows shown per blocked-key or dead-letter table; the header says how many there are. */
export const MAX_ROWS = 20;

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "dataset") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export const num = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");

export function age(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor(s / 3600) % 24}h`;
}

export function clock(ms) {
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${Number.isInteger(n) ? n : n.toFixed(1)} ${units[i]}`;
}

function json(value, limit) {
  const text = JSON.stringify(value);
  return text.length > limit ? `${text.slice(0, limit)}…` : text;
}

function sparkline(samples) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  if (samples.length > 1) {
    const max = Math.max(1, ...samples.map((s) => s.lag));
    const points = samples.map((s, i) => `${(i / (samples.length - 1)) * 100},${19 - (s.lag / max) * 18}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.join(" "));
    svg.append(line);
  }
  return svg;
}

function stat(name, label, value, extra, cls) {
  return h("div", { class: `stat ${cls || ""}`, dataset: { stat: name } }, h("dt", {}, label), h("dd", {}, value), extra);
}

/** Collapsible section; `key` keeps its open/closed state across refreshes (see console.js). */
function fold(key, open, summary, ...content) {
  return h("details", { dataset: { fold: key }, open }, h("summary", {}, summary), ...content);
}

/** A table; a head label starting with "#" marks a numeric (right-aligned) column. */
function table(head, rows, attrs) {
  const th = (c) => (c.startsWith("#") ? h("th", { class: "num" }, c.slice(1)) : h("th", {}, c));
  return h("table", attrs || {}, h("thead", {}, h("tr", {}, head.map(th))), h("tbody", {}, rows));
}

function button(action, label, data, cls) {
  return h("button", { type: "button", class: cls, dataset: { action, ...data } }, label);
}

function topicsLine(config) {
  return Object.entries(config.topics || {}).map(([topic, t]) => h("span", { class: "chip" },
    topic, h("small", {}, ` by ${t.order_by}`),
    t.filter ? h("small", {}, ` · filter ${t.filter}`) : null,
    t.transform ? h("small", {}, " · transform") : null,
    t.push && t.push.url ? h("small", {}, ` · push → ${t.push.url}`) : null));
}

/** A message reference as text and as button data (the browser opens at it). */
const refText = (m) => `${m.topic}/${m.qid}@${m.offset}`;
const lookButton = (m) => button("browse", "Message", { topic: m.topic, qid: m.qid, from: m.offset });

function bodyCell(key, body) {
  return h("td", { class: "body" }, fold(key, false, h("code", {}, json(body, 60)), h("pre", {}, JSON.stringify(body, null, 2))));
}

function blockedTable(g, now) {
  const rows = g.blocked.slice(0, MAX_ROWS).map((b) => {
    const waitsForOperator = b.state === "retrying" || b.state === "exhausted";
    const offset = b.head_offset ?? b.offset;
    const ref = { group: g.name, topic: b.topic, qid: b.qid, offset, key: b.order_value ?? "" };
    return h("tr", { class: waitsForOperator ? "bad" : "warn", dataset: { key: b.order_value ?? `${b.topic}/${b.qid}@${b.offset}`, state: b.state } },
      h("td", { class: "key" }, b.order_value ?? h("i", {}, "unordered")),
      h("td", {}, `${b.topic}/${b.qid}@${offset}`),
      h("td", {}, h("span", { class: `state ${b.state}` }, b.state.replace("_", " ")), b.parked ? h("span", { class: "state parked" }, "parked") : null),
      h("td", { class: "num" }, num(b.attempts)),
      h("td", { class: "num" }, age(now - b.blocked_since_ms)),
      h("td", { class: "num" }, num(b.waiting)),
      h("td", { class: "err" }, b.last_error || ""),
      "body" in b ? bodyCell(`${g.name}:bk:${b.topic}:${b.qid}:${offset}`, b.body) : h("td", {}),
      h("td", { class: "actions" }, lookButton({ topic: b.topic, qid: b.qid, offset }),
        waitsForOperator ? [button("skip", "Skip", ref, "danger"), button("release", "Release", ref)] : h("small", {}, " in flight")));
  });
  const total = Math.max(g.stats.blocked_keys || 0, g.blocked.length);
  return h("div", { class: "blocked" },
    h("h4", {}, `Blocked keys (${num(total)}${total > MAX_ROWS ? `, longest ${MAX_ROWS} shown` : ""}, longest blocked first)`),
    table(["key", "head", "state", "#attempts", "#blocked for", "#waiting", "last error", "body", ""], rows));
}

function deadTable(g) {
  const selected = g.selected || new Set();
  const rows = g.dead.slice(0, MAX_ROWS).map((d) => h("tr", { dataset: { offset: d.offset, qid: d.qid, topic: d.topic } },
    h("td", {}, h("input", { type: "checkbox", class: "pick", checked: selected.has(refText(d)), dataset: { group: g.name, ref: refText(d) }, "aria-label": `select ${refText(d)}` })),
    h("td", {}, refText(d)),
    h("td", { class: "key" }, d.key ?? h("i", {}, "none")),
    h("td", { class: "num" }, num(d.attempts)),
    h("td", { class: "err" }, d.last_error || ""),
    h("td", {}, clock(d.dead_lettered_at_ms)),
    bodyCell(`${g.name}:dl:${d.topic}:${d.qid}:${d.offset}`, d.body),
    h("td", { class: "actions" }, lookButton(d))));
  const count = g.stats.dead_lettered;
  const topics = [...new Set(g.dead.map((d) => d.topic))].sort();
  const picked = selected.size;
  return h("div", { class: "dead" },
    h("h4", {}, `Dead letters (${num(count)}${count > MAX_ROWS ? `, oldest ${MAX_ROWS} shown` : ""})`),
    h("div", { class: "toolbar" },
      button("redrive-selected", `Redrive selected (${picked})`, { group: g.name }, picked ? "" : "idle"),
      button("delete-selected", `Delete selected (${picked})`, { group: g.name }, picked ? "danger" : "danger idle"),
      topics.map((t) => button("purge", `Delete all of ${t}`, { group: g.name, topic: t }, "danger"))),
    table(["", "message", "key", "#attempts", "last error", "dead-lettered at", "body", ""], rows));
}

function consumersFold(g) {
  const list = g.stats.consumers || [];
  const rows = list.map((c) => h("tr", { dataset: { consumer: c.consumer } },
    h("td", { class: "key" }, c.consumer), h("td", { class: "num" }, `${age(c.last_pull_ms_ago)} ago`), h("td", { class: "num" }, num(c.in_flight))));
  return fold(`${g.name}:consumers`, false, `Consumers (${list.length}, seen in the last 5 min)`,
    list.length ? table(["consumer", "#last pull", "#in flight"], rows, { class: "consumers" }) : h("p", { class: "empty" }, "nobody pulled in the last 5 minutes"));
}

const rate = (n) => (typeof n === "number" ? `${n < 10 ? n.toFixed(1) : num(Math.round(n))}/s` : "–");

function groupCard(g, now) {
  const reasons = assess(g, now);
  const level = ["ok", "warn", "bad"][severity(reasons)];
  const head = h("header", {},
    h("h3", {}, g.name),
    g.config ? topicsLine(g.config) : null,
    reasons.map((r) => h("span", { class: `badge ${r.level}` }, r.text)),
    h("span", { class: "spacer" }),
    g.stats ? [
      button("seek", "Seek…", { group: g.name }),
      g.stats.dead_lettered > 0 ? button("redrive", `Redrive ${num(g.stats.dead_lettered)} dead letter${g.stats.dead_lettered === 1 ? "" : "s"}`, { group: g.name }, "danger") : null,
    ] : null);
  const card = h("article", { class: `group ${level}`, dataset: { group: g.name, trouble: level !== "ok" } }, head);
  if (!g.stats) return card;
  const s = g.stats;
  const lag = totalLag(s);
  card.append(h("dl", { class: "stats" },
    stat("lag", "lag", num(lag), sparkline(lagHistory(g.name)), lag > 0 ? "lead" : "lead zero"),
    "lag_excluding_parked" in s ? stat("lag_excluding_parked", "lag w/o parked", num(s.lag_excluding_parked)) : null,
    "oldest_unfinished_age_ms" in s ? stat("oldest_unfinished_age_ms", "oldest unfinished", s.oldest_unfinished_age_ms == null ? "–" : age(s.oldest_unfinished_age_ms)) : null,
    stat("ready", "ready", num(s.ready)),
    stat("in_flight", "in flight", num(s.in_flight)),
    stat("retrying", "retrying", num(s.retrying), null, s.retrying > 0 ? "bad" : ""),
    stat("waiting", "waiting", num(s.waiting)),
    stat("parked_keys", "parked keys", num(s.parked_keys), null, s.parked_keys > 0 ? "warn" : ""),
    stat("blocked_keys", "blocked keys", num(s.blocked_keys), null, s.blocked_keys > 0 ? "warn" : ""),
    "in_flight_keys" in s ? stat("in_flight_keys", "keys in flight", num(s.in_flight_keys)) : null,
    "consumers" in s ? stat("consumers", "consumers", num(s.consumers.length), null, noConsumer(g) && lag > 0 ? "bad" : "") : null,
    "last_pull_ms_ago" in s ? stat("last_pull_ms_ago", "last pull", s.last_pull_ms_ago == null ? "never" : `${age(s.last_pull_ms_ago)} ago`) : null,
    "delivered_per_s" in s ? stat("delivered_per_s", "delivered", rate(s.delivered_per_s)) : null,
    "acked_per_s" in s ? stat("acked_per_s", "acked", rate(s.acked_per_s)) : null,
    stat("dead_lettered", "dead letters", num(s.dead_lettered), null, s.dead_lettered > 0 ? "bad" : ""),
    "filtered" in s ? stat("filtered", "filtered", num(s.filtered)) : null,
    "delayed" in s ? stat("delayed", "delayed", num(s.delayed)) : null,
    g.config.max_per_second != null ? stat("throttled_ms", "throttled", age(s.throttled_ms || 0)) : null,
    "lost_to_retention" in s ? stat("lost_to_retention", "lost to retention", num(s.lost_to_retention), null, s.lost_to_retention > 0 ? "bad" : "") : null));
  const queues = s.queues.map((q) => h("tr", { dataset: { topic: q.topic, qid: q.qid } },
    h("td", {}, q.topic), h("td", { class: "num" }, q.qid), h("td", { class: "num", dataset: { col: "committed" } }, num(q.committed_offset)),
    h("td", { class: "num", dataset: { col: "next" } }, num(q.next_offset)), h("td", { class: "num", dataset: { col: "lag" } }, num(q.lag))));
  card.append(fold(`${g.name}:queues`, s.queues.length <= 4, `Queues (${s.queues.length})`,
    table(["topic", "#qid", "#committed", "#read up to", "#lag"], queues, { class: "queues" })));
  if ("consumers" in s) card.append(consumersFold(g));
  if (g.blocked.length > 0) card.append(blockedTable(g, now));
  if (s.dead_lettered > 0) card.append(deadTable(g));
  const c = g.config;
  card.append(h("p", { class: "config" },
    `max_attempts ${c.max_attempts} · backoff ${(c.retry_backoff_ms || []).join("/")} ms · ack timeout ${num(c.ack_timeout_ms)} ms · on exhausted: ${c.on_exhausted} · max_buffered ${num(c.max_buffered)}`
    + ("stuck_after_ms" in c ? ` · stuck after ${num(c.stuck_after_ms)} ms` : "")
    + (c.dead_letter_retention_ms ? ` · dead letters kept ${age(c.dead_letter_retention_ms)}` : "")
    + (c.max_per_second != null ? ` · max ${num(c.max_per_second)}/s` : "")));
  return card;
}

/** Group cards, the groups in trouble first (most severe first), then by name; `filter`
 * (`{text, troubleOnly}`) keeps those whose name contains the text / that are in trouble. */
export function renderGroups(groups, now, filter) {
  if (groups.length === 0) return [h("p", { class: "empty" }, "No groups yet.")];
  const text = ((filter && filter.text) || "").trim().toLowerCase();
  const ranked = groups.map((g) => ({ g, rank: severity(assess(g, now)) }))
    .filter(({ g, rank }) => (!text || g.name.toLowerCase().includes(text)) && (!(filter && filter.troubleOnly) || rank > 0));
  ranked.sort((a, b) => b.rank - a.rank || a.g.name.localeCompare(b.g.name));
  if (ranked.length === 0) return [h("p", { class: "empty" }, `No group matches (${groups.length} in all).`)];
  return ranked.map(({ g }) => groupCard(g, now));
}

function retention(t) {
  if (!("retention_ms" in t) && !("retention_bytes" in t)) return null;
  const parts = [];
  if (t.retention_ms != null) parts.push(age(t.retention_ms));
  if (t.retention_bytes != null) parts.push(`${bytes(t.retention_bytes)} per queue`);
  return `retention ${parts.length ? parts.join(", ") : "unbounded"}`;
}

export function renderTopics(topics) {
  if (topics.length === 0) return [h("p", { class: "empty" }, "No topics yet.")];
  return topics.map((t) => {
    const card = h("article", { class: "topic", dataset: { topic: t.name } });
    if (t.error) return h("article", { class: "topic bad", dataset: { topic: t.name } }, h("h3", {}, t.name), h("p", { class: "error" }, t.error.message));
    const qs = t.queue_stats || [];
    const stored = qs.reduce((n, q) => n + (q.next_offset - q.min_offset), 0);
    card.append(h("h3", {}, t.name, h("small", {}, ` ${t.queues} queue${t.queues === 1 ? "" : "s"} · `,
      h("span", { dataset: { stat: "stored" } }, num(stored)), " stored", retention(t) ? ` · ${retention(t)}` : "")));
    const rows = qs.map((q) => h("tr", { dataset: { qid: q.qid } }, h("td", { class: "num" }, q.qid),
      h("td", { class: "num", dataset: { col: "min" } }, num(q.min_offset)), h("td", { class: "num", dataset: { col: "next" } }, num(q.next_offset)),
      h("td", { class: "actions" }, button("browse", "Newest", { topic: t.name, qid: q.qid, last: 20 }))));
    card.append(fold(`topic:${t.name}`, qs.length <= 8, `Queues (min / next offset)`, table(["#qid", "#min", "#next", ""], rows, { class: "queues" })));
    return card;
  });
}

export function renderCluster(cluster) {
  const members = cluster.members || [];
  const queues = cluster.queues || [];
  const owners = new Map();
  for (const q of queues) owners.set(q.owner ?? "(none)", (owners.get(q.owner ?? "(none)") || 0) + 1);
  const odd = queues.filter((q) => q.state !== "owned");
  return [
    h("p", {}, `This node: ${cluster.node ?? "?"} · ${members.length} member${members.length === 1 ? "" : "s"} · ${queues.length} queues`,
      odd.length ? h("span", { class: "badge warn" }, `${odd.length} not owned`) : null),
    table(["node", "url", "#heartbeat", "#queues owned"], members.map((m) => h("tr", {},
      h("td", {}, m.node), h("td", {}, m.url ?? ""), h("td", { class: "num" }, m.heartbeat_ms_ago == null ? "–" : `${age(m.heartbeat_ms_ago)} ago`),
      h("td", { class: "num" }, num(owners.get(m.node) || 0))))),
    fold("cluster:queues", odd.length > 0, `Queue owners (${queues.length})`,
      table(["topic", "#qid", "owner", "state", "#epoch"], queues.map((q) => h("tr", { class: q.state === "owned" ? "" : "warn" },
        h("td", {}, q.topic), h("td", { class: "num" }, q.qid), h("td", {}, q.owner ?? "–"), h("td", {}, q.state), h("td", { class: "num" }, q.epoch ?? "–"))))),
  ];
}

/** The message browser's result: stored messages read without any group. */
export function renderMessages(page) {
  if (page.error) return [h("p", { class: "error" }, page.error)];
  const rows = page.messages.map((m) => h("tr", { dataset: { offset: m.offset } },
    h("td", { class: "num" }, m.offset),
    h("td", { class: "key" }, m.key ?? h("i", {}, "none")),
    h("td", {}, clock(m.produced_at_ms)),
    h("td", {}, m.deliver_at_ms == null ? "" : clock(m.deliver_at_ms)),
    h("td", {}, m.headers ? json(m.headers, 60) : ""),
    h("td", { class: "body" }, h("pre", {}, JSON.stringify(m.body, null, 2)))));
  return [
    h("p", { class: "hint" }, `${page.topic} queue ${page.qid}: ${page.messages.length} message${page.messages.length === 1 ? "" : "s"}, read without any group (nothing delivered or held).`),
    page.messages.length ? table(["#offset", "key", "produced at", "deliver at", "headers", "body"], rows, { class: "messages" }) : h("p", { class: "empty" }, "No stored message there."),
    h("div", { class: "toolbar" }, button("browse", "Next →", { topic: page.topic, qid: page.qid, from: page.next })),
  ];
}
