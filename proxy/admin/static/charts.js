"use strict";
// Line charts on a plain canvas (the admin page works offline: no library, no CDN).
// A line is {color, values, dash}: one value per bucket, oldest first, null where nothing
// finished; a gap breaks the line, and every point gets a dot so a lone bucket still shows.

const PALETTE = ["#58a6ff", "#3fb950", "#d29922", "#f85149", "#bc8cff", "#39c5cf", "#ff9bce", "#e6edf3"];

function drawChart(canvas, lines, bucketS, digits) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  const left = 44, right = 6, top = 6, bottom = 18;
  const values = lines.flatMap((l) => l.values.filter((v) => v !== null));
  const max = values.length ? Math.max(...values) * 1.1 || 1 : 1;
  const n = lines.length ? lines[0].values.length : 90;
  const x = (i) => left + (i / Math.max(1, n - 1)) * (w - left - right);
  const y = (v) => top + (1 - v / max) * (h - top - bottom);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8b98a5";
  ctx.strokeStyle = "#263040";
  ctx.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    ctx.beginPath(); ctx.moveTo(left, y(max * f)); ctx.lineTo(w - right, y(max * f)); ctx.stroke();
    ctx.fillText((max * f).toFixed(digits), 2, y(max * f) + 4);
  }
  const span = (n * bucketS) / 60;
  for (const f of [0, 1 / 3, 2 / 3, 1]) {
    const label = f === 1 ? "now" : `-${Math.round(span * (1 - f))} min`;
    ctx.fillText(label, Math.min(x((n - 1) * f), w - right - 24), h - 4);
  }
  let points = 0;
  for (const line of lines) {
    ctx.strokeStyle = ctx.fillStyle = line.color;
    ctx.lineWidth = 1.6;
    ctx.setLineDash(line.dash ? [4, 3] : []);
    ctx.beginPath();
    let open = false;
    line.values.forEach((v, i) => {
      if (v === null) { open = false; return; }
      if (open) ctx.lineTo(x(i), y(v)); else ctx.moveTo(x(i), y(v));
      open = true;
    });
    ctx.stroke();
    ctx.setLineDash([]);
    line.values.forEach((v, i) => {
      if (v === null) return;
      ctx.beginPath(); ctx.arc(x(i), y(v), 1.8, 0, 2 * Math.PI); ctx.fill();
      points += 1;
    });
  }
  canvas.dataset.points = String(points);  // what the browser test reads
}

// One figure per metric in `box` (canvas[data-metric]); `named` is [[label, series], ...].
function drawCharts(box, named, bucketS) {
  const colored = named.map(([label, series], i) => [label, series, PALETTE[i % PALETTE.length]]);
  for (const canvas of box.querySelectorAll("canvas")) {
    const metric = canvas.dataset.metric;
    const lines = metric === "ttft"
      ? colored.flatMap(([, s, color]) => [
        { color, values: s.ttft_p50_ms }, { color, values: s.ttft_p95_ms, dash: true }])
      : colored.map(([, s, color]) => ({ color, values: s[metric] }));
    drawChart(canvas, lines, bucketS, metric === "tps" ? 1 : 0);
  }
  box.querySelector(".legend").innerHTML = colored.length
    ? colored.map(([label, , color]) => `<span><i style="background:${color}"></i>${label}</span>`).join("")
    : "nothing finished in the last 15 minutes";
}
