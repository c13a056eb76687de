// The dashboard's charts, drawn with uPlot (npm `uplot`, served from static/vendor/uplot).
//
// Each chart is a <figure class="chart"> with a <div class="plot"> and a <p class="no-data">:
// a chart without points says so instead of drawing empty axes. The figure's data-state
// ("empty" or "drawn") and data-points (how many times are drawn) let tests and the bench
// see what is on the canvas; data-last-t and data-drawn-at the newest point's time and when
// it was drawn (epoch ms).

let loading = null;

export function loadUPlot() {
  if (!loading) {
    const root = document.querySelector("[data-uplot]");
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = root.dataset.uplotCss;
    document.head.append(link);
    loading = import(root.dataset.uplot).then((module) => module.default);
  }
  return loading;
}

export const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
                       "#ca8a04", "#db2777"];

export function formatBytes(value) {
  if (value == null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = Math.abs(value);
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit += 1;
  }
  return `${(Math.sign(value) * n).toFixed(n < 10 && n % 1 ? 1 : 0)} ${units[unit]}`;
}

export const formats = {
  percent: (v) => (v == null ? "—" : `${Number(v).toFixed(1)} %`),
  bytes: formatBytes,
  rate: (v) => (v == null ? "—" : `${formatBytes(v)}/s`),
  number: (v) => (v == null ? "—" : String(Math.round(v * 100) / 100)),
};

// A line chart in `figure`: `series` [{label, color, fill}], `data` [times (s), ...columns].
export class LineChart {
  constructor(uPlot, figure, { series, format = formats.number, height = 180, min = 0 }) {
    this.uPlot = uPlot;
    this.figure = figure;
    this.plot = figure.querySelector(".plot");
    this.empty = figure.querySelector(".no-data");
    this.format = format;
    const width = () => Math.max(this.plot.clientWidth || figure.clientWidth || 600, 200);
    this.width = width;
    this.options = {
      width: width(),
      height,
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      scales: { y: { range: (u, lo, hi) => [Math.min(min, lo), Math.max(hi, min + 1) * 1.05] } },
      axes: [{}, { values: (u, ticks) => ticks.map(format), size: 70 }],
      series: [{}, ...series.map((s, i) => ({
        label: s.label,
        stroke: s.color || COLORS[i % COLORS.length],
        fill: s.fill,
        width: 1.5,
        spanGaps: true,
        value: (u, v) => format(v),
      }))],
    };
    this.chart = null;
    new ResizeObserver(() => this.chart && this.chart.setSize({ width: width(), height }))
      .observe(figure);
  }

  setData(data) {
    const points = data[0].length;
    const anything = points && data.slice(1).some((column) => column.some((v) => v != null));
    this.figure.dataset.state = anything ? "drawn" : "empty";
    this.figure.dataset.points = anything ? String(points) : "0";
    this.empty.hidden = Boolean(anything);
    this.plot.hidden = !anything;
    if (!anything) return;
    if (!this.chart) {
      this.chart = new this.uPlot({ ...this.options, width: this.width() }, data, this.plot);
    } else {
      this.chart.setData(data);
    }
    this.figure.dataset.lastT = String(data[0][points - 1]);
    this.figure.dataset.drawnAt = String(Date.now());
  }
}
