// The usage page's chart: each slot kind's hours per day (or month), stacked, drawn with
// uPlot from the numbers the page's table shows (#usage-data). Without it the table stands.
const section = document.getElementById("usage-chart");
const data = section && JSON.parse(document.getElementById("usage-data").textContent);
const COLOURS = ["#0969da", "#1a7f37", "#8250df", "#bc4c00", "#9a6700", "#cf222e", "#6e7781"];

function stacked(values) {
  // Each series is the sum of itself and those below it; drawn from the top down, so
  // each kind's bar shows its own share.
  const sums = [];
  values.forEach((series, i) => {
    sums.push(series.map((v, j) => v + (i ? sums[i - 1][j] : 0)));
  });
  return sums;
}

function draw() {
  // uPlot's minified build (51 KB; its ES module is not minified), loaded by the page.
  const uPlot = window.uPlot;
  if (!data || !data.keys.length || !uPlot) return;
  const xs = data.keys.map((key) => Date.parse(key.length === 7 ? `${key}-01` : key) / 1000);
  const tops = stacked(data.values);
  const bars = uPlot.paths.bars({ size: [0.7, 48] });
  // uPlot draws the series in order: the tallest (the whole stack) first.
  const order = data.labels.map((_, i) => i).reverse();
  const plot = new uPlot({
    width: Math.max(320, section.clientWidth - 40),
    height: 320,
    title: "Hours by slot kind (stacked)",
    scales: { x: { time: true } },
    axes: [{}, { label: "hours", size: 60 }],
    series: [
      { label: data.keys.length && data.keys[0].length === 7 ? "Month" : "Day" },
      ...order.map((i) => ({
        label: data.labels[i],
        stroke: COLOURS[i % COLOURS.length],
        fill: COLOURS[i % COLOURS.length] + "cc",
        paths: bars,
        points: { show: false },
        // The legend shows each kind's own hours, not the stack's height.
        value: (u, v, s, idx) => (idx == null ? "–" : data.values[i][idx].toFixed(3)),
      })),
    ],
  }, [xs, ...order.map((i) => tops[i])], section);
  section.dataset.drawn = "true";
  window.addEventListener("resize", () => plot.setSize({
    width: Math.max(320, section.clientWidth - 40), height: 320 }));
}

draw();
