// /sessions/queue/: each scaling group's queue on a time axis, one row per session: a
// waiting session is a line from now to a diamond at its predicted start; a session holding
// slots is a bar from now to its latest end (to the edge, faded, when nothing bounds it).
// Your own sessions are drawn in stronger colours. The tables beside have the same numbers.
// The page re-reads itself on every session event (and every 10 s): the charts follow.
import { EventStream, refresher } from "./live.js";
import { loadUPlot } from "./charts.js";

const COLORS = { waiting: "#9333ea", waitingMine: "#dc2626", running: "#94a3b8",
                 runningMine: "#2563eb", now: "#656d76" };
const ROW_PX = 28;
let uPlot = null;

function rowsOf(group) {
  return [
    ...group.waiting.map((s) => ({ ...s, kind: "waiting", at: s.predicted_start })),
    ...group.running.map((s) => ({ ...s, kind: "running", at: s.end })),
  ];
}

function drawGroup(figure, group, now) {
  const rows = rowsOf(group);
  const plot = figure.querySelector(".plot");
  const drawable = rows.some((r) => r.kind === "running" || r.at != null);
  figure.dataset.state = drawable ? "drawn" : "empty";
  figure.dataset.points = String(drawable ? rows.length : 0);
  figure.querySelector(".no-data").hidden = drawable;
  plot.hidden = !drawable;
  if (!drawable) return;
  const times = rows.map((r) => r.at).filter((t) => t != null);
  const last = Math.max(now + 600, ...times);
  const end = last + (last - now) * 0.08;
  const label = (i) => {
    const row = rows[i];
    if (!row) return "";
    const name = row.name.length > 24 ? `${row.name.slice(0, 23)}…` : row.name;
    return row.kind === "waiting" ? `${row.position ?? "?"}. ${name}` : name;
  };
  const markers = {};
  const options = {
    width: Math.max(plot.clientWidth || figure.clientWidth || 800, 300),
    height: 60 + ROW_PX * rows.length,
    legend: { show: false },
    cursor: { show: false },
    scales: { x: { time: true, range: () => [now, end] },
              y: { range: () => [-0.5, rows.length - 0.5], dir: -1 } },
    axes: [{}, { size: 190, splits: () => rows.map((_, i) => i),
                 values: (u, splits) => splits.map(label) }],
    series: [{}, { show: false }],
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        const x = (t) => u.valToPos(t, "x", true);
        const height = u.valToPos(0, "y", true) - u.valToPos(1, "y", true);
        const unit = Math.abs(height);
        ctx.save();
        ctx.strokeStyle = COLORS.now;
        ctx.setLineDash([4, 4]);
        ctx.beginPath();
        ctx.moveTo(x(now), u.bbox.top);
        ctx.lineTo(x(now), u.bbox.top + u.bbox.height);
        ctx.stroke();
        ctx.setLineDash([]);
        rows.forEach((row, i) => {
          const y = u.valToPos(i, "y", true);
          if (row.kind === "running") {
            const bounded = row.at != null;
            ctx.globalAlpha = bounded ? 1 : 0.35;
            ctx.fillStyle = row.mine ? COLORS.runningMine : COLORS.running;
            const x1 = bounded ? x(row.at) : u.bbox.left + u.bbox.width;
            ctx.fillRect(x(now), y - unit * 0.3, Math.max(x1 - x(now), 2), unit * 0.6);
            ctx.globalAlpha = 1;
            if (bounded) markers[row.id] = [Math.round(x1 - 2), Math.round(y)];
          } else if (row.at != null) {
            const color = row.mine ? COLORS.waitingMine : COLORS.waiting;
            const x1 = x(row.at);
            const r = Math.max(unit * 0.3, 5);
            ctx.strokeStyle = color;
            ctx.lineWidth = 2 * devicePixelRatio;
            ctx.beginPath();
            ctx.moveTo(x(now), y);
            ctx.lineTo(x1, y);
            ctx.stroke();
            ctx.fillStyle = color;
            ctx.beginPath();
            ctx.moveTo(x1, y - r);
            ctx.lineTo(x1 + r, y);
            ctx.lineTo(x1, y + r);
            ctx.lineTo(x1 - r, y);
            ctx.closePath();
            ctx.fill();
            markers[row.id] = [Math.round(x1), Math.round(y)];
          }
        });
        ctx.restore();
        figure.dataset.markers = JSON.stringify(markers);
      }],
    },
  };
  plot.replaceChildren();
  figure.uplot = new uPlot(options, [[now, end], [null, null]], plot);
}

function drawAll() {
  const data = JSON.parse(document.getElementById("queue-data").textContent);
  for (const group of data.groups) {
    const figure = document.querySelector(`figure[data-chart="queue:${CSS.escape(group.name)}"]`);
    if (figure) drawGroup(figure, group, data.now);
  }
  document.getElementById("queue").dataset.drawnAt = String(Date.now());
}

const refresh = refresher(["queue"], 300);
new EventStream({ query: "?events=session", onEvent: refresh });
setInterval(refresh, 10000);
document.addEventListener("fragments:refreshed", () => uPlot && drawAll());
loadUPlot().then((module) => {
  uPlot = module;
  drawAll();
});
