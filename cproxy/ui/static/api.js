// Calls to the /v1 API with the operator's token (kept in sessionStorage: this tab only).

const TOKEN_KEY = "cproxy.console.token";

// The page is served at <prefix>/ui, so "." is <prefix>/ and API paths are relative to it.
const BASE = new URL(".", window.location.href);

/** An error answer of the API: `status` is the HTTP status, `code` the contract's error code. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function token() {
  return window.sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
  else window.sessionStorage.removeItem(TOKEN_KEY);
}

/** `path` segments are URL-encoded here: pass raw names, e.g. api("GET", ["v1", "groups", g]). */
export async function api(method, path, { body, query } = {}) {
  const url = new URL(path.map(encodeURIComponent).join("/"), BASE);
  for (const [k, v] of Object.entries(query || {})) url.searchParams.set(k, String(v));
  const headers = { accept: "application/json" };
  const secret = token();
  if (secret) headers.authorization = `Bearer ${secret}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, "unreachable", `server unreachable (${err.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(
      response.status,
      error.code || `http_${response.status}`,
      error.message || response.statusText || `HTTP ${response.status}`,
    );
  }
  return data;
}
