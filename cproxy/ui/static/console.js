// The console's controller: polls the API, renders, and runs the operator actions.

import { api, setToken, token } from "./api.js";
import { assess, recordLag, severity } from "./health.js";
import { MAX_ROWS, clock, h, renderCluster, renderGroups, renderMessages, renderTopics } from "./view.js";

const params = new URLSearchParams(window.location.search);
/** Refresh period; `?refresh_ms=` overrides it (200 ms .. 60 s), default 1.5 s. */
const REFRESH_MS = Math.min(60000, Math.max(200, Number(params.get("refresh_ms")) || 1500));
/** Dead letters are re-listed when their count changes, else at most this often. */
const DEAD_LETTER_REFRESH_MS = 15000;
/** After a 404 from /v1/cluster (an older server), ask again only this much later. */
const CLUSTER_RETRY_MS = 60000;
/** From this many groups on, the groups panel offers a filter. */
const FILTER_FROM_GROUPS = 8;

const $ = (id) => document.getElementById(id);
const state = {
  timer: null, running: false, again: false, awaitingToken: false, polls: 0,
  clusterRetryAt: 0, groups: new Map(), deadCache: new Map(), folds: new Map(), run: null,
  selected: new Map(), // group -> Set of "topic/qid@offset" of dead letters ticked
};

// ---- polling ---------------------------------------------------------------------------

async function loadGroup(name) {
  const path = ["v1", "groups", name];
  try {
    const { stats, ...config } = await api("GET", path);
    const wantBlocked = stats.blocked_keys > 0 || stats.exhausted > 0;
    const cached = state.deadCache.get(name);
    const deadFresh = cached && cached.count === stats.dead_lettered && Date.now() - cached.at < DEAD_LETTER_REFRESH_MS;
    const [blocked, dead] = await Promise.all([
      wantBlocked ? api("GET", [...path, "blocked-keys"], { query: { limit: MAX_ROWS } }) : null,
      stats.dead_lettered > 0 && !deadFresh ? api("GET", [...path, "dead-letters"], { query: { limit: MAX_ROWS } }) : null,
    ]);
    if (dead) state.deadCache.set(name, { count: stats.dead_lettered, at: Date.now(), rows: dead.dead_letters });
    if (stats.dead_lettered === 0) state.deadCache.delete(name);
    const rows = stats.dead_lettered > 0 ? state.deadCache.get(name).rows : [];
    // Ticks of dead letters that are gone (redriven, deleted) are dropped.
    const listed = new Set(rows.map((d) => `${d.topic}/${d.qid}@${d.offset}`));
    const selected = new Set([...(state.selected.get(name) || [])].filter((r) => listed.has(r)));
    state.selected.set(name, selected);
    return { name, config, stats, blocked: blocked ? blocked.blocked_keys : [], dead: rows, selected };
  } catch (err) {
    if (err.status === 401 || err.status === 0) throw err;
    return { name, error: err, blocked: [], dead: [] }; // e.g. 403 outside the token's scope
  }
}

async function loadTopic(t) {
  try {
    return await api("GET", ["v1", "topics", t.name]);
  } catch (err) {
    if (err.status === 401 || err.status === 0) throw err;
    return { ...t, error: err };
  }
}

async function loadCluster() {
  if (Date.now() < state.clusterRetryAt) return null;
  try {
    return await api("GET", ["v1", "cluster"]);
  } catch (err) {
    if (err.status === 401 || err.status === 0) throw err;
    state.clusterRetryAt = Date.now() + CLUSTER_RETRY_MS; // not served by this version
    return null;
  }
}

async function snapshot() {
  const [topics, groups] = await Promise.all([api("GET", ["v1", "topics"]), api("GET", ["v1", "groups"])]);
  const [described, loaded, cluster] = await Promise.all([
    Promise.all(topics.topics.map(loadTopic)),
    Promise.all(groups.groups.map((g) => loadGroup(g.name))),
    loadCluster(),
  ]);
  return { topics: described, groups: loaded, cluster, at: Date.now() };
}

/** Swap a panel's content, keeping the folds the operator opened or closed. */
function fill(container, nodes) {
  const fragment = document.createDocumentFragment();
  fragment.append(...nodes);
  for (const d of fragment.querySelectorAll("details[data-fold]")) {
    if (state.folds.has(d.dataset.fold)) d.open = state.folds.get(d.dataset.fold);
  }
  container.replaceChildren(fragment);
}

