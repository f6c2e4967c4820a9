// The lmforge playground: plain JS, no build step, nothing fetched but this server's own API.
"use strict";

const COLORS = ["#2f6fde", "#e4572e", "#17a398", "#8c54d0", "#f0a202", "#c2185b", "#5d6d7e", "#3c9d3c"];
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let MODELS = [];

async function api(path, body) {
  const res = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  const data = await res.json().catch(() => ({error: `HTTP ${res.status}`}));
  if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
  return data;
}

function status(id, text, kind) {
  const el = $(id);
  el.textContent = text;
  el.className = "status" + (kind === "error" ? " error" : "");
  el.dataset.state = kind || "";
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k === "style") node.style.cssText = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fillSelect(id, op) {
  const sel = $(id);
  sel.innerHTML = "";
  const names = MODELS.filter((m) => m.supports.includes(op)).map((m) => m.name);
  for (const n of names) sel.append(el("option", {value: n}, n));
  return names;
}

function colorOf(name) {
  const i = MODELS.findIndex((m) => m.name === name);
  return COLORS[(i < 0 ? 0 : i) % COLORS.length];
}

// -- a small line chart in SVG ----------------------------------------------------------------------------
function lineChart(series, opts) {
  // series: [{name, color, points: [[x, y]...], dashed}]; opts: {width, height, xLabel, yLabel, yMin, yMax, xTicks}
  const W = opts.width || 520, H = opts.height || 260, L = 48, R = 12, T = 12, B = 36;
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  let x0 = opts.xMin ?? Math.min(...xs), x1 = opts.xMax ?? Math.max(...xs);
  let y0 = opts.yMin ?? Math.min(...ys), y1 = opts.yMax ?? Math.max(...ys);
  if (!(x1 > x0)) { x1 = x0 + 1; }
  if (!(y1 > y0)) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= opts.yMin === undefined ? pad : 0; y1 += opts.yMax === undefined ? pad : 0;
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const root = svg("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img"});
  for (let k = 0; k <= 4; k++) {
    const y = y0 + (y1 - y0) * k / 4;
    root.append(svg("line", {x1: L, x2: W - R, y1: py(y), y2: py(y), stroke: "#e6e9ef"}));
    root.append(svg("text", {x: L - 6, y: py(y) + 4, "text-anchor": "end", "font-size": 10, fill: "#667085"},
      Math.abs(y1 - y0) < 5 ? y.toFixed(2) : y.toFixed(0)));
  }
  for (const [x, label] of opts.xTicks || [[x0, String(x0)], [x1, String(x1)]]) {
    root.append(svg("text", {x: px(x), y: H - B + 14, "text-anchor": "middle", "font-size": 10, fill: "#667085"},
      label));
  }
  root.append(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#98a2b3"}));
  root.append(svg("line", {x1: L, x2: L, y1: T, y2: H - B, stroke: "#98a2b3"}));
  if (opts.xLabel) root.append(svg("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle",
    "font-size": 11, fill: "#344054"}, opts.xLabel));
  if (opts.yLabel) root.append(svg("text", {x: 12, y: (T + H - B) / 2, "text-anchor": "middle", "font-size": 11,
    fill: "#344054", transform: `rotate(-90 12 ${(T + H - B) / 2})`}, opts.yLabel));
  for (const s of series) {
    if (!s.points.length) continue;
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ");
    root.append(svg("path", {d, fill: "none", stroke: s.color, "stroke-width": 2,
      "stroke-dasharray": s.dashed ? "6 4" : "none", "data-series": s.name}));
    if (s.markers !== false) {
      for (const p of s.points) {
        root.append(svg("circle", {cx: px(p[0]), cy: py(p[1]), r: 3, fill: s.color}));
      }
    }
  }
  return root;
}

function legend(series) {
  const box = el("div", {class: "legend"});
  for (const s of series) {
    box.append(el("span", {style: "margin-right:12px;font-size:12px"},
      el("span", {class: "swatch", style: `background:${s.color}`}), s.name));
  }
  return box;
}

