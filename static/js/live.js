// Session events over /ws/events/, with catch-up after every (re)connect.
//
// The server replays the stored events since the last one this page saw (or since the
// page was rendered), so a network drop loses no status; repeats are dropped by id.

const RETRY_MS = [500, 1000, 2000, 5000, 10000];

export class EventStream {
  constructor({ query = "", since = document.body.dataset.renderedAt, onEvent, onState }) {
    this.query = query;
    this.since = since || new Date().toISOString();
    this.onEvent = onEvent;
    this.onState = onState || showConnection;
    this.seen = new Set();
    this.attempt = 0;
    this.connect();
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/events/${this.query}`);
    this.socket = socket;
    this.onState(this.attempt ? "reconnecting" : "connecting");
    socket.onopen = () => {
      this.attempt = 0;
      socket.send(JSON.stringify({ since: this.since }));
    };
    socket.onmessage = (message) => this.receive(JSON.parse(message.data));
    socket.onclose = () => {
      this.onState("offline");
      const delay = RETRY_MS[Math.min(this.attempt, RETRY_MS.length - 1)];
      this.attempt += 1;
      setTimeout(() => this.connect(), delay);
    };
  }

  receive(message) {
    if (message.event === "caught_up") {
      this.onState("live");
      return;
    }
    if (message.event === "resync") {
      location.reload();
      return;
    }
    if (message.event === "error" || message.event === "subscribed") {
      if (message.event === "error") console.warn("events:", message.reason);
      return;
    }
    if (message.id != null) {
      if (this.seen.has(message.id)) return;
      this.seen.add(message.id);
    }
    if (message.at && message.at > this.since) this.since = message.at;
    this.onEvent(message);
  }
}

function showConnection(state) {
  const badge = document.getElementById("connection");
  if (!badge) return;
  badge.hidden = false;
  badge.dataset.state = state;
  badge.textContent = state;
}

// Set every badge of this session to the message's status, unless it already shows a
// later one (replayed events can be older than what the page was rendered with).
export function applyStatus(message) {
  if (!message.event.startsWith("session_") || !message.status) return false;
  let changed = false;
  for (const badge of document.querySelectorAll(`[data-status-of="${message.session_id}"]`)) {
    if (badge.dataset.statusAt && Date.parse(badge.dataset.statusAt) > Date.parse(message.at)) {
      continue;
    }
    badge.dataset.statusAt = message.at;
    badge.textContent = message.status;
    badge.className = `badge status-${message.status}`;
    changed = true;
  }
  return changed;
}

// What an element shows, but for the CSRF tokens of its forms (Django masks the token anew
// in every response).
function rendered(element) {
  const copy = element.cloneNode(true);
  for (const token of copy.querySelectorAll('input[name="csrfmiddlewaretoken"]')) {
    token.removeAttribute("value");
  }
  return copy.outerHTML;
}

// A pointer pressed and not yet released: a part swapped meanwhile would take the element
// it was pressed on, and the release on its copy makes no click (a lost click on a link or
// a button). Released: after the click that follows in the same turn.
let pressed = 0;
document.addEventListener("pointerdown", () => { pressed += 1; }, true);
for (const name of ["pointerup", "pointercancel"]) {
  document.addEventListener(name, () => setTimeout(() => { pressed = Math.max(0, pressed - 1); }), true);
}
function released(longest = 2000) {  // a press held longer (or never released) waits no more
  const until = performance.now() + longest;
  return new Promise((resolve) => {
    const check = () => (pressed && performance.now() < until ? setTimeout(check, 50) : resolve());
    check();
  });
}

// Re-render parts of the page from the server: fetch this URL and swap the elements with
// the given ids. Calls in quick succession share one fetch. An element the server renders
// as it is stays, and no part is swapped while a pointer is pressed: a click during a
// refresh is not lost with the element it landed on.
export function refresher(ids, delay = 150) {
  let timer = null;
  let running = false;
  let again = false;
  async function run() {
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      // Marked as a refresh: the page reading itself is not the owner using the session.
      const response = await fetch(location.href, {
        headers: { Accept: "text/html", "X-Dashboard-Refresh": "1" },
      });
      if (response.ok) {
        const page = new DOMParser().parseFromString(await response.text(), "text/html");
        await released();
        for (const id of ids) {
          const fresh = page.getElementById(id);
          const current = document.getElementById(id);
          if (fresh && current && rendered(fresh) !== rendered(current)) {
            current.replaceWith(document.adoptNode(fresh));
          }
        }
        document.dispatchEvent(new CustomEvent("fragments:refreshed"));
      }
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  }
  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(run, delay);
  }
  return schedule;
}

// A form with data-confirm asks before it submits.
document.addEventListener("submit", (event) => {
  const question = event.target.dataset && event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

export function formatDuration(seconds) {
  seconds = Math.max(seconds, 0);
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  seconds = Math.floor(seconds);
  for (const [unit, size, sub, subSize] of [["d", 86400, "h", 3600], ["h", 3600, "min", 60],
                                            ["min", 60, "s", 1]]) {
    if (seconds >= size) {
      const rest = Math.floor((seconds % size) / subSize);
      return `${Math.floor(seconds / size)} ${unit}` + (rest ? ` ${rest} ${sub}` : "");
    }
  }
  return `${seconds} s`;
}

export function csrfToken() {
  const input = document.querySelector("input[name=csrfmiddlewaretoken]");
  return input ? input.value : "";
}