function render(snap) {
  recordLag(snap.groups, snap.at);
  state.groups = new Map(snap.groups.map((g) => [g.name, g]));
  $("group-filter").hidden = snap.groups.length < FILTER_FROM_GROUPS && !$("group-filter-text").value;
  const filter = { text: $("group-filter-text").value, troubleOnly: $("group-filter-trouble").checked };
  fill($("groups"), renderGroups(snap.groups, snap.at, $("group-filter").hidden ? null : filter));
  fill($("topics"), renderTopics(snap.topics));
  $("cluster-panel").hidden = !snap.cluster;
  if (snap.cluster) fill($("cluster"), renderCluster(snap.cluster));
  // Counted over every group, also those a filter hides.
  const trouble = snap.groups.filter((g) => severity(assess(g, snap.at)) > 0).length;
  state.lastSnap = snap;
  $("summary").replaceChildren(
    `${snap.topics.length} topic${snap.topics.length === 1 ? "" : "s"} · ${snap.groups.length} group${snap.groups.length === 1 ? "" : "s"}`,
    trouble ? h("span", { class: "badge bad", id: "trouble-count" }, `${trouble} in trouble`) : h("span", { class: "badge ok" }, "all healthy"));
}

function setStatus(kind, text) {
  const el = $("status");
  el.dataset.state = kind;
  el.textContent = text;
}

async function poll() {
  state.timer = null;
  if (document.hidden || state.awaitingToken) return;
  state.running = true;
  try {
    const snap = await snapshot();
    render(snap);
    state.polls += 1;
    document.body.dataset.polls = String(state.polls);
    setStatus("live", `live · every ${REFRESH_MS / 1000}s · ${clock(snap.at).slice(11)}`);
  } catch (err) {
    if (err.status === 401) askForToken(err);
    else setStatus("error", `${err.message} (retrying)`);
  } finally {
    state.running = false;
    schedule(state.again ? 0 : REFRESH_MS);
    state.again = false;
  }
}

function schedule(delay) {
  if (state.timer === null && !state.running && !document.hidden && !state.awaitingToken) {
    state.timer = window.setTimeout(poll, delay);
  }
}

function refreshNow() {
  if (state.running) { state.again = true; return; }
  window.clearTimeout(state.timer);
  state.timer = null;
  schedule(0);
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    window.clearTimeout(state.timer); // no requests while nobody looks
    state.timer = null;
    setStatus("paused", "paused while the tab is hidden");
  } else refreshNow();
});

// ---- token -------------------------------------------------------------------------------

function askForToken(err) {
  state.awaitingToken = true;
  setStatus("auth", "token needed");
  $("token-prompt").textContent = token()
    ? `The token was refused (${err.message}). Enter another:`
    : "This server needs a token (role admin, or consumer for its groups):";
  $("token-form").hidden = false;
  $("forget-token").hidden = !token();
  $("token-input").focus();
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("token-input").value.trim());
  $("token-input").value = "";
  $("token-form").hidden = true;
  $("forget-token").hidden = !token();
  state.awaitingToken = false;
  refreshNow();
});

$("forget-token").addEventListener("click", () => {
  setToken("");
  $("forget-token").hidden = true;
  refreshNow();
});

// ---- actions -----------------------------------------------------------------------------

function notify(text, kind = "ok") {
  const el = $("notice");
  el.textContent = text;
  el.dataset.kind = kind;
  el.hidden = false;
  window.clearTimeout(notify.timer);
  notify.timer = window.setTimeout(() => { el.hidden = true; }, 8000);
}

/** Open the confirmation dialog; `run` does the call and returns the message to show. */
function confirmAction(title, body, label, run) {
  $("confirm-title").textContent = title;
  $("confirm-body").replaceChildren(...body);
  $("confirm-error").textContent = "";
  $("confirm-ok").textContent = label;
  state.run = run;
  $("confirm").showModal();
}

$("confirm-cancel").addEventListener("click", () => $("confirm").close());
$("confirm-ok").addEventListener("click", async () => {
  const ok = $("confirm-ok");
  ok.disabled = true;
  try {
    const message = await state.run();
    $("confirm").close();
    notify(message);
    refreshNow();
  } catch (err) {
    $("confirm-error").textContent = err.message;
    if (err.status === 401) { $("confirm").close(); askForToken(err); }
  } finally {
    ok.disabled = false;
  }
});