// -- polysemy ---------------------------------------------------------------------------------------------
async function runPolysemy(ev) {
  if (ev) ev.preventDefault();
  const texts = [$("poly-a").value, $("poly-b").value], word = $("poly-word").value;
  const models = MODELS.filter((m) => m.kind === "model" && m.supports.includes("embed"));
  if (!models.length) { status("poly-status", "no model folder with a tokenizer is loaded"); return; }
  status("poly-status", "embedding...");
  try {
    const results = await Promise.all(models.map((m) => api("/v1/embed", {model: m.name, texts, word})));
    const series = [], table = el("table", {id: "poly-numbers"});
    table.append(el("tr", {}, el("th", {}, "model"), el("th", {}, "layer"), el("th", {}, "cosine")));
    for (const r of results) {
      const n = r.rows.length, color = colorOf(r.model);
      const points = r.rows.map((row, i) => [n === 1 ? 0 : i / (n - 1), row.pairs[0].cosine]);
      if (n === 1) points.push([1, r.rows[0].pairs[0].cosine]);
      series.push({name: `${r.model} (${n} layer${n > 1 ? "s" : ""})`, color, points, dashed: n === 1,
        markers: n > 1});
      r.rows.forEach((row) => {
        table.append(el("tr", {},
          el("td", {}, el("span", {class: "swatch", style: `background:${color}`}), r.model),
          el("td", {}, row.layer),
          el("td", {class: "num cos", "data-model": r.model, "data-layer": row.layer,
            "data-value": String(row.pairs[0].cosine)}, row.pairs[0].cosine.toFixed(4))));
      });
    }
    const chart = $("poly-chart");
    chart.innerHTML = "";
    const lo = Math.min(0, ...series.flatMap((s) => s.points.map((p) => p[1])));
    chart.append(lineChart(series, {yMin: lo, yMax: 1.0, xLabel: "layer depth (lowest to top)",
      yLabel: `cos("${word}")`, xTicks: [[0, "lowest"], [0.5, "middle"], [1, "top"]]}), legend(series));
    $("poly-table").innerHTML = "";
    $("poly-table").append(table);
    status("poly-status", `${results.length} model(s) compared`, "done");
  } catch (e) {
    status("poly-status", e.message, "error");
  }
}

function fillLayers() {
  const m = $("proj-model").value, sel = $("proj-layer");
  sel.innerHTML = "";
  const info = MODELS.find((x) => x.name === m);
  const names = (info && info.layer_names) || [];
  names.forEach((n, i) => sel.append(el("option", {value: i}, n)));
  sel.value = String(names.length - 1);
}

async function runProjection(ev) {
  if (ev) ev.preventDefault();
  const texts = $("proj-texts").value.split("\n").map((t) => t.trim()).filter(Boolean);
  const model = $("proj-model").value;
  if (!model) { status("proj-status", "no model to project with"); return; }
  status("proj-status", "projecting...");
  try {
    const layer = $("proj-layer").value === "" ? null : Number($("proj-layer").value);
    const r = await api("/v1/projection", {model, texts, word: $("poly-word").value, layer});
    const info = MODELS.find((x) => x.name === model);
    if (info && !info.layer_names) { info.layer_names = r.layer_names; fillLayers(); $("proj-layer").value = r.layer; }
    drawScatter(r);
    const ev = r.explained_variance_ratio.map((v) => (100 * v).toFixed(1) + "%").join(", ");
    status("proj-status", `${r.model}, layer ${r.layer_name}: explained variance ${ev}`, "done");
  } catch (e) {
    status("proj-status", e.message, "error");
  }
}

function drawScatter(r) {
  const W = 900, H = 280, M = 30, box = $("proj-chart");
  const xs = r.points.map((p) => p.x), ys = r.points.map((p) => p.y);
  const span = (a) => (Math.max(...a) - Math.min(...a)) || 1;
  const sx = (x) => M + (x - Math.min(...xs)) / span(xs) * (W / 2 - 2 * M);
  const sy = (y) => H - M - (y - Math.min(...ys)) / span(ys) * (H - 2 * M);
  const root = svg("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img"});
  root.append(svg("rect", {x: 1, y: 1, width: W / 2, height: H - 2, fill: "#fafbfc", stroke: "#e6e9ef"}));
  r.points.forEach((p, i) => {
    const c = COLORS[i % COLORS.length];
    root.append(svg("circle", {cx: sx(p.x), cy: sy(p.y), r: 6, fill: c, "fill-opacity": 0.85}));
    root.append(svg("text", {x: sx(p.x) + 9, y: sy(p.y) + 4, "font-size": 11, fill: "#1d2430"}, String(i + 1)));
    root.append(svg("text", {x: W / 2 + 16, y: 24 + i * 20, "font-size": 12, fill: c},
      `${i + 1}. ${p.text.length > 60 ? p.text.slice(0, 57) + "..." : p.text}`));
  });
  box.innerHTML = "";
  box.append(root);
}

