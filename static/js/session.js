// /sessions/<id>/: live status, timeline and progress; the command box and the log.
import { EventStream, applyStatus, csrfToken, formatDuration, refresher } from "./live.js";

const root = document.getElementById("session");
const sessionId = root.dataset.sessionId;
const refresh = refresher(["session-panel", "session-controls"]);
const runButton = document.getElementById("execute-run");

function setStatus(status) {
  root.dataset.status = status;
  runButton.disabled = status !== "RUNNING";
  runButton.title = status === "RUNNING" ? "" : "Commands run in a RUNNING session.";
}
setStatus(root.dataset.status);

new EventStream({
  query: `?session=${sessionId}`,
  onEvent(message) {
    if (message.event === "kernel_stat") {  // samples for the charts: no re-render
      document.dispatchEvent(new CustomEvent("kernel:stat", { detail: message }));
      return;
    }
    if (message.event === "kernel_pull_progress") {
      showPullProgress(message.data);  // not stored and changes no status: no re-render
      return;
    }
    if (applyStatus(message)) setStatus(message.status);
    refresh();
  },
});

function showPullProgress(progress) {
  const line = document.getElementById("pull-progress");
  if (!line || !progress) return;
  const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
  line.textContent = `Layers ${progress.layers_done} of ${progress.layers_total}` +
    (progress.bytes_total ? `, ${mib(progress.bytes_current)} of ${mib(progress.bytes_total)}` : "");
}

// The re-rendered panel is the database's word: the header follows it too.
document.addEventListener("fragments:refreshed", () => {
  const panel = document.getElementById("session-panel");
  const message = { event: "session_rendered", session_id: sessionId,
                    status: panel.dataset.status, at: panel.dataset.statusAt };
  if (applyStatus(message)) setStatus(message.status);
  tickPhases();
});

// While PENDING, the scheduler's reason changes without an event: look again now and then.
setInterval(() => {
  if (root.dataset.status === "PENDING") refresh();
}, 5000);

function tickPhases() {
  for (const time of document.querySelectorAll(".phase-time[data-since]")) {
    time.textContent = formatDuration((Date.now() - Date.parse(time.dataset.since)) / 1000);
  }
}
setInterval(tickPhases, 1000);

// Idle checks: each countdown ticks here from the seconds left the server gave; the
// server's view is read again every check interval (activity moves deadlines without an
// event) and after every event of this session (a warning, its cancellation, the cull).
const countdownStart = new WeakMap();
function tickCountdowns() {
  const now = performance.now();
  for (const countdown of document.querySelectorAll(".countdown[data-remaining]")) {
    if (!countdownStart.has(countdown)) countdownStart.set(countdown, now);
    const left = Number(countdown.dataset.remaining) - (now - countdownStart.get(countdown)) / 1000;
    countdown.textContent = formatCountdown(left);
  }
}
setInterval(tickCountdowns, 1000);
document.addEventListener("fragments:refreshed", tickCountdowns);

const checkInterval = Number(root.dataset.idleCheckInterval) || 15;
setInterval(() => {
  if (root.dataset.status === "RUNNING") refresh();
}, checkInterval * 1000);

// As sessions_app.timeline.format_countdown: 4m 12s, 59s, 1h 0m 5s.
function formatCountdown(seconds) {
  let rest = Math.max(Math.floor(seconds), 0);
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (rest >= size || parts.length) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
  }
  parts.push(`${rest}s`);
  return parts.join(" ");
}

async function callApi(url, options = {}) {
  const response = await fetch(url, {
    credentials: "same-origin",
    ...options,
    headers: { Accept: "application/json", "X-CSRFToken": csrfToken(), ...options.headers },
  });
  let body = {};
  try {
    body = await response.json();
  } catch {
    body = { msg: `${response.status} ${response.statusText}` };
  }
  if (!response.ok) throw new Error(body.msg || body.detail || `${response.status} ${response.statusText}`);
  return body;
}

const form = document.getElementById("execute-form");
form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const error = document.getElementById("execute-error");
  const result = document.getElementById("execute-result");
  error.hidden = true;
  runButton.disabled = true;
  runButton.textContent = "Running…";
  try {
    const body = await callApi(form.dataset.url, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ command: form.elements.command.value }),
    });
    document.getElementById("execute-exit-code").textContent = body.exit_code;
    document.getElementById("execute-stdout").textContent = body.stdout || "";
    document.getElementById("execute-stderr").textContent = body.stderr || "";
    document.getElementById("execute-stderr").hidden = !body.stderr;
    result.hidden = false;
  } catch (failure) {
    error.textContent = `The command did not run: ${failure.message}`;
    error.hidden = false;
  } finally {
    runButton.textContent = "Run";
    setStatus(root.dataset.status);
  }
});

const logButton = document.getElementById("log-refresh");
logButton.addEventListener("click", async () => {
  const output = document.getElementById("log-output");
  logButton.disabled = true;
  try {
    const body = await callApi(logButton.dataset.url);
    output.textContent = body.logs || "(the log is empty)";
  } catch (failure) {
    output.textContent = `The log could not be read: ${failure.message}`;
  } finally {
    logButton.disabled = false;
  }
});