const ref = (d) => `${d.topic}/${d.qid}@${d.offset}`;
const headOf = (d) => ({ topic: d.topic, qid: Number(d.qid), offset: Number(d.offset) });
const parseRef = (text) => {
  const at = text.lastIndexOf("@");
  const slash = text.lastIndexOf("/", at);
  return { topic: text.slice(0, slash), qid: Number(text.slice(slash + 1, at)), offset: Number(text.slice(at + 1)) };
};
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function pickedOf(group) {
  return [...(state.selected.get(group) || [])].sort().map(parseRef);
}

function refList(refs) {
  return h("ul", {}, refs.slice(0, 10).map((r) => h("li", {}, ref(r))), refs.length > 10 ? h("li", {}, `… ${refs.length - 10} more`) : null);
}

// ---- the message browser -------------------------------------------------------------------

async function browse({ topic, qid, from, last, from_ms }) {
  $("browser-panel").hidden = false;
  $("browser-topic").value = topic;
  $("browser-qid").value = qid ?? 0;
  const mode = last != null ? "last" : from_ms != null ? "from_ms" : "from";
  $("browser-mode").value = mode;
  $("browser-value").value = last ?? (from_ms != null ? new Date(Number(from_ms)).toISOString() : from ?? "");
  const query = { qid: qid ?? 0, limit: 20 };
  if (last != null) query.last = last;
  else if (from_ms != null) query.from_ms = from_ms;
  else if (from != null && from !== "") query.from = from;
  let page;
  try {
    page = await api("GET", ["v1", "topics", topic, "messages"], { query });
  } catch (err) {
    if (err.status === 401) { askForToken(err); return; }
    page = { error: err.message };
  }
  $("browser").replaceChildren(...renderMessages(page));
  $("browser-panel").scrollIntoView({ block: "start" });
}

$("browser-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const mode = $("browser-mode").value;
  const value = $("browser-value").value.trim();
  const target = { topic: $("browser-topic").value.trim(), qid: Number($("browser-qid").value || 0) };
  if (mode === "last") target.last = Number(value || 20);
  else if (mode === "from_ms") {
    const ms = new Date(value).getTime();
    if (!Number.isFinite(ms)) { $("browser").replaceChildren(h("p", { class: "error" }, "enter a date and time")); return; }
    target.from_ms = ms;
  } else target.from = value;
  browse(target);
});

$("browser-close").addEventListener("click", () => { $("browser-panel").hidden = true; });

const ACTIONS = {
  skip: (d) => confirmAction(`Skip key ${d.key || ref(d)}?`, [
    h("p", {}, `Group ${d.group}: the head message ${ref(d)} is dead-lettered now (it stays listed, and can be redriven) and the key's next message is delivered.`),
  ], "Skip", async () => {
    const r = await api("POST", ["v1", "groups", d.group, "blocked-keys", "skip"], { body: headOf(d) });
    return `Skipped ${ref(r.skipped)} in ${d.group}: now a dead letter.`;
  }),
  release: (d) => confirmAction(`Release key ${d.key || ref(d)}?`, [
    h("p", {}, `Group ${d.group}: ${ref(d)} is delivered again now, with a fresh attempt budget.`),
  ], "Release", async () => {
    const r = await api("POST", ["v1", "groups", d.group, "blocked-keys", "release"], { body: headOf(d) });
    return `Released ${ref(r.released)} in ${d.group}.`;
  }),
  redrive: (d) => {
    const count = state.groups.get(d.group)?.stats?.dead_lettered ?? 0;
    confirmAction(`Redrive dead letters of ${d.group}?`, [
      h("p", {}, `${count} dead letter${count === 1 ? " is" : "s are"} delivered again to group ${d.group} only, in their original per-key order.`),
    ], "Redrive", async () => {
      const r = await api("POST", ["v1", "groups", d.group, "dead-letters", "redrive"]);
      return `Redrove ${r.redriven} dead letter${r.redriven === 1 ? "" : "s"} of ${d.group}.`;
    });
  },
  seek: (d) => seekDialog(d.group),
  browse: (d) => browse(d),
  "redrive-selected": (d) => {
    const picked = pickedOf(d.group);
    if (!picked.length) { notify("Tick the dead letters to redrive first.", "error"); return; }
    confirmAction(`Redrive ${plural(picked.length, "dead letter")} of ${d.group}?`, [
      h("p", {}, `Delivered again to group ${d.group} only, in their original per-key order:`), refList(picked),
    ], "Redrive", async () => {
      const r = await api("POST", ["v1", "groups", d.group, "dead-letters", "redrive"], { body: { messages: picked } });
      state.selected.delete(d.group);
      return `Redrove ${plural(r.redriven, "dead letter")} of ${d.group}.`;
    });
  },
  "delete-selected": (d) => {
    const picked = pickedOf(d.group);
    if (!picked.length) { notify("Tick the dead letters to delete first.", "error"); return; }
    confirmAction(`Delete ${plural(picked.length, "dead letter")} of ${d.group} for good?`, [
      h("p", {}, "They are removed from the group's dead letters and cannot be redriven afterwards:"), refList(picked),
    ], "Delete", async () => {
      const r = await api("DELETE", ["v1", "groups", d.group, "dead-letters"], { body: { messages: picked } });
      state.selected.delete(d.group);
      return `Deleted ${plural(r.deleted, "dead letter")} of ${d.group}.`;
    });
  },
  purge: (d) => confirmAction(`Delete every dead letter of ${d.topic} in ${d.group}?`, [
    h("p", {}, `All dead letters of topic ${d.topic} are removed from group ${d.group} for good (not only the ones shown).`),
  ], "Delete all", async () => {
    const r = await api("DELETE", ["v1", "groups", d.group, "dead-letters"], { query: { topic: d.topic } });
    return `Deleted ${plural(r.deleted, "dead letter")} of ${d.topic} in ${d.group}.`;
  }),
};

