// /sessions/<id>/: each kernel's CPU, memory, network, disk and device use over the last
// hour. The series comes from /api/v1/sessions/<id>/stats/; then every heartbeat's samples
// arrive on the page's websocket (session.js re-dispatches them as "kernel:stat") and are
// drawn at once. The table beside has the latest numbers.
import { COLORS, LineChart, formats, loadUPlot } from "./charts.js";

const section = document.getElementById("usage");
const WINDOW_S = Number(section.dataset.minutes || 60) * 60;
const COUNTERS = [["net_rx", "rx"], ["net_tx", "tx"], ["blk_read", "read"], ["blk_write", "write"]];
const kernels = new Map(); // id → {hostname, t, cpu, mem, device, rx, tx, read, write, last}
let charts = null;
let uPlot = null;
let pending = []; // samples that came before the series

function kernelOf(id, hostname) {
  if (!kernels.has(id)) {
    kernels.set(id, { hostname: hostname || id.slice(0, 8), t: [], cpu: [], mem: [],
                      device: [], rx: [], tx: [], read: [], write: [], last: null });
  }
  return kernels.get(id);
}

// One sample; cumulative counters become rates against the kernel's previous sample.
function add(kernel, point) {
  if (kernel.last && point.t <= kernel.last.t) return false;
  const previous = kernel.last;
  const span = previous ? point.t - previous.t : 0;
  kernel.t.push(point.t);
  kernel.cpu.push(point.cpu);
  kernel.mem.push(point.mem);
  kernel.device.push(point.device);
  for (const [counter, name] of COUNTERS) {
    const before = previous && previous[counter];
    const rate = span > 0 && before != null && point[counter] != null && point[counter] >= before
      ? (point[counter] - before) / span : null;
    kernel[name].push(rate);
  }
  kernel.last = point;
  const cutoff = point.t - WINDOW_S;
  while (kernel.t.length && kernel.t[0] < cutoff) {
    for (const name of ["t", "cpu", "mem", "device", "rx", "tx", "read", "write"]) kernel[name].shift();
  }
  return true;
}

function columnsOf(points) {
  const rows = [];
  for (let i = 0; i < points.t.length; i += 1) {
    const row = {};
    for (const name of Object.keys(points)) row[name] = points[name][i];
    rows.push(row);
  }
  return rows;
}

function ensureCharts() {
  if (charts) return;
  const list = [...kernels.values()];
  const figure = (name) => section.querySelector(`figure[data-chart="${name}"]`);
  const per = (suffix = "") => list.map((k, i) => ({ label: `${k.hostname}${suffix}`,
                                                     color: COLORS[i % COLORS.length] }));
  const pairs = (a, b) => list.flatMap((k, i) => [
    { label: `${k.hostname} ${a}`, color: COLORS[(2 * i) % COLORS.length] },
    { label: `${k.hostname} ${b}`, color: COLORS[(2 * i + 1) % COLORS.length] }]);
  charts = {
    cpu: new LineChart(uPlot, figure("cpu"), { series: per(), format: formats.percent }),
    mem: new LineChart(uPlot, figure("mem"), { series: per(), format: formats.bytes }),
    net: new LineChart(uPlot, figure("net"), { series: pairs("rx", "tx"), format: formats.rate }),
    disk: new LineChart(uPlot, figure("disk"), { series: pairs("read", "write"),
                                                 format: formats.rate }),
    device: new LineChart(uPlot, figure("device"), { series: per(), format: formats.percent }),
  };
}

function draw() {
  ensureCharts();
  const list = [...kernels.values()];
  const joined = (names) => uPlot.join(list.map((k) => [k.t, ...names.map((n) => k[n])]));
  charts.cpu.setData(joined(["cpu"]));
  charts.mem.setData(joined(["mem"]));
  charts.net.setData(joined(["rx", "tx"]));
  charts.disk.setData(joined(["read", "write"]));
  charts.device.setData(joined(["device"]));
  updateTable();
}

function updateTable() {
  for (const [id, kernel] of kernels) {
    const row = document.getElementById(`usage-${id}`);
    if (!row || !kernel.t.length) continue;
    const last = kernel.t.length - 1;
    const cell = (name, text) => { row.querySelector(`[data-cell="${name}"]`).textContent = text; };
    cell("cpu", formats.percent(kernel.cpu[last]));
    cell("mem", formats.bytes(kernel.mem[last]));
    cell("net", `${formats.rate(kernel.rx[last])} / ${formats.rate(kernel.tx[last])}`);
    cell("disk", `${formats.rate(kernel.read[last])} / ${formats.rate(kernel.write[last])}`);
    cell("device", formats.percent(kernel.device[last]));
    cell("at", new Date(kernel.t[last] * 1000).toLocaleTimeString());
  }
}

document.addEventListener("kernel:stat", (event) => {
  if (!charts) {
    pending.push(...event.detail.points);
    return;
  }
  let changed = false;
  for (const point of event.detail.points) {
    if (kernels.has(point.kernel_id)) changed = add(kernels.get(point.kernel_id), point) || changed;
  }
  if (changed) {
    draw();
    // For the bench: when the agent sent what was just drawn, and when it was drawn.
    section.dataset.reportedAt = String(event.detail.reported_at);
    section.dataset.drawnAt = String(Date.now());
  }
});

async function start() {
  uPlot = await loadUPlot();
  let body;
  try {
    const response = await fetch(section.dataset.url, { headers: { Accept: "application/json" } });
    body = await response.json();
    if (!response.ok) throw new Error(body.msg || response.statusText);
  } catch (failure) {
    section.querySelector(".usage-error").textContent = `The series could not be read: ${failure.message}`;
    section.querySelector(".usage-error").hidden = false;
    body = { kernels: [] };
  }
  for (const entry of body.kernels) {
    const kernel = kernelOf(entry.id, entry.hostname);
    for (const point of columnsOf(entry.points)) add(kernel, point);
  }
  for (const row of section.querySelectorAll("tr[data-kernel-id]")) {
    kernelOf(row.dataset.kernelId, row.dataset.hostname);
  }
  ensureCharts();
  for (const point of pending) {
    if (kernels.has(point.kernel_id)) add(kernels.get(point.kernel_id), point);
  }
  pending = [];
  draw();
}

start();