// -- fill-mask --------------------------------------------------------------------------------------------
async function runFillMask(ev) {
  if (ev) ev.preventDefault();
  const out = $("fm-out");
  status("fm-status", "filling...");
  try {
    const r = await api("/v1/fill-mask", {model: $("fm-model").value, text: $("fm-text").value,
      top_k: Number($("fm-topk").value)});
    out.innerHTML = "";
    r.masks.forEach((cands, i) => {
      if (r.masks.length > 1) out.append(el("h3", {}, `[MASK] #${i + 1}`));
      const grid = el("div", {class: "cands"});
      for (const c of cands) {
        grid.append(el("span", {class: "token"}, c.token),
          el("div", {}, el("div", {class: "bar", style: `width:${Math.max(1, 100 * c.prob)}%`})),
          el("span", {class: "num prob"}, c.prob.toFixed(4)));
      }
      out.append(grid);
    });
    status("fm-status", "done", "done");
  } catch (e) {
    status("fm-status", e.message, "error");
  }
}

// -- generation, streamed ---------------------------------------------------------------------------------
let genAbort = null;

async function runGenerate(ev) {
  if (ev) ev.preventDefault();
  const num = (id) => ($(id).value === "" ? null : Number($(id).value));
  const body = {model: $("gen-model").value, prompt: $("gen-prompt").value, max_new_tokens: num("gen-max"),
    temperature: num("gen-temp") ?? 0, top_k: num("gen-topk"), top_p: num("gen-topp"), seed: num("gen-seed"),
    stream: true};
  $("gen-prompt-echo").textContent = body.prompt;
  $("gen-text").textContent = "";
  $("gen-run").disabled = true; $("gen-stop").disabled = false;
  status("gen-status", "generating...");
  genAbort = new AbortController();
  let pieces = 0;
  try {
    const res = await fetch("/v1/generate", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body), signal: genAbort.signal});
    if (!res.ok) {
      const data = await res.json().catch(() => ({}));
      throw new Error(data.error || `HTTP ${res.status}`);
    }
    const reader = res.body.getReader(), dec = new TextDecoder();
    let buf = "", finished = false;
    while (!finished) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        const msg = JSON.parse(data);
        if (event === "message") { $("gen-text").textContent += msg.text; pieces++; }
        else if (event === "done") { $("gen-text").textContent = msg.text; finished = true; }
        else if (event === "error") throw new Error(msg.error);
      }
    }
    status("gen-status", `done: ${pieces} streamed piece(s)`, "done");
  } catch (e) {
    status("gen-status", e.name === "AbortError" ? "stopped" : e.message, e.name === "AbortError" ? "" : "error");
  } finally {
    $("gen-run").disabled = false; $("gen-stop").disabled = true; genAbort = null;
  }
}

// -- predictions ------------------------------------------------------------------------------------------
function predFields() {
  const run = MODELS.find((m) => m.name === $("pred-model").value);
  const task = run ? run.task : "classify";
  const show = (id, on) => { $(id).style.display = on ? "" : "none"; };
  show("pred-pair-label", task === "pair" || task === "qa");
  show("pred-choices-label", task === "choice");
  const textLabel = {classify: "Text", pair: "First text", tokens: "Words (split on spaces)", qa: "Question",
    choice: "Context"}[task];
  $("pred-text-label").firstChild.textContent = textLabel + " ";
  $("pred-pair-label").firstChild.textContent = (task === "qa" ? "Context" : "Second text") + " ";
}

async function runPredict(ev) {
  if (ev) ev.preventDefault();
  const run = MODELS.find((m) => m.name === $("pred-model").value);
  if (!run) { status("pred-status", "no fine-tuned run is loaded"); return; }
  const body = {model: run.name, text: $("pred-text").value};
  if (run.task === "pair" || run.task === "qa") body.text_pair = $("pred-pair").value;
  if (run.task === "choice") body.choices = $("pred-choices").value.split("\n").map((t) => t.trim()).filter(Boolean);
  status("pred-status", "predicting...");
  try {
    const r = await api("/v1/predict", body), p = r.prediction, out = $("pred-out");
    out.innerHTML = "";
    if (p.probs) {
      const labels = Array.isArray(p.probs) ? body.choices : Object.keys(p.probs);
      const probs = Array.isArray(p.probs) ? p.probs : Object.values(p.probs);
      const shown = Array.isArray(p.probs) ? body.choices[p.label] : p.label;
      out.append(el("p", {}, "prediction: ", el("b", {id: "pred-label"}, shown)));
      const grid = el("div", {class: "cands"});
      labels.forEach((lab, i) => grid.append(el("span", {}, lab),
        el("div", {}, el("div", {class: "bar", style: `width:${Math.max(1, 100 * probs[i])}%`})),
        el("span", {class: "num prob", "data-label": lab}, probs[i].toFixed(4))));
      out.append(grid);
    } else if (p.tags) {
      const box = el("div", {class: "tags", id: "pred-label"});
      p.words.forEach((w, i) => box.append(el("span", {}, w, el("i", {}, p.tags[i]))));
      out.append(box);
    } else {
      out.append(el("p", {}, "answer: ", el("b", {id: "pred-label"}, p.answer || "(none)")));
    }
    status("pred-status", `${r.task} run ${r.model}`, "done");
  } catch (e) {
    status("pred-status", e.message, "error");
  }
}

