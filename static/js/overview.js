// /sessions/overview/: counts follow session events; agents' slots are read again often.
import { EventStream, refresher } from "./live.js";

const refresh = refresher(["overview"], 500);  // #occupancy-data is inside: the charts follow
new EventStream({ query: "?events=session", onEvent: refresh });
setInterval(refresh, 10000);
