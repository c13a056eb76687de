// /sessions/overview/: the last day's occupancy of each scaling group (CPU slots used by
// RUNNING kernels, reserved by starting ones, free) and each agent's share in use, from
// the samples beat records every minute. The data is the page's own (#occupancy-data),
// re-read whenever overview.js refreshes the page.
import { COLORS, LineChart, formats, loadUPlot } from "./charts.js";

const box = document.getElementById("occupancy-charts");
const charts = new Map(); // figure name → LineChart
let uPlot = null;

function figure(name, title) {
  let element = box.querySelector(`figure[data-chart="${CSS.escape(name)}"]`);
  if (!element) {
    element = document.createElement("figure");
    element.className = "chart";
    element.dataset.chart = name;
    element.innerHTML = '<figcaption></figcaption><div class="plot" hidden></div>' +
      '<p class="no-data muted">No samples in the last day.</p>';
    element.querySelector("figcaption").textContent = title;
    box.append(element);
  }
  return element;
}

function draw() {
  const data = JSON.parse(document.getElementById("occupancy-data").textContent);
  const groups = Object.entries(data.groups).sort(([a], [b]) => a.localeCompare(b));
  const agents = Object.entries(data.agents).sort(([a], [b]) => a.localeCompare(b));
  document.getElementById("occupancy-empty").hidden = groups.length > 0;
  for (const [group, series] of groups) {
    const name = `group:${group}`;
    if (!charts.has(name)) {
      // Cumulative lines, filled: used, then used + reserved, then the whole capacity.
      charts.set(name, new LineChart(uPlot, figure(name, `Scaling group ${group} (CPU slots)`), {
        series: [{ label: "used", color: COLORS[0], fill: "rgba(37,99,235,0.25)" },
                 { label: "used + reserved", color: COLORS[4], fill: "rgba(234,88,12,0.12)" },
                 { label: "capacity (free above used + reserved)", color: COLORS[2] }],
      }));
    }
    const held = series.used.map((u, i) => u + series.reserved[i]);
    charts.get(name).setData([series.t, series.used, held, held.map((h, i) => h + series.free[i])]);
  }
  if (agents.length) {
    const key = `agents:${agents.map(([id]) => id).join(",")}`;
    if (!charts.has(key)) {
      for (const name of [...charts.keys()].filter((n) => n.startsWith("agents:"))) {
        charts.delete(name);
        box.querySelector(".agents-chart")?.remove();
      }
      const element = figure(key, "Agents (% of CPU slots held)");
      element.classList.add("agents-chart", "wide");
      charts.set(key, new LineChart(uPlot, element, {
        series: agents.map(([id], i) => ({ label: id, color: COLORS[i % COLORS.length] })),
        format: formats.percent,
      }));
    }
    charts.get(key).setData(uPlot.join(agents.map(([, s]) => [s.t, s.used])));
  }
}

document.addEventListener("fragments:refreshed", () => uPlot && draw());
loadUPlot().then((module) => {
  uPlot = module;
  draw();
});
