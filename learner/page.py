"""The learner's live page: return and throughput over time, drawn from /status every two seconds."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>rlgate learner</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
  .stats { display: flex; gap: 2rem; margin-bottom: 1rem; }
  .stat b { display: block; font-size: 1.6rem; }
  canvas { border: 1px solid #ddd; margin: 0.5rem 0 1.5rem; }
</style>
</head>
<body>
<h1>rlgate learner</h1>
<div class="stats">
  <div class="stat">model version<b id="version">-</b></div>
  <div class="stat">env steps trained<b id="steps">-</b></div>
  <div class="stat">episodes<b id="episodes">-</b></div>
  <div class="stat">mean return (last 20)<b id="return">-</b></div>
</div>
<h2>Episode return</h2>
<canvas id="returns" width="900" height="260"></canvas>
<h2>Env steps per second</h2>
<canvas id="throughput" width="900" height="260"></canvas>
<script>
function plot(id, points, color) {
  const canvas = document.getElementById(id), ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 40;
  ctx.clearRect(0, 0, w, h);
  ctx.fillStyle = "#666"; ctx.font = "12px sans-serif";
  if (points.length < 2) { ctx.fillText("waiting for data", pad, h / 2); return; }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys) || 1;
  const X = x => pad + (x - x0) / (x1 - x0 || 1) * (w - 2 * pad);
  const Y = y => h - pad - (y - y0) / (y1 - y0 || 1) * (h - 2 * pad);
  ctx.fillText(y1.toFixed(0), 2, Y(y1) + 4); ctx.fillText(y0.toFixed(0), 2, Y(y0));
  ctx.fillText(x1.toFixed(0) + " s", w - pad - 20, h - 10);
  ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
  points.forEach((p, i) => i ? ctx.lineTo(X(p[0]), Y(p[1])) : ctx.moveTo(X(p[0]), Y(p[1])));
  ctx.stroke();
}
async function refresh() {
  const s = await (await fetch("status")).json();
  document.getElementById("version").textContent = s.model_version;
  document.getElementById("steps").textContent = Math.round(s.env_steps_trained);
  document.getElementById("episodes").textContent = s.episodes;
  document.getElementById("return").textContent = s.mean_return === null ? "-" : s.mean_return.toFixed(1);
  plot("returns", s.returns, "#1f77b4");
  const rate = s.throughput.slice(1).map((p, i) =>
    [p.t, (p.env_steps - s.throughput[i].env_steps) / Math.max(p.t - s.throughput[i].t, 1e-6)]);
  plot("throughput", rate, "#d62728");
  document.body.dataset.version = s.model_version;
}
refresh(); setInterval(refresh, 2000);
</script>
</body>
</html>
"""
