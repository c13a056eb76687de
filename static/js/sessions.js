// /sessions/: status badges change as events arrive; the table follows from the server.
import { EventStream, applyStatus, formatDuration, refresher } from "./live.js";

const table = document.getElementById("sessions");
const scope = table.dataset.scope;
const refresh = refresher(["session-rows", "tabs"]);

new EventStream({
  // A list needs no kernel_* events: fewer messages for the server to send to every page.
  query: scope === "all" ? "?events=session" : "?scope=mine&events=session",
  onEvent(message) {
    applyStatus(message);
    // New sessions, finished ones leaving the live tab, agents, reasons: re-rendered.
    if (message.event.startsWith("session_")) refresh();
  },
});

function tickAges() {
  for (const age of document.querySelectorAll("time.age")) {
    age.textContent = formatDuration((Date.now() - Date.parse(age.dateTime)) / 1000);
  }
}
tickAges();
setInterval(tickAges, 5000);
document.addEventListener("fragments:refreshed", tickAges);
