// Heatmaps on a canvas: one cell per matrix entry, row and column labels, the value under the pointer.
// drawHeatmap(canvas, rows, options) leaves its geometry on canvas.dataset (x0, y0, cell) so that a test or a
// caller can find the cell of (row, column); options.onHover(r, c, value) is called as the pointer moves.
"use strict";

const SEQUENTIAL = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]]; // dark violet .. yellow
const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]]; // blue .. white .. red

function colour(stops, t) {
  // t in [0, 1] -> "rgb(...)": linear between the stops
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function showPiece(p) {
  // sentencepiece's word-start mark U+2581 is shown as "_", as the attention PNGs do
  return String(p).replace(/\u2581/g, "_");
}

function drawHeatmap(canvas, rows, options) {
  const o = Object.assign({ rowLabels: null, colLabels: null, cell: null, vmin: 0, vmax: null, diverging: false, maxSize: 560, font: 11 }, options || {});
  const nr = rows.length, nc = nr ? rows[0].length : 0;
  const ctx = canvas.getContext("2d");
  ctx.font = `${o.font}px ui-monospace, monospace`;
  const width = (labels) => (labels ? Math.max(0, ...labels.map((l) => ctx.measureText(showPiece(l)).width)) + 8 : 0);
  const x0 = Math.ceil(width(o.rowLabels)), y0 = Math.ceil(width(o.colLabels));
  const cell = o.cell || Math.max(3, Math.min(26, Math.floor(o.maxSize / Math.max(nr, nc, 1))));
  canvas.width = x0 + nc * cell + 2;
  canvas.height = y0 + nr * cell + 2;
  Object.assign(canvas.dataset, { x0, y0, cell, rows: nr, cols: nc });
  let vmax = o.vmax;
  if (vmax === null) vmax = Math.max(1e-6, ...rows.map((r) => Math.max(...r)));
  const vmin = o.vmin;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let r = 0; r < nr; r++) {
    for (let c = 0; c < nc; c++) {
      ctx.fillStyle = colour(o.diverging ? DIVERGING : SEQUENTIAL, (rows[r][c] - vmin) / (vmax - vmin));
      ctx.fillRect(x0 + c * cell, y0 + r * cell, cell, cell);
    }
  }
  ctx.font = `${o.font}px ui-monospace, monospace`;
  ctx.fillStyle = "#1d2330";
  ctx.textBaseline = "middle";
  if (o.rowLabels && cell >= 8) {
    ctx.textAlign = "right";
    o.rowLabels.forEach((l, r) => ctx.fillText(showPiece(l), x0 - 4, y0 + (r + 0.5) * cell));
  }
  if (o.colLabels && cell >= 8) {
    ctx.save();
    ctx.textAlign = "left";
    o.colLabels.forEach((l, c) => {
      ctx.save();
      ctx.translate(x0 + (c + 0.5) * cell, y0 - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(showPiece(l), 0, 0);
      ctx.restore();
    });
    ctx.restore();
  }
  canvas.onmousemove = (ev) => {
    const box = canvas.getBoundingClientRect();
    const sx = canvas.width / box.width, sy = canvas.height / box.height; // CSS may shrink the canvas
    const c = Math.floor(((ev.clientX - box.left) * sx - x0) / cell), r = Math.floor(((ev.clientY - box.top) * sy - y0) / cell);
    if (o.onHover && r >= 0 && r < nr && c >= 0 && c < nc) o.onHover(r, c, rows[r][c]);
  };
  return { x0, y0, cell, vmax };
}

function headMean(heads) {
  // heads: (H, Q, K) -> (Q, K), the mean over the heads (the "mean of heads" panel of tmt attention)
  return heads[0].map((row, q) => row.map((_, k) => heads.reduce((s, h) => s + h[q][k], 0) / heads.length));
}