function seekDialog(group) {
  const g = state.groups.get(group);
  const topics = Object.keys(g.config.topics);
  const topic = h("select", { id: "seek-topic" }, topics.map((t) => h("option", { value: t }, t)));
  const qid = h("select", { id: "seek-qid" });
  const fillQids = () => qid.replaceChildren(h("option", { value: "" }, "all queues"),
    ...g.stats.queues.filter((q) => q.topic === topic.value).map((q) => h("option", { value: q.qid }, `queue ${q.qid}`)));
  topic.addEventListener("change", fillQids);
  fillQids();
  const choice = (value, label, input) => h("label", { class: "choice" },
    h("input", { type: "radio", name: "seek-to", value, checked: value === "earliest" }), ` ${label} `, input);
  const offset = h("input", { id: "seek-offset", type: "number", min: 0, step: 1, placeholder: "offset" });
  const when = h("input", { id: "seek-time", type: "datetime-local", step: 1 });
  confirmAction(`Seek group ${group}`, [
    h("div", { class: "form" }, h("label", {}, "topic ", topic), h("label", {}, "queue ", qid)),
    h("div", { class: "form" }, choice("earliest", "earliest"), choice("latest", "latest"),
      choice("offset", "offset", offset), choice("timestamp", "time", when)),
    h("p", { class: "hint" }, "Moving back delivers messages again; moving forward skips them for this group only."),
  ], "Seek", async () => {
    const kind = document.querySelector("input[name=seek-to]:checked").value;
    let to = kind;
    if (kind === "offset") {
      if (offset.value === "" || !(Number(offset.value) >= 0)) throw new Error("enter an offset (0 or more)");
      to = Number(offset.value);
    } else if (kind === "timestamp") {
      const ms = new Date(when.value).getTime();
      if (!Number.isFinite(ms)) throw new Error("enter a date and time");
      to = { timestamp_ms: ms };
    }
    const body = { topic: topic.value, qid: qid.value === "" ? null : Number(qid.value), to };
    const r = await api("POST", ["v1", "groups", group, "seek"], { body });
    return `Moved ${group} on ${r.topic}: ${r.offsets.map((o) => `queue ${o.qid} → ${o.offset}`).join(", ")}.`;
  });
}

document.addEventListener("click", (e) => {
  const summary = e.target.closest("details[data-fold] > summary");
  if (summary) state.folds.set(summary.parentElement.dataset.fold, !summary.parentElement.open);
  const button = e.target.closest("button[data-action]");
  if (button && ACTIONS[button.dataset.action]) ACTIONS[button.dataset.action](button.dataset);
});

document.addEventListener("change", (e) => {
  const pick = e.target.closest("input.pick");
  if (pick) {
    const selected = state.selected.get(pick.dataset.group) || new Set();
    if (pick.checked) selected.add(pick.dataset.ref);
    else selected.delete(pick.dataset.ref);
    state.selected.set(pick.dataset.group, selected);
    if (state.lastSnap) render(state.lastSnap); // the buttons' counts follow at once
  }
});

for (const id of ["group-filter-text", "group-filter-trouble"]) {
  $(id).addEventListener("input", () => { if (state.lastSnap) render(state.lastSnap); });
}

if (token()) $("forget-token").hidden = false;
poll();
