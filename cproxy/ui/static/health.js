// What makes a group "in trouble", and the lag history behind the "lag growing" signal.

/** Samples of total lag kept per group (one per refresh: ~90 s at the default 1.5 s). */
const HISTORY_SAMPLES = 60;
/** Lag counts as growing when it rose over at least this long without ever falling. */
const GROWING_WINDOW_MS = 8000;
/** An unfinished message this old means work is not getting done (consumers slow or gone). */
export const OLD_UNFINISHED_MS = 5 * 60000;

const history = new Map(); // group name -> [{at, lag}]

export function totalLag(stats) {
  return (stats.queues || []).reduce((sum, q) => sum + (q.lag || 0), 0);
}

/** Record this refresh's lag of each group; forget groups that went away. */
export function recordLag(groups, at) {
  const seen = new Set();
  for (const g of groups) {
    if (!g.stats) continue;
    seen.add(g.name);
    const samples = history.get(g.name) || [];
    samples.push({ at, lag: totalLag(g.stats) });
    if (samples.length > HISTORY_SAMPLES) samples.shift();
    history.set(g.name, samples);
  }
  for (const name of [...history.keys()]) if (!seen.has(name)) history.delete(name);
}

export function lagHistory(name) {
  return history.get(name) || [];
}

/** The lag rose over the last GROWING_WINDOW_MS and never fell in between: consumers are
 * not keeping up (or are gone). Returns the rise, or 0. */
export function lagGrowth(name) {
  const samples = lagHistory(name);
  const last = samples[samples.length - 1];
  if (!last) return 0;
  let i = samples.length - 1;
  while (i > 0 && samples[i - 1].lag <= samples[i].lag && last.at - samples[i].at < GROWING_WINDOW_MS) i -= 1;
  const first = samples[i];
  return last.at - first.at >= GROWING_WINDOW_MS && last.lag > first.lag ? last.lag - first.lag : 0;
}

/**
 * Reasons a group needs an operator, most severe first: [{level: "bad"|"warn", text}].
 * Fields that only newer servers report (lost_to_retention) count only when present.
 */
export function assess(group, now) {
  if (group.error) return [{ level: "bad", text: group.error.message }];
  const s = group.stats;
  const reasons = [];
  if (s.dead_lettered > 0) reasons.push({ level: "bad", text: `${s.dead_lettered} dead letter${s.dead_lettered === 1 ? "" : "s"}` });
  const exhausted = s.exhausted || 0;
  if (exhausted > 0) reasons.push({ level: "bad", text: `${exhausted} key${exhausted === 1 ? "" : "s"} blocked for an operator` });
  if (s.retrying > 0) reasons.push({ level: "warn", text: `${s.retrying} retrying` });
  if (s.lost_to_retention > 0) reasons.push({ level: "bad", text: `${s.lost_to_retention} lost to retention` });
  // Newer servers list only stuck keys: an in-flight one is past the group's stuck_after_ms.
  const stale = group.blocked.filter((b) => b.state === "in_flight").length;
  if (stale > 0) reasons.push({ level: "warn", text: `${stale} key${stale === 1 ? "" : "s"} stuck in flight` });
  const lag = totalLag(s);
  if (noConsumer(group) && lag > 0) reasons.push({ level: "bad", text: "lag and no consumer" });
  const oldest = s.oldest_unfinished_age_ms;
  if (oldest != null && oldest > OLD_UNFINISHED_MS) reasons.push({ level: "warn", text: `oldest unfinished ${minutes(oldest)} old` });
  if (s.parked_keys > 0) reasons.push({ level: "warn", text: `${s.parked_keys} parked key${s.parked_keys === 1 ? "" : "s"}` });
  const growth = lagGrowth(group.name);
  if (growth > 0) reasons.push({ level: "warn", text: `lag growing (+${growth.toLocaleString("en-US")})` });
  return reasons;
}

/** Nobody pulled in the last five minutes (servers that report `consumers`) and nothing is
 * pushed: whatever the group has to deliver waits for nobody. */
export function noConsumer(group) {
  const s = group.stats;
  if (!Array.isArray(s.consumers) || s.consumers.length > 0) return false;
  return !Object.values((group.config && group.config.topics) || {}).some((t) => t.push && t.push.url);
}

function minutes(ms) {
  const m = Math.floor(ms / 60000);
  return m < 120 ? `${m} min` : `${Math.floor(m / 60)} h`;
}

export function severity(reasons) {
  if (reasons.some((r) => r.level === "bad")) return 2;
  return reasons.length > 0 ? 1 : 0;
}
