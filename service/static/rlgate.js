// Shared by the learner's and the inference server's pages: JSON fetching, number formatting, paged
// histories, and line charts against env steps (uPlot, vendored beside this file with its licence).
"use strict";

const rlgate = (() => {
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

  async function getJSON(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  function isNumber(x) {
    return typeof x === "number" && Number.isFinite(x);
  }

  // 1234.5 -> "1234.5", 0.000123 -> "1.23e-4", null -> "-".
  function num(x, digits = 1) {
    if (!isNumber(x)) return "-";
    if (x !== 0 && Math.abs(x) < 0.01) return x.toExponential(2);
    return x.toFixed(Number.isInteger(x) ? 0 : digits);
  }

  // Env steps on an axis: 950, 12.5k, 1.2M.
  function steps(x) {
    if (!isNumber(x)) return "-";
    if (Math.abs(x) >= 1e6) return `${+(x / 1e6).toFixed(2)}M`;
    if (Math.abs(x) >= 1e3) return `${+(x / 1e3).toFixed(2)}k`;
    return `${Math.round(x)}`;
  }

  function bytes(n) {
    if (!isNumber(n)) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function setText(id, value) {
    document.getElementById(id).textContent = value;
  }

  // The mean of the last `window` values at every index (the page's smoothed return).
  function trailingMean(values, window) {
    const out = [];
    let sum = 0;
    values.forEach((v, i) => {
      sum += v;
      if (i >= window) sum -= values[i - window];
      out.push(sum / Math.min(i + 1, window));
    });
    return out;
  }

  // Run `refresh` now and again `ms` after each run ends; a failure shows in #error and polling goes on.
  function poll(refresh, service, ms = 1000) {
    const run = async () => {
      try {
        await refresh();
        setText("error", "");
      } catch (error) {
        setText("error", `cannot reach the ${service}: ${error.message}`);
      }
      setTimeout(run, ms);
    };
    run();
  }

  // A server's paged history (/history/<series>): `pull(total)` fetches the rows it does not have yet.
  class Paged {
    constructor(path, keep = 100000) {
      this.path = path;
      this.keep = keep;
      this.next = 0;
      this.rows = [];
    }

    async pull(total) {
      for (let pages = 0; this.next < total && pages < 100; pages += 1) {
        const page = await getJSON(`${this.path}?start=${this.next}`);
        if (!page.rows.length) break;
        this.rows.push(...page.rows);
        this.next = page.next;
      }
      if (this.rows.length > this.keep) this.rows.splice(0, this.rows.length - this.keep);
      return this.rows;
    }
  }

  // A uPlot line chart in `element` with env steps on x. `series`: [{label, points?: true (dots, no line)}].
  // After each `set`, the element says what it shows: data-points (x values) and data-x-max.
  class Chart {
    constructor(element, title, series, yLabel = "") {
      this.element = element;
      const width = Math.max(element.clientWidth, 300);
      const options = {
        title,
        width,
        height: 220,
        scales: { x: { time: false } },
        legend: { live: false },
        axes: [
          { label: "env steps", values: (u, ticks) => ticks.map(steps) },
          { label: yLabel, size: 60 },
        ],
        series: [
          { label: "env steps" },
          ...series.map((s, i) => ({
            label: s.label,
            stroke: s.color || COLORS[i % COLORS.length],
            width: s.points ? 0 : 2,
            points: s.points ? { show: true, size: 5, fill: s.color || COLORS[i % COLORS.length] } : { show: false },
            paths: s.points ? () => null : undefined,
            spanGaps: true,
          })),
        ],
      };
      this.plot = new uPlot(options, [[], ...series.map(() => [])], element);
      this.set([], series.map(() => []));
    }

    set(xs, columns) {
      this.plot.setData([xs, ...columns]);
      this.element.dataset.points = xs.length;
      this.element.dataset.xMax = xs.length ? xs[xs.length - 1] : "";
    }
  }

  return { Chart, Paged, bytes, getJSON, num, poll, setText, steps, trailingMean };
})();
