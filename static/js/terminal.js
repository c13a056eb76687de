// Terminals of a session page: xterm.js (from npm, served as static files) over the
// websocket /ws/sessions/<id>/terminals/<terminal id>/ (sessions_app/realtime/terminal.py).
// Several terminals, each in a tab; closing a tab ends its shell; a dropped connection is
// resumed (the same terminal id) while the shell lives.
const section = document.getElementById("terminals");
const encoder = new TextEncoder();
const REFUSED = new Set([4401, 4403, 4404, 4409]);  // no point trying again
const HELD_MAX = 64 * 1024;  // bytes typed while a dropped connection is resumed, kept for it
const terminals = [];
window.sessionTerminals = terminals;  // for the browser tests

function terminalId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The terminal's modules, fetched when the page loads; `open` waits for them.
async function setup() {
  const [{ Terminal }, { FitAddon }] = await Promise.all([
    import(section.dataset.xterm), import(section.dataset.fit)]);
  const tabs = document.getElementById("terminal-tabs");
  const panes = document.getElementById("terminal-panes");
  let opened = 0;

  function select(entry) {
    for (const other of terminals) {
      other.pane.hidden = other !== entry;
      other.tab.classList.toggle("active", other === entry);
      other.tab.setAttribute("aria-selected", String(other === entry));
    }
    entry.fit.fit();
    entry.term.focus();
  }

  function open() {
    opened += 1;
    const entry = { id: terminalId(), retries: 0, closed: false, exited: false, ws: null,
                    held: [], heldBytes: 0 };
    entry.tab = document.createElement("span");
    entry.tab.className = "terminal-tab";
    entry.tab.setAttribute("role", "tab");
    entry.tab.dataset.terminalId = entry.id;
    entry.tab.innerHTML = `<span class="terminal-label">Terminal ${opened}</span>` +
      `<span class="terminal-state"></span>` +
      `<button type="button" class="terminal-close" title="Close (ends the shell)">×</button>`;
    entry.pane = document.createElement("div");
    entry.pane.className = "terminal-pane";
    entry.pane.dataset.terminalId = entry.id;
    tabs.append(entry.tab);
    panes.append(entry.pane);
    entry.term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
    entry.fit = new FitAddon();
    entry.term.loadAddon(entry.fit);
    entry.term.open(entry.pane);
    terminals.push(entry);
    select(entry);
    entry.tab.addEventListener("click", (event) => {
      if (event.target.classList.contains("terminal-close")) close(entry);
      else select(entry);
    });
    entry.term.onData((data) => send(entry, encoder.encode(data)));
    entry.term.onResize(({ cols, rows }) => control(entry, { resize: [cols, rows] }));
    new ResizeObserver(() => { if (!entry.pane.hidden) entry.fit.fit(); }).observe(entry.pane);
    connect(entry);
    return entry;
  }

  function state(entry, text) {
    entry.tab.querySelector(".terminal-state").textContent = text ? `(${text})` : "";
    entry.tab.dataset.state = text || "connected";
  }

  function connect(entry) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = `cols=${entry.term.cols}&rows=${entry.term.rows}`;
    const ws = new WebSocket(`${scheme}://${location.host}/ws/sessions/` +
      `${section.dataset.sessionId}/terminals/${entry.id}/?${query}`);
    ws.binaryType = "arraybuffer";
    entry.ws = ws;
    state(entry, "connecting");
    ws.onopen = () => {
      state(entry, "");
      for (const bytes of entry.held) ws.send(bytes);  // typed while it was down
      entry.held = [];
      entry.heldBytes = 0;
    };
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") {
        entry.retries = 0;
        entry.term.write(new Uint8Array(event.data));
        return;
      }
      const message = JSON.parse(event.data);
      if (message.error) {
        entry.error = message;
        entry.term.write(`\r\n\x1b[31m${message.error}\x1b[0m\r\n`);
      }
      if (message.exited) {
        entry.exited = true;
        entry.term.write("\r\n\x1b[33m[the shell exited]\x1b[0m\r\n");
      }
    };
    ws.onclose = (event) => {
      if (entry.ws !== ws || entry.closed) return;
      if (entry.exited) { state(entry, "exited"); return; }
      if (REFUSED.has(event.code) || entry.retries >= 8) {
        state(entry, entry.error ? `error ${entry.error.status}` : "disconnected");
        return;
      }
      // A drop: the shell lives on at the agent for a while; connect again to resume it.
      const wait = Math.min(250 * 2 ** entry.retries, 4000);
      entry.retries += 1;
      state(entry, "reconnecting");
      setTimeout(() => { if (!entry.closed) connect(entry); }, wait);
    };
  }

  function send(entry, bytes) {
    if (entry.ws && entry.ws.readyState === WebSocket.OPEN) {
      entry.ws.send(bytes);
    } else if (!entry.closed && !entry.exited) {
      // Not connected (yet, or again): kept for the connection's open, so that keys typed
      // during a drop reach the resumed shell, in order.
      entry.held.push(bytes);
      entry.heldBytes += bytes.length;
      while (entry.heldBytes > HELD_MAX && entry.held.length) {
        entry.heldBytes -= entry.held.shift().length;
      }
    }
  }

  function control(entry, message) {
    if (entry.ws && entry.ws.readyState === WebSocket.OPEN) entry.ws.send(JSON.stringify(message));
  }

  function close(entry) {
    entry.closed = true;
    control(entry, { close: true });
    if (entry.ws) entry.ws.close();
    entry.term.dispose();
    entry.tab.remove();
    entry.pane.remove();
    terminals.splice(terminals.indexOf(entry), 1);
    if (terminals.length) select(terminals[terminals.length - 1]);
  }

  // Leaving the page ends its shells (a reload is a new page, with new terminals).
  window.addEventListener("pagehide", () => {
    for (const entry of terminals) { entry.closed = true; control(entry, { close: true }); }
  });
  return open;
}

if (section) {
  // The button works from the start: a click before the modules have arrived (the page's
  // load event does not wait for a dynamic import) opens its terminal once they have.
  const button = document.getElementById("terminal-new");
  const ready = setup();
  ready.catch((error) => {
    button.disabled = true;
    button.title = `The terminal could not load: ${error}`;
  });
  button.addEventListener("click", () => { ready.then((open) => open(), () => {}); });
}