// -- training curves --------------------------------------------------------------------------------------
const CURVES = {name: null, lines: 0, events: []};

async function pollCurves() {
  const name = $("curve-model").value;
  if (!name) return;
  if (name !== CURVES.name) Object.assign(CURVES, {name, lines: 0, events: []});
  try {
    const r = await api(`/v1/curves/${encodeURIComponent(name)}?after=${CURVES.lines}`);
    if (CURVES.name !== name) return;
    CURVES.lines = r.lines;
    CURVES.events.push(...r.events);
    drawCurves();
  } catch (e) {
    status("curve-status", e.message, "error");
  }
}

function drawCurves() {
  const ev = CURVES.events.filter((e) => typeof e.loss === "number" && isFinite(e.loss));
  const train = ev.filter((e) => e.split === "train").map((e) => [e.step, e.loss]);
  const val = ev.filter((e) => e.split === "val").map((e) => [e.step, e.loss]);
  const box = $("curve-chart");
  box.innerHTML = "";
  if (!train.length && !val.length) { status("curve-status", "no events yet", "done"); return; }
  const series = [{name: "train loss", color: COLORS[0], points: train, markers: false},
    {name: "val loss", color: COLORS[1], points: val}];
  const last = Math.max(...ev.map((e) => e.step));
  box.append(lineChart(series, {xLabel: "step", yLabel: "loss", xMin: 0,
    xTicks: [[0, "0"], [last / 2, String(Math.round(last / 2))], [last, String(last)]]}), legend(series));
  box.dataset.events = String(ev.length);
  box.dataset.lastStep = String(last);
  status("curve-status", `${ev.length} events, last step ${last}`, "done");
}

// -- start ------------------------------------------------------------------------------------------------
async function start() {
  try {
    MODELS = (await api("/v1/models")).data;
  } catch (e) {
    document.body.prepend(el("p", {class: "status error"}, `cannot reach the server: ${e.message}`));
    return;
  }
  const chips = $("loaded");
  for (const m of MODELS) {
    chips.append(el("span", {class: "chip", title: m.path}, el("b", {}, m.name),
      ` ${m.family || ""} ${m.kind === "run" ? m.task + " run" : m.kind === "training" ? "training" : ""}`.trimEnd()));
  }
  const sections = {fillmask: fillSelect("fm-model", "fill-mask"), generate: fillSelect("gen-model", "generate"),
    predict: fillSelect("pred-model", "predict"), curves: fillSelect("curve-model", "curves")};
  fillSelect("proj-model", "embed");
  const contextual = MODELS.find((m) => m.kind === "model" && m.supports.includes("embed") && m.contextual);
  if (contextual) $("proj-model").value = contextual.name;  // a static model has one point for every sentence
  for (const [id, names] of Object.entries(sections)) {
    if (!names.length) {
      const form = $(id).querySelector("form");
      form.style.display = "none";
      form.after(el("p", {class: "none"}, "none of the loaded folders offers this"));
    }
  }
  $("poly-form").addEventListener("submit", runPolysemy);
  $("proj-form").addEventListener("submit", runProjection);
  $("proj-model").addEventListener("change", () => { fillLayers(); runProjection(); });
  $("fm-form").addEventListener("submit", runFillMask);
  $("gen-form").addEventListener("submit", runGenerate);
  $("gen-stop").addEventListener("click", () => genAbort && genAbort.abort());
  $("pred-model").addEventListener("change", predFields);
  $("pred-form").addEventListener("submit", runPredict);
  $("curve-model").addEventListener("change", pollCurves);
  predFields();
  setInterval(() => { if ($("curve-live").checked) pollCurves(); }, 2000);
  document.body.dataset.ready = "1";
  await Promise.all([runPolysemy(), $("proj-model").value ? runProjection() : null, pollCurves()]);
  document.body.dataset.loaded = "1";
}

start();
